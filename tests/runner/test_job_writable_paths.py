"""Every job-writable file the runner reads or writes, planted with a link, a FIFO or a huge
file: refused or bounded, and nothing outside the workspace is read or changes."""

from __future__ import annotations

import io
import os
import struct
import tarfile
import threading
from pathlib import Path

import pytest

from gpulease.runner import tensorboard
from gpulease.runner.jupyter import LOG_NAME, JupyterLab
from gpulease.runner.metrics import SDK_FILE, RunMetrics
from gpulease.runner.tensorboard import EventDirectoryWatcher, find_event_files, masked_crc32c
from gpulease.runner.workdir import UnsafeArchive, extract_workdir

SECRET = '{"token": "runner-secret-of-another-instance"}\n'


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """Another instance's spec.json: outside the workspace, never to be read or changed."""
    path = tmp_path / "runners" / "2" / "spec.json"
    path.parent.mkdir(parents=True)
    path.write_text(SECRET)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    return path


def untouched(canary: Path) -> bool:
    return canary.read_text() == SECRET and canary.stat().st_mtime_ns == 1_000_000_000


def _jupyter(run_dir: Path) -> JupyterLab:
    return JupyterLab(
        run_dir=run_dir,
        env_cache=run_dir / "envs",
        base_url="/instances/1/jupyter/",
        shell=lambda: ({}, str(run_dir), None, run_dir),
        stopping=threading.Event(),
    )


def test_the_jupyter_log_tail_does_not_show_a_linked_file(tmp_path: Path, canary: Path) -> None:
    """The attack: jupyterlab.log made a link to another instance's spec.json, then
    JupyterLab made to fail, so the console's 502 page shows the log's tail."""
    lab = _jupyter(tmp_path / "run")
    (tmp_path / "run" / "jupyter").mkdir(parents=True)
    log = tmp_path / "run" / "jupyter" / LOG_NAME
    log.symlink_to(canary)
    assert "runner-secret" not in lab._log_tail()
    log.unlink()
    os.link(canary, log)  # a second name for it (where hard links could reach it)
    assert "runner-secret" not in lab._log_tail()
    log.unlink()
    os.mkfifo(log)  # would block a plain read forever
    assert lab._log_tail() == "(no log)"
    assert untouched(canary)


def test_the_jupyter_log_tail_is_bounded(tmp_path: Path) -> None:
    lab = _jupyter(tmp_path / "run")
    (tmp_path / "run" / "jupyter").mkdir(parents=True)
    with open(tmp_path / "run" / "jupyter" / LOG_NAME, "wb") as out:
        out.truncate(1 << 40)  # 1 TiB of nothing
        out.seek(0, os.SEEK_END)
        out.write(b"\nlast line\n")
    assert lab._log_tail().endswith("last line")


def test_the_sdk_metrics_file_is_read_in_bounded_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpulease.runner import metrics as runner_metrics

    monkeypatch.setattr(runner_metrics, "MAX_READ_BYTES", 64)
    line = b'{"step": 1, "values": {"loss": 0.5}}\n'
    (tmp_path / SDK_FILE).write_bytes(line * 10)
    metrics = RunMetrics(sdk_file=tmp_path / SDK_FILE)
    for _ in range(10):
        metrics.collect(force=True)
    assert len(metrics.unsent()) == 10


@pytest.mark.parametrize("kind", ["link", "fifo", "hardlink"])
def test_the_sdk_metrics_file_planted_with_a_special_file_is_ignored(
    tmp_path: Path, canary: Path, kind: str
) -> None:
    target = tmp_path / SDK_FILE
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"step": 1, "values": {"token": 7}}\n')
    if kind == "link":
        target.symlink_to(secret)
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        os.link(secret, target)
    metrics = RunMetrics(sdk_file=target)
    metrics.collect(force=True)
    assert metrics.unsent() == []


