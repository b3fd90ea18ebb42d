"""Datasets end to end: the real CLI pushes, a real runner materialises, a real job reads."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from datasets_support import random_tree, tree_digests, write_tree
from gpulease.client import GpuleaseClient
from processes import Platform

pytestmark = pytest.mark.e2e

CHECK = """
import hashlib, json, os, pathlib, sys
name = sys.argv[1]
root = pathlib.Path("/data") / name
if not root.is_dir():
    root = pathlib.Path(os.environ["GPULEASE_DATASETS_DIR"]) / name
expected = json.loads(pathlib.Path("expected.json").read_text())
found = {
    p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in root.rglob("*") if p.is_file()
}
bad = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))
print(f"root={root} files={len(found)} bad={len(bad)} {bad[:3]}")
if str(root).startswith("/data/"):
    try:
        (root / "new-file").write_text("x")
        print("write=allowed")
    except OSError as exc:
        print(f"write=refused ({exc.strerror})")
sys.exit(1 if bad else 0)
"""


def _register(platform: Platform, name: str = "ann") -> None:
    platform.cli("register", "--server", platform.url, "--name", name, "--password", "password-123")


def test_a_run_reads_every_file_of_a_pushed_dataset(platform: Platform, tmp_path: Path) -> None:
    _register(platform)
    random_tree(tmp_path / "cats", 400, 5000)
    write_tree(tmp_path / "cats", {"empty": b"", "big/weights.bin": b"\x07" * 9_000_000})
    pushed: Any = json.loads(
        platform.cli(
            "dataset", "push", str(tmp_path / "cats"), "--name", "cats", "-o", "json"
        ).stdout
    )
    assert pushed["files"] == 402 and pushed["dataset"]["current_version"] == 1
    work = tmp_path / "work"
    work.mkdir()
    (work / "check.py").write_text(CHECK)
    (work / "expected.json").write_text(json.dumps(tree_digests(tmp_path / "cats")))
    result = platform.cli(
        "run",
        "--template",
        "python",
        "--dataset",
        "cats",
        "--workdir",
        str(work),
        "--",
        "python check.py cats",
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "files=402 bad=0" in result.stdout
    if "root=/data/cats" in result.stdout:  # in the sandbox: mounted read-only
        assert "write=refused" in result.stdout
    # the version is materialised once on the node, read-only
    (materialised,) = (platform.home / "datasets").glob("*-v1")
    assert tree_digests(materialised) == tree_digests(tmp_path / "cats")
    assert (materialised / "empty").stat().st_mode & 0o222 == 0


def test_kill_the_cli_halfway_then_push_again(
    platform: Platform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _register(platform)
    # 180 MB: several times what the client keeps in flight (two threads, two 16 MB packs
    # each), so a kill at the first 4 MB the server has leaves packs never sent
    files = random_tree(tmp_path / "imgs", 360, 500_000)
    total = sum(len(d) for d in files.values())
    monkeypatch.setenv("GPULEASE_CONFIG", str(platform.config))
    # closed on a failure too: a socket left to the collector fails whichever test it dies in
    with GpuleaseClient.from_saved_login() as client:
        cli = platform.popen_cli(
            "dataset", "push", str(tmp_path / "imgs"), "--name", "imgs", stderr_path=tmp_path / "e"
        )
        received = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and cli.poll() is None:
            try:
                received = client.datasets.get_push("imgs", 1).bytes_received
            except Exception:
                received = 0
            if received >= 4_000_000:
                cli.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
        cli.wait(30)
        assert cli.stdout is not None
        cli.stdout.close()
        assert cli.returncode == -signal.SIGKILL, "the push ended before it could be interrupted"
        assert platform.cli("dataset", "ls", "-o", "json").stdout.count('"name"') == 0

        second: Any = json.loads(
            platform.cli(
                "dataset", "push", str(tmp_path / "imgs"), "--name", "imgs", "-o", "json"
            ).stdout
        )
        detail: Any = platform.cli_json("dataset", "show", "imgs")
        first = next(p for p in detail["pushes"] if p["id"] == 1)
        assert first["state"] == "abandoned"
        assert first["bytes_received"] + second["sent_bytes"] == total  # nothing sent twice
        assert 0 < second["sent_bytes"] < total
        assert detail["dataset"]["file_count"] == 360 and detail["dataset"]["size_bytes"] == total


def test_rotate_master_key_on_the_server_host(platform: Platform, tmp_path: Path) -> None:
    _register(platform)
    write_tree(tmp_path / "d", {"a.txt": b"kept across the rotation"})
    platform.cli("dataset", "push", str(tmp_path / "d"), "--name", "d")
    key = platform.home / "keys" / "master.key"
    before = key.read_text()
    rotated = platform.cli("admin", "rotate-master-key")
    assert "rotated the master key" in rotated.stdout and key.read_text() != before
    # the running server goes on with the new key
    (tmp_path / "d" / "b.txt").write_text("after")
    platform.cli("dataset", "push", str(tmp_path / "d"), "--name", "d")
    detail: Any = platform.cli_json("dataset", "show", "d")
    assert detail["dataset"]["current_version"] == 2 and detail["dataset"]["file_count"] == 2
