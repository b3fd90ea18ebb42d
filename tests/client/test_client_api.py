"""The SDK against the real server app in process: every endpoint, typed answers, refusals."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from inprocess import ADMIN_NAME, InProcessServer, password_of, tar_members

from gpulease.client import (
    ApiError,
    EndEvent,
    GpuleaseClient,
    LogEvent,
    ServerUnreachable,
    StatusEvent,
)


def test_register_login_me_and_refusals(server: InProcessServer) -> None:
    cara = server.user("cara")  # registers
    assert cara.token is not None and cara.token.startswith("glp_")
    assert cara.me().name == "cara"

    again = server.client().login("cara", password_of("cara"))
    assert again.user.name == "cara" and again.token != cara.token

    with pytest.raises(ApiError) as taken:
        server.client().register("cara", "another-password")
    assert taken.value.status == 409

    with pytest.raises(ApiError) as refused:
        server.client().login("cara", "wrong password")
    assert refused.value.status == 401
    assert refused.value.message  # the server's words, not a status line

    with pytest.raises(ApiError) as anonymous:
        server.client().me()
    assert anonymous.value.status == 401
    assert "gpulease login --server URL" in anonymous.value.message


def test_tokens_create_list_revoke(server: InProcessServer) -> None:
    ann = server.user()
    created = ann.create_token("laptop")
    assert created.token.startswith(created.info.prefix)
    assert "laptop" in [t.name for t in ann.list_tokens()]

    laptop = server.client(created.token)
    assert laptop.me().name == "ann"
    ann.revoke_token(created.info.id)
    with pytest.raises(ApiError, match="revoked") as refused:
        laptop.me()
    assert refused.value.status == 401
    with pytest.raises(ApiError) as missing:
        ann.revoke_token(9999)
    assert missing.value.status == 404


def test_catalog_templates_and_admin_only_nodes(server: InProcessServer) -> None:
    ann = server.user()
    gpus = {g.name: g for g in ann.gpus()}
    assert (gpus["A100-80GB"].free, gpus["A100-80GB"].total, gpus["A100-80GB"].simulated) == (
        2,
        2,
        2,
    )
    assert gpus["T4"].hourly.startswith("$")
    assert "pytorch" in [t.name for t in ann.templates()]

    with pytest.raises(ApiError, match="admin") as refused:
        ann.nodes()
    assert refused.value.status == 403
    (node,) = server.admin().nodes()
    assert node.name == "test-node" and len(node.gpus) == 3


def test_instance_lifecycle_by_id_and_name(server: InProcessServer) -> None:
    ann = server.user()
    created = ann.create_instance("T4:1", "pytorch", name="box")
    assert (created.status, created.queue_position, created.gpu_model) == ("queued", 1, "T4")
    assert ann.get_instance("box").id == created.id
    assert ann.get_instance(created.id).name == "box"
    assert [i.name for i in ann.list_instances()] == ["box"]

    assert ann.stop_instance("box").status == "stopped"
    assert ann.start_instance(created.id).status == "queued"
    assert ann.release_instance("box").status == "released"
    assert ann.list_instances() == []
    assert [i.status for i in ann.list_instances(include_released=True)] == ["released"]


def test_instance_refusals_carry_the_server_message(server: InProcessServer) -> None:
    ann = server.user()
    with pytest.raises(ApiError) as unknown_gpu:
        ann.create_instance("H100:8")
    assert 400 <= unknown_gpu.value.status < 500
    with pytest.raises(ApiError, match="not a valid instance name") as bad_name:
        ann.create_instance("T4:1", name="Bad Name")
    assert bad_name.value.status == 422
    with pytest.raises(ApiError, match="no instance") as missing:
        ann.get_instance("nope")
    assert missing.value.status == 404
    with pytest.raises(ApiError, match="unknown template 'no-such-template'"):
        ann.create_instance("T4:1", "no-such-template")
    with pytest.raises(ApiError, match="does not fit on any node") as too_big:
        ann.create_instance("A100-80GB:3")
    assert too_big.value.status == 409


def test_other_users_instances_are_not_found(server: InProcessServer) -> None:
    ann = server.user("ann")
    bob = server.user("bob")
    ann.create_instance("T4:1", name="mine")
    with pytest.raises(ApiError) as refused:
        bob.get_instance("mine")
    assert refused.value.status == 404


def test_workdir_upload_reaches_the_runner(server: InProcessServer, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "train.py").write_text("print('hi')\n")
    (work / "data" / "labels.csv").write_text("a,b\n")
    (work / ".git").mkdir()
    (work / ".git" / "HEAD").write_text("ref: main\n")

    ann = server.user()
    instance = ann.create_instance("T4:1", name="box")
    sent = ann.upload_workdir("box", work)
    assert sent > 0
    run = ann.create_run(instance.id, "python train.py")

    server.cluster.start()
    server.cluster.wait_for(lambda: ann.get_run(run.id).status == "succeeded")
    members = tar_members(server.cluster.workdirs[instance.id] or b"")
    assert members["train.py"] == b"print('hi')\n"
    assert members["data/labels.csv"] == b"a,b\n"
    assert not any(name.startswith(".git") for name in members)


def test_upload_to_an_unknown_instance_is_refused(server: InProcessServer, tmp_path: Path) -> None:
    ann = server.user()
    with pytest.raises(ApiError) as refused:
        ann.upload_workdir("nope", tmp_path)
    assert refused.value.status == 404


def test_runs_logs_pages_and_follow(server: InProcessServer) -> None:
    ann = server.user()
    instance = ann.create_instance("T4:1", name="box")
    server.cluster.job = lambda run: (
        [("stdout", "epoch 1 loss=0.5\n"), ("stderr", "warning: slow\n"), ("stdout", "done\n")],
        3,
    )
    run = ann.create_run("box", "python train.py", {"LR": "0.1"})
    assert (run.status, run.instance_id) == ("pending", instance.id)
    server.cluster.start()

    events = list(ann.follow_logs(run.id))
    logs = [e.chunk for e in events if isinstance(e, LogEvent)]
    assert [(c.seq, c.stream, c.data) for c in logs] == [
        (0, "stdout", "epoch 1 loss=0.5\n"),
        (1, "stderr", "warning: slow\n"),
        (2, "stdout", "done\n"),
    ]
    statuses = [e.run.status for e in events if isinstance(e, StatusEvent)]
    assert statuses[-1] == "failed" and len(statuses) == len(set(statuses))
    assert events[-1] == EndEvent(status="failed", exit_code=3)
    assert server.cluster.runs[0]["env"] == {"LR": "0.1"}

    page = ann.read_logs(run.id, after=0, limit=1)
    assert [c.seq for c in page.chunks] == [1] and page.next_after == 1
    assert ann.read_logs(run.id, after=2).chunks == []
    # following a finished run from the middle replays only what is after
    tail = list(ann.follow_logs(run.id, after=1))
    assert [e.chunk.seq for e in tail if isinstance(e, LogEvent)] == [2]

    assert [r.id for r in ann.list_runs(instance_id=instance.id)] == [run.id]
    assert ann.list_runs(instance_id=instance.id + 100) == []
    shown = ann.get_run(run.id)
    assert (shown.status, shown.exit_code) == ("failed", 3)
    assert any("run" in n.message for n in ann.notifications())
    with pytest.raises(ApiError) as missing:
        list(ann.follow_logs(9999))
    assert missing.value.status == 404


def test_run_on_a_stopped_instance_is_refused(server: InProcessServer) -> None:
    ann = server.user()
    ann.create_instance("T4:1", name="box")
    ann.stop_instance("box")
    with pytest.raises(ApiError, match="start it first") as refused:
        ann.create_run("box", "true")
    assert refused.value.status == 409


def test_balance_usage_and_admin_grants(server: InProcessServer) -> None:
    ann = server.user("ann")
    admin = server.admin()
    before = ann.balance()
    assert before.balance_micro == 10_000_000 and before.balance.startswith("$")

    line = admin.admin_grant("ann", "25.00", memo="welcome")
    assert line.amount_micro == 25_000_000
    assert ann.balance().balance_micro == 35_000_000
    admin.admin_grant("ann", Decimal("0.5"))
    usage = ann.usage()
    assert [entry.amount_micro for entry in usage.ledger] == [500_000, 25_000_000, 10_000_000]
    assert usage.ledger[1].memo == "welcome (by admin)"
    assert {u.name for u in admin.admin_users()} == {ADMIN_NAME, "ann", "bob"}

    with pytest.raises(ApiError) as not_admin:
        ann.admin_grant("ann", "1000")
    assert not_admin.value.status == 403
    with pytest.raises(ApiError, match="amount") as bad_amount:
        admin.admin_grant("ann", "lots")
    assert bad_amount.value.status == 422
    with pytest.raises(ApiError) as unknown_user:
        admin.admin_grant("nobody", "1.00")
    assert unknown_user.value.status == 404
    with pytest.raises(TypeError):
        admin.admin_grant("ann", 1.5)  # type: ignore[arg-type]


def test_usage_segments_after_an_instance_ran(server: InProcessServer) -> None:
    ann = server.user()
    ann.create_instance("T4:1", name="box")
    server.cluster.start()
    server.cluster.wait_for(lambda: ann.get_instance("box").status == "running")
    ann.stop_instance("box")
    server.cluster.wait_for(lambda: ann.get_instance("box").status == "stopped")
    (segment,) = ann.usage().segments
    assert (segment.gpu_model, segment.gpu_count) == ("T4", 1)
    assert segment.ended_at is not None


def test_unreachable_server_names_the_url() -> None:
    client = GpuleaseClient("http://127.0.0.1:9", timeout=5)
    with client, pytest.raises(ServerUnreachable) as failed:
        client.gpus()
    assert "http://127.0.0.1:9" in failed.value.message
    assert "cannot reach" in failed.value.message
