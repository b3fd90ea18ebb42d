"""The Ray backend against a real local Ray cluster: node inventory, runner actors, node death."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpulease.backends.base import RunnerSpec
from gpulease.backends.fleet import Fleet, FleetNode
from gpulease.core.catalog import default_pricing_text, load_catalog
from gpulease.core.templates import get_template
from ray_support import RayCluster, worker_resources

pytest.importorskip("ray", reason="Ray is not installed: pip install 'gpulease[ray]'")

from gpulease.backends.ray import RayBackend, node_inventory, node_name  # noqa: E402


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("catalog") / "pricing.yaml"
    path.write_text(default_pricing_text())
    return load_catalog(path)


@pytest.fixture(scope="module")
def backend(ray_cluster: RayCluster) -> Iterator[RayBackend]:
    import ray

    yield RayBackend(ray_cluster.address, ray_cluster.node_home)
    ray.shutdown()


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def by_name(backend: RayBackend, catalog) -> dict[str, FleetNode]:  # type: ignore[no-untyped-def]
    return {n.name: n for n in backend.nodes(catalog)}


def spec_for(instance_id: int, node: str, tmp_path: Path, gpus: int = 1) -> RunnerSpec:
    """A spec as the launcher writes it, paths on the server; the server is not there (the
    runner keeps trying to reach it, which is all these tests need)."""
    return RunnerSpec(
        instance_id=instance_id,
        server_url="http://127.0.0.1:1",
        token="tok",
        workspace=tmp_path / "server" / "workspaces" / f"i{instance_id}",
        run_dir=tmp_path / "server" / "runners" / str(instance_id),
        env_cache=tmp_path / "server" / "envs",
        template=get_template("python"),
        gpu_uuids=tuple(f"ray:{node}:{i}" for i in range(gpus)),
        node=node,
    )


def test_inventory_from_resources(catalog) -> None:  # type: ignore[no-untyped-def]
    inventory = node_inventory(worker_resources("gpu-x", gpus=2), "gpu-x", catalog)
    assert inventory is not None
    assert inventory.driver_version == "550.54.15"
    assert inventory.cuda_version == "12.4"
    assert [(g.index, g.uuid, g.model, g.simulated) for g in inventory.gpus] == [
        (0, "ray:gpu-x:0", "A100-80GB", True),
        (1, "ray:gpu-x:1", "A100-80GB", True),
    ]
    assert inventory.gpus[0].memory_mb == 80 * 1024


def test_inventory_of_other_nodes(catalog) -> None:  # type: ignore[no-untyped-def]
    # a head without gpulease resources is not offered
    assert node_inventory({"CPU": 4.0, "node:127.0.0.1": 1.0}, "head", catalog) is None
    # a CPU-only node is offered, without GPUs
    cpu = node_inventory({"CPU": 4.0, "gpulease/cpu": 1.0}, "cpu-1", catalog)
    assert cpu is not None and cpu.gpus == []
    # a model the catalog lacks is listed but not offered (no catalog model)
    odd = node_inventory({"gpulease/Z9000": 1.0}, "odd", catalog)
    assert odd is not None and [(g.nvml_name, g.model) for g in odd.gpus] == [("Z9000", None)]
    assert node_name({"NodeID": "abcdef0123456789ff", "Resources": {}}) == "ray-abcdef012345"


def test_nodes_come_from_the_cluster(backend: RayBackend, ray_cluster: RayCluster, catalog) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(backend, Fleet)
    nodes = by_name(backend, catalog)
    assert {"gpu-a", "gpu-b"} <= set(nodes)
    assert all(not n.startswith("ray-") for n in nodes)  # the head is not offered
    a = nodes["gpu-a"]
    assert a.alive and a.cpu_count == 1
    assert [g.model for g in a.inventory.gpus] == ["A100-80GB", "A100-80GB"]


def test_node_join_and_leave(backend: RayBackend, ray_cluster: RayCluster, catalog) -> None:  # type: ignore[no-untyped-def]
    ray_cluster.add_worker("gpu-c", gpus=1, model="T4")
    assert wait_until(lambda: by_name(backend, catalog).get("gpu-c") is not None, 10)
    c = by_name(backend, catalog)["gpu-c"]
    assert c.alive and [g.model for g in c.inventory.gpus] == ["T4"]
    ray_cluster.kill_worker("gpu-c")
    assert wait_until(lambda: not by_name(backend, catalog)["gpu-c"].alive, 20)


def test_a_real_gpu_node_is_read_through_nvml_on_the_node(
    backend: RayBackend,
    ray_cluster: RayCluster,
    catalog,  # type: ignore[no-untyped-def]
) -> None:
    # Not simulated: a task pinned to the node reads its GPUs through NVML before it is
    # offered. This host has no NVIDIA driver, so NVML finds none and the node's resources
    # are what it offers (not simulated).
    ray_cluster.add_worker("gpu-r", gpus=1, model="T4", simulated=False)
    try:
        assert wait_until(lambda: "gpu-r" in by_name(backend, catalog), 20)
        r = by_name(backend, catalog)["gpu-r"]
        assert [(g.model, g.simulated, g.uuid) for g in r.inventory.gpus] == [
            ("T4", False, "ray:gpu-r:0")
        ]
    finally:
        ray_cluster.kill_worker("gpu-r")


def test_runner_actor_on_the_chosen_node(
    backend: RayBackend,
    ray_cluster: RayCluster,
    catalog,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    import ray

    backend.nodes(catalog)  # the backend learns node ids from its view of the cluster
    spec = spec_for(41, "gpu-b", tmp_path, gpus=2)
    handle = backend.start(spec)
    try:
        assert backend.alive(handle)
        node_home = ray_cluster.node_home / "gpu-b"
        # the runner's files are on the node, under its home; nothing on the server's disk
        assert wait_until(lambda: (node_home / "runners" / "41" / "spec.json").exists(), 20)
        assert (node_home / "workspaces" / "i41").is_dir()
        assert not spec.run_dir.exists()
        written = RunnerSpec.from_json((node_home / "runners" / "41" / "spec.json").read_text())
        assert written.workspace == node_home / "workspaces" / "i41"
        actor = next(
            a
            for a in ray._private.state.actors().values()
            if a["Name"].startswith("gpulease-runner-41-")
        )
        gpu_b_id = next(n["NodeID"] for n in ray.nodes() if "gpulease/name:gpu-b" in n["Resources"])
        assert actor["Address"]["NodeID"] == gpu_b_id
    finally:
        started = time.monotonic()
        backend.stop(handle, force=True)
        assert time.monotonic() - started < 1.0  # stop() is fast: it waits for nothing
    assert wait_until(lambda: (backend.nodes(catalog), not backend.alive(handle))[1], 20)
    backend.stop(handle, force=True)  # idempotent for a gone runner
    backend.stop(handle)
    assert not backend.alive("not a handle")


def test_start_on_a_node_not_in_the_cluster(backend: RayBackend, catalog, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from gpulease.core.errors import Unavailable

    backend.nodes(catalog)
    with pytest.raises(Unavailable, match="node nowhere is not in the Ray cluster"):
        backend.start(spec_for(42, "nowhere", tmp_path))


def test_a_cluster_that_does_not_answer_never_holds_up_the_caller(
    backend: RayBackend,
    catalog,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    import threading

    import gpulease.backends.ray as ray_backend
    from gpulease.core.errors import Unavailable

    answer = threading.Event()
    real = ray_backend._read_cluster

    def hung():  # type: ignore[no-untyped-def]
        answer.wait(10)  # Ray's calls block like this while the head is gone
        return real()

    monkeypatch.setattr(ray_backend, "_read_cluster", hung)
    monkeypatch.setattr(ray_backend, "CALL_TIMEOUT_S", 0.3)
    started = time.monotonic()
    with pytest.raises(Unavailable, match="did not answer within"):
        backend.nodes(catalog)
    with pytest.raises(Unavailable, match="an earlier call still waits"):
        backend.nodes(catalog)  # refused at once while the first still hangs
    backend.stop('{"actor": "gpulease-runner-0-000000", "actor_id": "00"}')  # still fast
    assert time.monotonic() - started < 2
    answer.set()
    assert wait_until(lambda: _answers(backend, catalog), 10)


def _answers(backend: RayBackend, catalog) -> bool:  # type: ignore[no-untyped-def]
    from gpulease.core.errors import Unavailable

    try:
        return "gpu-a" in by_name(backend, catalog)
    except Unavailable:
        return False
