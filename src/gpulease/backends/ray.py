"""The Ray backend: a Ray cluster's nodes are the fleet, each runner a detached actor on its node.

A node tells what it offers through custom resources given to `ray start --resources`
(docs/ray.md):

    gpulease/<MODEL>: N          N GPUs of the catalog model MODEL ("gpulease/A100-80GB": 2)
    gpulease/cpu: 1              a node that offers CPU-only instances and no GPUs
    gpulease/name:<NAME>: 1      the node's name in gpulease (default ray-<first 12 of its id>)
    gpulease/driver:<VERSION>: 1 the NVIDIA driver version, gpulease/cuda:<X.Y>: 1 its CUDA
    gpulease/simulated: 1        its GPUs are simulated (development and tests)

A node with none of these resources (a head without GPUs, say) is not offered.

The runner is the same `python -m gpulease.runner` as on the local backend, started by the
actor on the actor's node (through LocalBackend there, so stop and force-kill behave
alike), with its files under the node's own home: nothing assumes the server's disk.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from gpulease.backends.base import RunnerSpec
from gpulease.backends.fleet import FleetNode
from gpulease.core.catalog import Catalog
from gpulease.core.errors import Unavailable
from gpulease.gpus.discovery import DiscoveredGpu, Inventory

log = logging.getLogger(__name__)

PREFIX = "gpulease/"
NAME_PREFIX = "gpulease/name:"
DRIVER_PREFIX = "gpulease/driver:"
CUDA_PREFIX = "gpulease/cuda:"
SIMULATED = "gpulease/simulated"
CPU_ONLY = "gpulease/cpu"
# A started actor not yet in the cluster's actor table counts as alive for this long.
PENDING_S = 30.0
# alive() outside the reconciler loop refreshes a view older than this.
STALE_S = 5.0
FORCE_KILL_AFTER_S = 5.0
CALL_TIMEOUT_S = 10.0
HEAD_OUTAGE_S = 7 * 24 * 3600
# A node's job fabric (docs/ray.md), in the environment of its `ray start`: the NIC whose
# macvlans carry its ranks' traffic, and the named network namespace it lives in (none: the
# host's own).
FABRIC_PARENT_ENV = "GPULEASE_FABRIC_PARENT"
FABRIC_NETNS_ENV = "GPULEASE_FABRIC_NETNS"
T = TypeVar("T")


def node_name(node: dict[str, Any]) -> str:
    """A node's gpulease name: its gpulease/name:<NAME> resource, else ray-<id prefix>."""
    for key in node.get("Resources", {}):
        if key.startswith(NAME_PREFIX) and len(key) > len(NAME_PREFIX):
            return str(key[len(NAME_PREFIX) :])
    return f"ray-{str(node['NodeID'])[:12]}"


def _tagged(resources: dict[str, Any], prefix: str) -> str | None:
    for key in resources:
        if key.startswith(prefix) and len(key) > len(prefix):
            return str(key[len(prefix) :])
    return None


def node_inventory(resources: dict[str, Any], name: str, catalog: Catalog) -> Inventory | None:
    """A node's GPUs from its gpulease/<MODEL> resources, or None for a node that does not
    offer anything to gpulease. GPU uuids are ray:<node name>:<index>, stable across the
    node's restarts."""
    offered = any(
        key.startswith(PREFIX) and not key.startswith((NAME_PREFIX, DRIVER_PREFIX, CUDA_PREFIX))
        for key in resources
    )
    if not offered:
        return None
    simulated = SIMULATED in resources
    gpus: list[DiscoveredGpu] = []
    for key in sorted(resources):
        label = key[len(PREFIX) :]
        if not key.startswith(PREFIX) or ":" in label or key in (SIMULATED, CPU_ONLY):
            continue
        model = next((m for m in catalog.models if m.name.lower() == label.lower()), None)
        if model is None or not model.is_gpu:
            log.warning("node %s offers %s, a model the catalog does not have", name, label)
        for _ in range(int(resources[key])):
            index = len(gpus)
            gpus.append(
                DiscoveredGpu(
                    index=index,
                    uuid=f"ray:{name}:{index}",
                    nvml_name=label,
                    model=model.name if model is not None and model.is_gpu else None,
                    memory_mb=int(model.memory_gb * 1024) if model is not None else 0,
                    simulated=simulated,
                )
            )
    return Inventory(
        driver_version=_tagged(resources, DRIVER_PREFIX),
        cuda_version=_tagged(resources, CUDA_PREFIX),
        gpus=gpus,
    )


