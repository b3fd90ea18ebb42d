"""Workspace save on a fleet node: the first save of a workspace beside a save of it unchanged.

A real server app (SQLite, the fake backend of the tests, in this process: the runner's calls
go through the ASGI transport, not TCP) and the runner's own workspace_sync code. The
workspace: 5,000 files of random bytes, 32 MiB in all. In one run, N rounds (default 3) of:

- first: the instance's store and the node's index empty: every file is read, hashed, sent;
- unchanged, with the index: nothing is read or hashed, and since the file list is the one
  the server last took (the index keeps its digest), the save is one call that says so;
- unchanged, without the index: what every save did before the node kept one (every file
  read and hashed again, the chunk list asked about, nothing sent but the file list).

Medians of the N rounds. The page cache holds the files in every case (a save right after
the job wrote them), so the unindexed save's cost here is hashing, not disk reads.

    .venv/bin/python benchmarks/workspace_save.py [-n 3] [--files 5000] [--mib 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from results import emit
from starlette.testclient import TestClient

from factories import RunnerDouble, make_running_instance, make_settings, make_user  # noqa: E402
from gpulease.backends.fake import FakeBackend  # noqa: E402
from gpulease.runner import workspace_sync  # noqa: E402
from gpulease.runner.connection import Connection  # noqa: E402
from gpulease.server.app import create_app  # noqa: E402
from gpulease.server.reconcilers.loop import run_once  # noqa: E402
from gpulease.server.runtime import build_runtime  # noqa: E402
from gpulease.server.services import workspaces  # noqa: E402


def fill(workspace: Path, files: int, total: int) -> None:
    size = total // files
    for n in range(files):
        directory = workspace / f"d{n // 100:02d}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{n:04d}.bin").write_bytes(os.urandom(size))


def timed(save: object) -> tuple[float, workspace_sync.Outcome]:
    start = time.perf_counter()
    outcome = save()  # type: ignore[operator]
    assert outcome is not None
    return time.perf_counter() - start, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=3)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--mib", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        settings = make_settings(root / "home", f"sqlite:///{root / 'gpulease.db'}")
        backend = FakeBackend()
        backend.same_host = False
        rt = build_runtime(settings, backend)
        with TestClient(create_app(settings, runtime=rt, reconcilers=False)) as http:
            owner = make_user(http, "bench")

            def runner_for(instance_id: int) -> RunnerDouble:
                handle = backend.handle_for(instance_id)
                assert handle is not None
                return RunnerDouble(http, backend.runners[handle].spec.token)

            instance_id, runner = make_running_instance(owner, lambda: run_once(rt), runner_for)
            handle = backend.handle_for(instance_id)
            assert handle is not None
            workspace = root / "node" / "ws"
            fill(workspace, args.files, args.mib * 2**20)
            spec = replace(
                backend.runners[handle].spec, workspace=workspace, run_dir=root / "node" / "run"
            )
            connection = Connection(
                "http://testserver", runner.token, on_stop=lambda _: None, transport=http._transport
            )
            later = lambda: time.time_ns() + 60 * 10**9  # noqa: E731 (the files are not fresh)
            first, bare, indexed = [], [], []
            for i in range(args.n):
                assert rt.vault is not None
                workspaces.forget(rt.sessions, rt.vault, instance_id)
                workspace_sync.index_path(spec).unlink(missing_ok=True)
                took, got = timed(lambda: workspace_sync.save(spec, connection, clock_ns=later))
                assert got.read_files == args.files and got.sent_bytes == got.bytes
                first.append(took)
                took, got = timed(lambda: workspace_sync.save(spec, connection, clock_ns=later))
                assert got.read_files == 0 and got.sent_chunks == 0
                indexed.append(took)
                took, got = timed(lambda: workspace_sync.save(spec, connection, use_index=False))
                assert got.read_files == args.files and got.sent_chunks == 0
                bare.append(took)
                print(
                    f"round {i + 1}/{args.n}: first {first[-1]:.2f} s, unchanged without the "
                    f"index {bare[-1]:.2f} s, with it {indexed[-1]:.2f} s",
                    flush=True,
                )
            connection.close()
        rt.engine.dispose()
    m_first, m_bare, m_indexed = (statistics.median(x) for x in (first, bare, indexed))
    what = f"{args.files} files, {args.mib} MiB"
    print(
        f"medians of {args.n} ({what}): first save {m_first:.2f} s; unchanged save "
        f"{m_indexed:.3f} s with the node's index, {m_bare:.2f} s without it"
    )
    emit(
        f"workspace save, unchanged ({what})",
        f"{m_indexed:.3f} s",
        f"{m_bare:.2f} s without the index; first save {m_first:.2f} s",
        f"{m_indexed / m_bare:.2f}×",
        "under the unindexed save",
        m_indexed < m_bare,
    )


if __name__ == "__main__":
    main()