def _record(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return (
        header
        + struct.pack("<I", masked_crc32c(header))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


def _event(step: int, value: float) -> bytes:
    val = b"\x0a\x04loss\x15" + struct.pack("<f", value)
    summary = b"\x0a" + bytes([len(val)]) + val
    return (
        b"\x09" + struct.pack("<d", 1.7e9) + b"\x10" + bytes([step])
        + b"\x2a" + bytes([len(summary)]) + summary
    )  # fmt: skip


def _other_instances_runs(tmp_path: Path) -> Path:
    """Another instance's TensorBoard directory, with its scalars."""
    other = tmp_path / "workspaces" / "2" / "runs" / "exp"
    other.mkdir(parents=True)
    (other / "events.out.tfevents.1.host").write_bytes(_record(_event(1, 0.25)))
    return other.parent


def test_tensorboard_runs_linked_to_another_workspace_is_not_read(tmp_path: Path) -> None:
    other = _other_instances_runs(tmp_path)
    workspace = tmp_path / "workspaces" / "1"
    workspace.mkdir(parents=True)
    watcher = EventDirectoryWatcher(workspace / "runs")
    (workspace / "runs").symlink_to(other)  # the whole directory
    assert find_event_files(workspace / "runs") == {}
    assert watcher.poll() == []
    (workspace / "runs").unlink()
    (workspace / "runs").mkdir()
    (workspace / "runs" / "exp").symlink_to(other / "exp")  # a directory below it
    (workspace / "runs" / "events.out.tfevents.2.host").symlink_to(
        other / "exp" / "events.out.tfevents.1.host"
    )  # a file
    os.mkfifo(workspace / "runs" / "events.out.tfevents.3.host")
    assert find_event_files(workspace / "runs") == {}
    assert watcher.poll() == []


def test_an_event_file_swapped_for_a_link_after_it_was_found_is_not_read(
    tmp_path: Path,
) -> None:
    other = _other_instances_runs(tmp_path)
    workspace = tmp_path / "workspaces" / "1"
    (workspace / "runs" / "exp").mkdir(parents=True)
    mine = workspace / "runs" / "exp" / "events.out.tfevents.9.host"
    mine.write_bytes(b"")
    watcher = EventDirectoryWatcher(workspace / "runs")
    mine.write_bytes(_record(_event(1, 0.5)))
    assert [(key, s.value) for key, s in watcher.poll()] == [("loss", 0.5)]
    # the job swaps the directory for a link to the other instance's, same names
    os.rename(workspace / "runs" / "exp", workspace / "runs" / "old")
    (workspace / "runs" / "exp").symlink_to(other / "exp")
    os.rename(
        other / "exp" / "events.out.tfevents.1.host", other / "exp" / "events.out.tfevents.9.host"
    )
    with open(other / "exp" / "events.out.tfevents.9.host", "ab") as out:
        out.write(_record(_event(2, 0.125)))
    reader = tensorboard.EventFileReader(mine, 0, root=workspace)
    assert reader.read_new() == []
    assert [s.value for _, s in watcher.poll()] == [0.5]  # its own file, now under old/


def _tar(path: Path, names: list[str]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 5
            tar.addfile(info, io.BytesIO(b"hello"))
    return path


def test_the_workdir_is_not_written_through_a_planted_file_link_or_fifo(
    tmp_path: Path, canary: Path
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "train.py").symlink_to(canary)
    os.mkfifo(workspace / "README")
    extract_workdir(_tar(tmp_path / "w.tar", ["train.py", "README"]), workspace)
    assert untouched(canary)
    assert (workspace / "train.py").read_bytes() == b"hello"  # the link itself replaced
    assert (workspace / "README").read_bytes() == b"hello"


def test_the_workdir_is_not_written_through_a_planted_directory_link(
    tmp_path: Path, canary: Path
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "src").symlink_to(canary.parent)
    with pytest.raises(UnsafeArchive, match="src is a link"):
        extract_workdir(_tar(tmp_path / "w.tar", ["src/spec.json"]), workspace)
    assert untouched(canary)
    assert sorted(p.name for p in canary.parent.iterdir()) == ["spec.json"]


def _cached_tools() -> Path | None:
    from gpulease.envs.build import COMPLETE_MARKER, env_key
    from gpulease.runner.jupyter import TOOLS_TEMPLATE
    from processes import ENV_CACHE

    return ENV_CACHE if (ENV_CACHE / env_key(TOOLS_TEMPLATE) / COMPLETE_MARKER).exists() else None


@pytest.mark.parametrize("planted", ["share", "log"])
def test_jupyter_files_are_not_written_through_planted_links(
    tmp_path: Path, canary: Path, planted: str
) -> None:
    """JupyterLab's directory is writable to the job: a link at share/ (where the runner
    writes the kernelspec) or at the log (which the runner opens to append) is refused."""
    cache = _cached_tools()
    if cache is None:
        pytest.skip("the JupyterLab tools environment is not built on this machine")
    run_dir = tmp_path / "run"
    (run_dir / "jupyter").mkdir(parents=True)
    if planted == "share":
        (run_dir / "jupyter" / "share").symlink_to(canary.parent)
    else:
        (run_dir / "jupyter" / LOG_NAME).symlink_to(canary)
    lab = JupyterLab(
        run_dir=run_dir,
        env_cache=cache,
        base_url="/instances/1/jupyter/",
        shell=lambda: ({"PATH": "/usr/bin:/bin"}, str(tmp_path), None, cache),
        stopping=threading.Event(),
    )
    with pytest.raises(RuntimeError, match="cannot be written"):
        lab.ensure()
    lab.stop()
    assert untouched(canary)
    assert sorted(p.name for p in canary.parent.iterdir()) == ["spec.json"]