def _handle(name: str, actor_id: str) -> str:
    return json.dumps({"actor": name, "actor_id": actor_id})


def _parse_handle(handle: str) -> tuple[str, str] | None:
    try:
        data = json.loads(handle)
        return str(data["actor"]), str(data["actor_id"])
    except (ValueError, KeyError, TypeError):
        log.error("not a Ray backend handle: %r", handle)
        return None


PENDING = object()


@ray.remote(num_cpus=0)
def _discover_on_node(catalog: Catalog) -> Inventory:
    """Runs on one node: its GPUs through NVML, as the local backend reads its host's."""
    from gpulease.gpus.discovery import discover

    return discover(catalog)


@ray.remote(num_cpus=0)
def _delete_on_node(paths: list[str]) -> None:
    """Runs on one node: deletes a released instance's workspace and runner files there.
    shutil.rmtree never follows the links a job left in its workspace."""
    import shutil

    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def with_node_fabric(spec: RunnerSpec, environ: Mapping[str, str]) -> RunnerSpec:
    """spec with this node's fabric parent (FABRIC_PARENT_ENV, FABRIC_NETNS_ENV of environ)
    on its fabric link; a spec without one as it is."""
    if spec.fabric is None:
        return spec
    fabric = replace(
        spec.fabric,
        parent=environ.get(FABRIC_PARENT_ENV) or None,
        parent_netns=environ.get(FABRIC_NETNS_ENV) or None,
    )
    return replace(spec, fabric=fabric)


class RunnerActor:
    """Hosts one runner process on its node and lives exactly as long as that runner.

    Threaded (max_concurrency=2): watch() blocks until the runner exits and then ends the
    actor, while stop() can still reach it.
    """

    def __init__(self, spec_json: str) -> None:
        from gpulease.backends.local import LocalBackend

        spec = with_node_fabric(RunnerSpec.from_json(spec_json), os.environ)
        for path in (spec.workspace, spec.env_cache):
            path.mkdir(parents=True, exist_ok=True)
        self._local = LocalBackend()
        self._runner = self._local.start(spec)

    def watch(self) -> None:
        while self._local.alive(self._runner):
            time.sleep(0.5)
        ray.actor.exit_actor()  # type: ignore[no-untyped-call]

    def stop(self, force: bool) -> None:
        self._local.stop(self._runner, force=force)


@dataclass
class _View:
    """What the cluster looked like at one moment: node ids alive, actor states by id."""

    at: float
    alive_nodes: set[str]
    actors: dict[str, tuple[str, str]]  # actor id -> (state, node id)


