"""The SDK against the real server app in process: every endpoint, typed answers, refusals."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from inprocess import ADMIN_NAME, InProcessServer, password_of, tar_members
from pydantic import ValidationError

from gpulease.client import (
    ApiError,
    EndEvent,
    GpuleaseClient,
    LogEvent,
    ServerUnreachable,
    StatusEvent,
    position,
)
from gpulease.schemas.accounts import LoginRequest, RegisterRequest, TokenCreate
from gpulease.schemas.instances import InstanceCreate
from gpulease.schemas.ledger import GrantCreate
from gpulease.schemas.runs import RunCreate


def test_register_login_me_and_refusals(server: InProcessServer) -> None:
    cara = server.user("cara")  # registers
    assert cara.token is not None and cara.token.startswith("glp_")
    assert cara.auth.me().name == "cara"

    again = server.client().auth.login(LoginRequest(name="cara", password=password_of("cara")))
    assert again.user.name == "cara" and again.token != cara.token

    with pytest.raises(ApiError) as taken:
        server.client().auth.register(RegisterRequest(name="cara", password="another-password"))
    assert taken.value.status == 409

    with pytest.raises(ApiError) as refused:
        server.client().auth.login(LoginRequest(name="cara", password="wrong password"))
    assert refused.value.status == 401
    assert refused.value.message  # the server's words, not a status line

    with pytest.raises(ApiError) as anonymous:
        server.client().auth.me()
    assert anonymous.value.status == 401
    assert "gpulease login --server URL" in anonymous.value.message


def test_tokens_create_list_revoke(server: InProcessServer) -> None:
    ann = server.user()
    created = ann.tokens.create(TokenCreate(name="laptop"))
    assert created.token.startswith(created.info.prefix)
    assert "laptop" in [t.name for t in ann.tokens.list()]

    laptop = server.client(created.token)
    assert laptop.auth.me().name == "ann"
    ann.tokens.revoke(created.info.id)
    with pytest.raises(ApiError, match="revoked") as refused:
        laptop.auth.me()
    assert refused.value.status == 401
    with pytest.raises(ApiError) as missing:
        ann.tokens.revoke(9999)
    assert missing.value.status == 404


def test_catalog_templates_and_admin_only_nodes(server: InProcessServer) -> None:
    ann = server.user()
    gpus = {g.name: g for g in ann.catalog.gpus()}
    assert (gpus["A100-80GB"].free, gpus["A100-80GB"].total, gpus["A100-80GB"].simulated) == (
        2,
        2,
        2,
    )
    assert gpus["T4"].hourly.startswith("$")
    assert "pytorch" in [t.name for t in ann.templates.list()]

    with pytest.raises(ApiError, match="admin") as refused:
        ann.catalog.nodes()
    assert refused.value.status == 403
    (node,) = server.admin().catalog.nodes()
    assert node.name == "test-node" and len(node.gpus) == 3


def test_instance_lifecycle_by_id_and_name(server: InProcessServer) -> None:
    ann = server.user()
    created = ann.instances.create(InstanceCreate(gpu="T4:1", template="pytorch", name="box"))
    assert (created.status, created.queue_position, created.gpu_model) == ("queued", 1, "T4")
    assert ann.instances.get("box").id == created.id
    assert ann.instances.get(created.id).name == "box"
    assert [i.name for i in ann.instances.list()] == ["box"]

    assert ann.instances.stop("box").status == "stopped"
    assert ann.instances.start(created.id).status == "queued"
    assert ann.instances.release("box").status == "released"
    assert ann.instances.list() == []
    assert [i.status for i in ann.instances.list(include_released=True)] == ["released"]


def test_instance_refusals_carry_the_server_message(server: InProcessServer) -> None:
    ann = server.user()
    with pytest.raises(ApiError) as unknown_gpu:
        ann.instances.create(InstanceCreate(gpu="H100:8"))
    assert 400 <= unknown_gpu.value.status < 500
    with pytest.raises(ApiError, match="not a valid instance name") as bad_name:
        ann.instances.create(InstanceCreate(gpu="T4:1", name="Bad Name"))
    assert bad_name.value.status == 422
    with pytest.raises(ApiError, match="no instance") as missing:
        ann.instances.get("nope")
    assert missing.value.status == 404
    with pytest.raises(ApiError, match="unknown template 'no-such-template'"):
        ann.instances.create(InstanceCreate(gpu="T4:1", template="no-such-template"))
    with pytest.raises(ApiError, match="does not fit on any node") as too_big:
        ann.instances.create(InstanceCreate(gpu="A100-80GB:3"))
    assert too_big.value.status == 409


def test_other_users_instances_are_not_found(server: InProcessServer) -> None:
    ann = server.user("ann")
    bob = server.user("bob")
    ann.instances.create(InstanceCreate(gpu="T4:1", name="mine"))
    with pytest.raises(ApiError) as refused:
        bob.instances.get("mine")
    assert refused.value.status == 404


def test_workdir_upload_reaches_the_runner(server: InProcessServer, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "train.py").write_text("print('hi')\n")
    (work / "data" / "labels.csv").write_text("a,b\n")
    (work / ".git").mkdir()
    (work / ".git" / "HEAD").write_text("ref: main\n")

    ann = server.user()
    instance = ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    sent = ann.instances.upload_workdir("box", work)
    assert sent > 0
    run = ann.runs.create(instance.id, RunCreate(command="python train.py"))

    server.cluster.start()
    server.cluster.wait_for(lambda: ann.runs.get(run.id).status == "succeeded")
    members = tar_members(server.cluster.workdirs[instance.id] or b"")
    assert members["train.py"] == b"print('hi')\n"
    assert members["data/labels.csv"] == b"a,b\n"
    assert not any(name.startswith(".git") for name in members)


def test_upload_to_an_unknown_instance_is_refused(server: InProcessServer, tmp_path: Path) -> None:
    ann = server.user()
    with pytest.raises(ApiError) as refused:
        ann.instances.upload_workdir("nope", tmp_path)
    assert refused.value.status == 404


def test_runs_logs_pages_and_follow(server: InProcessServer) -> None:
    ann = server.user()
    instance = ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    server.cluster.job = lambda run: (
        [("stdout", "epoch 1 loss=0.5\n"), ("stderr", "warning: slow\n"), ("stdout", "done\n")],
        3,
    )
    run = ann.runs.create("box", RunCreate(command="python train.py", env={"LR": "0.1"}))
    assert (run.status, run.instance_id) == ("pending", instance.id)
    server.cluster.start()

    events = list(ann.runs.stream(run.id, metrics=False))
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

    page = ann.runs.logs(run.id, after=0, limit=1)
    assert [c.seq for c in page.chunks] == [1] and page.next_after == 1
    assert ann.runs.logs(run.id, after=2).chunks == []
    # following a finished run from the middle replays only what is after
    tail = list(ann.runs.stream(run.id, position(1), metrics=False))
    assert [e.chunk.seq for e in tail if isinstance(e, LogEvent)] == [2]

    assert [r.id for r in ann.runs.list(instance_id=instance.id)] == [run.id]
    assert ann.runs.list(instance_id=instance.id + 100) == []
    shown = ann.runs.get(run.id)
    assert (shown.status, shown.exit_code) == ("failed", 3)
    assert any("run" in n.message for n in ann.notifications.list())
    with pytest.raises(ApiError) as missing:
        list(ann.runs.stream(9999, metrics=False))
    assert missing.value.status == 404


def test_run_on_a_stopped_instance_is_refused(server: InProcessServer) -> None:
    ann = server.user()
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    ann.instances.stop("box")
    with pytest.raises(ApiError, match="start it first") as refused:
        ann.runs.create("box", RunCreate(command="true"))
    assert refused.value.status == 409


def test_balance_usage_and_admin_grants(server: InProcessServer) -> None:
    ann = server.user("ann")
    admin = server.admin()
    before = ann.billing.balance()
    assert before.balance_micro == 10_000_000 and before.balance.startswith("$")

    line = admin.admin.grant(GrantCreate(user="ann", amount="25.00", memo="welcome"))
    assert line.amount_micro == 25_000_000
    assert ann.billing.balance().balance_micro == 35_000_000
    admin.admin.grant(GrantCreate(user="ann", amount=str(Decimal("0.5"))))
    usage = ann.billing.usage()
    assert [entry.amount_micro for entry in usage.ledger] == [500_000, 25_000_000, 10_000_000]
    assert usage.ledger[1].memo == "welcome (by admin)"
    assert {u.name for u in admin.admin.users()} == {ADMIN_NAME, "ann", "bob"}

    with pytest.raises(ApiError) as not_admin:
        ann.admin.grant(GrantCreate(user="ann", amount="1000"))
    assert not_admin.value.status == 403
    with pytest.raises(ApiError, match="amount") as bad_amount:
        admin.admin.grant(GrantCreate(user="ann", amount="lots"))
    assert bad_amount.value.status == 422
    with pytest.raises(ApiError) as unknown_user:
        admin.admin.grant(GrantCreate(user="nobody", amount="1.00"))
    assert unknown_user.value.status == 404
    with pytest.raises(ValidationError):  # amounts are decimal strings, never floats
        admin.admin.grant(GrantCreate(user="ann", amount=1.5))  # type: ignore[arg-type]


def test_usage_segments_after_an_instance_ran(server: InProcessServer) -> None:
    ann = server.user()
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))
    server.cluster.start()
    server.cluster.wait_for(lambda: ann.instances.get("box").status == "running")
    ann.instances.stop("box")
    server.cluster.wait_for(lambda: ann.instances.get("box").status == "stopped")
    (segment,) = ann.billing.usage().segments
    assert (segment.gpu_model, segment.gpu_count) == ("T4", 1)
    assert segment.ended_at is not None


def test_unreachable_server_names_the_url() -> None:
    client = GpuleaseClient("http://127.0.0.1:9", timeout=5)
    with client, pytest.raises(ServerUnreachable) as failed:
        client.catalog.gpus()
    assert "http://127.0.0.1:9" in failed.value.message
    assert "cannot reach" in failed.value.message