class RayBackend:
    """Runners as detached actors of a Ray cluster, each pinned to the node the scheduler
    chose (NodeAffinitySchedulingStrategy, soft=False) and holding its GPUs (num_gpus).

    The handle is {"actor", "actor_id"}: the name finds the actor again after a server
    restart (detached actors outlive the driver), the id tells it from a later one.
    """

    name = "ray"
    same_host = False

    def __init__(
        self,
        address: str,
        node_home: Path,
        *,
        namespace: str = "gpulease",
        shared_env_cache: Path | None = None,
    ) -> None:
        """node_home: the directory under which each node keeps its files (one folder per
        node name). shared_env_cache: a template environment cache that every node mounts
        at the same path (NFS, say); None: each node builds its own under its home."""
        self._namespace = namespace
        self._node_home = node_home
        self._shared_env_cache = shared_env_cache
        self._lock = threading.Lock()
        self._view: _View | None = None
        self._node_ids: dict[str, str] = {}  # gpulease node name -> Ray node id, alive ones
        self._seen: dict[str, FleetNode] = {}  # Ray node id -> the node as last seen
        self._probes: dict[str, Any] = {}  # Ray node id -> its NVML task's ObjectRef
        self._probed: dict[str, Inventory | None] = {}  # Ray node id -> what NVML found
        self._started: dict[str, float] = {}  # actor id -> monotonic start time
        # Ray calls run on threads of their own, so that a hung one never holds up a caller
        self._calls = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpulease-ray")
        self._stops = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpulease-ray-stop")
        self._pending: concurrent.futures.Future[object] | None = None
        if not ray.is_initialized():
            _check_reachable(address)  # ray.init would retry an unreachable one for minutes
            # A Ray driver whose head stays unreachable for gcs_rpc_server_reconnect_timeout_s
            # (60 s by default) ends its own process; the server must outlive a head outage.
            os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(HEAD_OUTAGE_S))
            try:
                ray.init(
                    address=address,
                    namespace=namespace,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                    configure_logging=False,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise Unavailable(
                    f"cannot connect to the Ray cluster at {address}: {exc}; start its head "
                    "with `ray start --head` or fix GPULEASE_RAY_ADDRESS"
                ) from exc

    # -- the fleet ------------------------------------------------------------------------

    def nodes(self, catalog: Catalog) -> list[FleetNode]:
        raw = self._refresh()
        found: dict[str, FleetNode] = {}
        ids: dict[str, str] = {}
        for node in sorted(raw, key=lambda n: bool(n.get("Alive"))):  # the living win
            node_id = str(node["NodeID"])
            alive = bool(node.get("Alive"))
            resources = node.get("Resources") or {}
            if not alive and not resources:  # Ray forgets a dead node's resources
                with self._lock:
                    seen = self._seen.get(node_id)
                if seen is not None:
                    found[seen.name] = replace(seen, alive=False)
                continue
            name = node_name(node)
            inventory = node_inventory(resources, name, catalog)
            if inventory is None:
                continue
            if alive and SIMULATED not in resources:
                probed = self._probe(node_id, name, catalog)
                if probed is PENDING:
                    continue  # offered once its GPUs are known, a moment after it joined
                if isinstance(probed, Inventory) and probed.gpus:
                    inventory = probed
            ids[name] = node_id
            found[name] = FleetNode(
                name=name,
                hostname=str(node.get("NodeManagerAddress") or node.get("NodeManagerHostname")),
                cpu_count=int(resources.get("CPU", 0)),
                memory_mb=int(resources.get("memory", 0)) // (1024 * 1024),
                inventory=inventory,
                alive=alive,
            )
            with self._lock:
                self._seen[node_id] = found[name]
        with self._lock:
            self._node_ids = {name: ids[name] for name, n in found.items() if n.alive}
        return list(found.values())

    def _probe(self, node_id: str, name: str, catalog: Catalog) -> Inventory | object | None:
        """The node's GPUs as NVML sees them there (real UUIDs, indices, driver), read once by
        a task pinned to it: PENDING until it answers, None when NVML found no GPU (the
        node's resources are then all there is)."""
        with self._lock:
            if node_id in self._probed:
                return self._probed[node_id]
            ref = self._probes.get(node_id)
        if ref is None:
            ref = self._bounded(
                lambda: _discover_on_node.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
                ).remote(catalog)
            )
            with self._lock:
                self._probes[node_id] = ref
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            return PENDING
        result: Inventory | None
        try:
            result = ray.get(ref, timeout=CALL_TIMEOUT_S)
        except Exception:  # the task failed: the node's resources are all there is
            log.warning("could not read the GPUs of node %s through NVML", name, exc_info=True)
            result = None
        if result is not None and not result.gpus:
            result = None
        if result is None:
            log.info("node %s: no GPU through NVML; its gpulease/ resources tell its GPUs", name)
        with self._lock:
            self._probed[node_id] = result
            self._probes.pop(node_id, None)
        return result

    # -- runners --------------------------------------------------------------------------

    def node_spec(self, spec: RunnerSpec, node: str) -> RunnerSpec:
        """spec with its paths moved under the node's home: <node home>/<node name>/."""
        home = self._node_home / node
        return replace(
            spec,
            workspace=home / "workspaces" / spec.workspace.name,
            run_dir=home / "runners" / spec.run_dir.name,
            env_cache=self._shared_env_cache or home / "envs",
            dataset_cache=home / "datasets",
        )

    def start(self, spec: RunnerSpec) -> str:
        node = spec.node
        if not node:
            raise Unavailable(f"instance {spec.instance_id} has no node to start on")
        with self._lock:
            node_id = self._node_ids.get(node)
        if node_id is None:
            raise Unavailable(f"node {node} is not in the Ray cluster now")
        name = f"gpulease-runner-{spec.instance_id}-{secrets.token_hex(3)}"
        node_spec = self.node_spec(spec, node).to_json()

        def create() -> str:
            remote: Any = ray.remote(RunnerActor)
            actor: Any = remote.options(
                name=name,
                namespace=self._namespace,
                lifetime="detached",
                num_cpus=0,
                num_gpus=len(spec.gpu_uuids),
                max_concurrency=2,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(node_spec)
            actor.watch.remote()
            return str(actor._actor_id.hex())

        actor_id = self._bounded(create)
        with self._lock:
            self._started[actor_id] = time.monotonic()
        log.info("started runner actor %s on node %s for instance %d", name, node, spec.instance_id)
        return _handle(name, actor_id)

    def alive(self, handle: str) -> bool:
        parsed = _parse_handle(handle)
        if parsed is None:
            return False
        _name, actor_id = parsed
        with self._lock:
            view = self._view
        if view is None or time.monotonic() - view.at > STALE_S:
            try:
                self._refresh()
            except Unavailable:
                log.warning("the Ray cluster does not answer; runners count as alive")
            with self._lock:
                view = self._view
        if view is None:
            return True  # nothing known yet: never fail a runner for want of an answer
        state = view.actors.get(actor_id)
        if state is None:
            with self._lock:
                started = self._started.get(actor_id)
            return started is not None and time.monotonic() - started < PENDING_S
        status, node_id = state
        if status == "DEAD":
            return False
        return status != "ALIVE" or node_id in view.alive_nodes

    def _bounded(self, call: Callable[[], T]) -> T:
        """call() on the Ray thread, for at most CALL_TIMEOUT_S. Ray's calls to a head that
        is gone block for minutes; the reconciler loop must not. While one such call still
        hangs, the next ones are refused at once."""
        with self._lock:
            if self._pending is not None and not self._pending.done():
                raise Unavailable("the Ray cluster does not answer (an earlier call still waits)")
            future = self._calls.submit(call)
            self._pending = future  # type: ignore[assignment]
        try:
            return future.result(timeout=CALL_TIMEOUT_S)
        except concurrent.futures.TimeoutError as exc:
            raise Unavailable(
                f"the Ray cluster did not answer within {CALL_TIMEOUT_S:.0f} s"
            ) from exc

    def _refresh(self) -> list[dict[str, Any]]:
        """Read the cluster's nodes and its whole actor table (two GCS calls) into the view."""
        raw, actors = self._bounded(_read_cluster)
        view = _View(
            at=time.monotonic(),
            alive_nodes={str(n["NodeID"]) for n in raw if n.get("Alive")},
            actors={
                str(i): (str(a.get("State")), str((a.get("Address") or {}).get("NodeID")))
                for i, a in actors.items()
            },
        )
        with self._lock:
            self._view = view
        return raw

    def delete_workspace(self, node: str, name: str) -> None:
        """A task pinned to node deletes <node home>/<node>/workspaces/<name> and its runner
        files; nothing when the node is not in the cluster now."""
        with self._lock:
            node_id = self._node_ids.get(node)
        if node_id is None:
            log.info("workspace %s stays on node %s: the node is not in the cluster", name, node)
            return
        home = self._node_home / node
        paths = [str(home / "workspaces" / name), str(home / "runners" / name)]
        self._stops.submit(
            lambda: _delete_on_node.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
            ).remote(paths)
        )

    def stop(self, handle: str, *, force: bool = False) -> None:
        """Ask the actor to stop its runner (SIGTERM, or with force kill its whole tree) and,
        with force, kill the actor itself a moment later should it not have ended."""
        parsed = _parse_handle(handle)
        if parsed is None:
            return
        name, actor_id = parsed
        self._stops.submit(self._stop, name, actor_id, force)

    def _stop(self, name: str, actor_id: str, force: bool) -> None:
        try:
            actor = ray.get_actor(name, namespace=self._namespace)
        except ValueError:
            return  # gone already
        if actor._actor_id.hex() != actor_id:
            return  # a later actor took the name
        actor.stop.remote(force)
        if force:
            timer = threading.Timer(FORCE_KILL_AFTER_S, _kill, (actor,))
            timer.daemon = True
            timer.start()


def _read_cluster() -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    actors: dict[str, dict[str, Any]] = ray._private.state.actors()
    return nodes, actors


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as exc:
        raise Unavailable(
            f"cannot reach the Ray cluster at {address}: {exc}; start its head with "
            "`ray start --head` or set GPULEASE_RAY_ADDRESS to the head's HOST:PORT"
        ) from exc


def _kill(actor: Any) -> None:
    if not ray.is_initialized():
        return  # disconnected meanwhile; ray.kill would start a Ray of its own here
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # gone meanwhile; nothing left to kill
        log.debug("actor already gone", exc_info=True)
