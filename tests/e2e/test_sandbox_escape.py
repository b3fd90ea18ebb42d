"""Escape attempts from inside a run, through a real server, CLI and runners: each fails."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from processes import Platform, free_port

pytestmark = pytest.mark.e2e

PASSWORD = "password-123"
MARKER = "sleep 1234.5"  # ann's long job, easy to find in the host's process table


def _register(platform: Platform, name: str) -> None:
    platform.cli("register", "--server", platform.url, "--name", name, "--password", PASSWORD)


def _host_pid_of(command: str, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if cmdline.decode(errors="replace").strip() == command:
                return int(entry)
        time.sleep(0.2)
    raise AssertionError(f"no process {command!r} on the host")


def test_a_job_cannot_read_the_server_or_another_tenant(platform: Platform, tmp_path: Path) -> None:
    home = platform.home
    # The server's secrets, as they lie in its data directory.
    master_key = home / "keys" / "master.key"
    if not master_key.exists():
        master_key.parent.mkdir(mode=0o700, exist_ok=True)
        master_key.write_text("dummy master key")
    database = home / "gpulease.db"
    if not database.exists():  # PostgreSQL: stand a file in for the SQLite database
        database.write_text("dummy database")

    _register(platform, "ann")
    platform.cli(
        "instance", "create", "--gpu", "T4:1", "--template", "python", "--name", "a", "--wait"
    )
    ann: Any = platform.cli_json("instance", "show", "a")
    ann_workspace = home / "workspaces" / str(ann["id"])
    platform.cli("exec", "a", "--", "echo ann-secret > secret.txt")
    assert (ann_workspace / "secret.txt").read_text() == "ann-secret\n"
    ann_dataset = home / "datasets" / "ann-cats-v1"  # a materialised dataset of ann's
    ann_dataset.mkdir(parents=True, exist_ok=True)
    (ann_dataset / "cat.jpg").write_text("ann's cat")
    ann_job = platform.popen_cli(
        "exec",
        "a",
        "--",
        f"echo private > /tmp/ann-tmp; echo started; exec {MARKER}",
        stderr_path=tmp_path / "ann.err",
    )
    try:
        assert ann_job.stdout is not None
        assert ann_job.stdout.readline().strip() == "started"
        ann_pid = _host_pid_of(MARKER)

        _register(platform, "bob")
        platform.cli(
            "instance",
            "create",
            "--gpu",
            "A100-80GB:1",  # ann holds the only T4
            "--template",
            "python",
            "--name",
            "b",
            "--wait",
        )
        secrets = {
            "database": database,
            "master-key": master_key,
            "ann-workspace": ann_workspace / "secret.txt",
            "ann-dataset": ann_dataset / "cat.jpg",
            "runner-spec": home / "runners" / str(ann["id"]) / "spec.json",
        }
        reads = "".join(
            f"cat {path} >/dev/null 2>&1 && echo {name}=READ || echo {name}=denied; "
            for name, path in secrets.items()
        )
        script = (
            reads
            + f"ls {home} >/dev/null 2>&1 && echo home=LISTED || echo home=denied; "
            + f"test -e /proc/{ann_pid} && echo proc=VISIBLE || echo proc=hidden; "
            + f"kill -0 {ann_pid} 2>/dev/null && echo kill=SIGNALLED || echo kill=denied; "
            + "echo pids=$(ls /proc | grep -cE '^[0-9]+$'); "
            + "(echo x >> /usr/bin/evil) 2>/dev/null && echo usr=WROTE || echo usr=denied; "
            + "(echo x >> /etc/passwd) 2>/dev/null && echo etc=WROTE || echo etc=denied; "
            + "cat /tmp/ann-tmp >/dev/null 2>&1 && echo tmp=READ || echo tmp=denied; "
            + "env | grep -q '^GPULEASE_DATABASE_URL=' && echo dburl=LEAKED || echo dburl=absent; "
            + "echo pwd=$PWD"
        )
        result = platform.cli("exec", "b", "--", script)
        seen = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
        assert {key: seen.get(key) for key in secrets} == dict.fromkeys(secrets, "denied")
        assert seen["home"] == "denied"
        assert seen["proc"] == "hidden" and seen["kill"] == "denied"
        assert int(seen["pids"]) < 10, seen  # only bob's own few processes
        assert seen["usr"] == "denied" and seen["etc"] == "denied"
        assert seen["tmp"] == "denied"
        assert seen["dburl"] == "absent"
        assert seen["pwd"] == "/workspace"
        # ann's job lived through all of it
        assert ann_job.poll() is None
    finally:
        ann_job.terminate()
        ann_job.wait(30)
        if ann_job.stdout is not None:
            ann_job.stdout.close()


# -- the network and the uid: one job run does every check -----------------------------------

# Runs inside the job: connects to every target (each must fail), resolves the index host,
# optionally pip-downloads, then binds the server's port and waits for a connection that
# must never come (the host's traffic to that port still reaches the server).
NETCHECK = r"""
import json, os, socket, subprocess, sys, time
spec = json.loads(sys.argv[1])
reached = []
for host, port in spec["targets"]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(3)
        try:
            sock.connect((host, port))
            reached.append([host, port])
        except OSError:
            pass
result = {"reached": reached, "uid": os.getuid()}
try:
    result["dns"] = sorted({a[4][0] for a in socket.getaddrinfo(spec["index_host"], 443)})
except OSError as exc:
    result["dns"] = str(exc)
if spec["download"]:
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "six", "-d", "/tmp/dl",
         "--index-url", spec["index_url"], "--no-cache-dir", "-q"],
        capture_output=True, text=True, timeout=120,
    )
    result["pip"] = pip.returncode
    result["pip_error"] = pip.stderr[-1000:]
trap = socket.socket()
trap.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
trap.bind(("127.0.0.1", spec["server_port"]))
trap.listen()
trap.settimeout(float(spec["trap_s"]))
print(json.dumps(result), flush=True)
print("bound", flush=True)
try:
    trap.accept()
    print("captured", flush=True)
except OSError:
    print("nothing", flush=True)
"""
PRIVATE_NS = f"gpl-test-{os.getpid()}"
HOST_SIDE = "198.51.100.1"  # a host interface address outside the private ranges
PRIVATE_PEER = "10.254.77.2"  # a private address behind it, in a namespace of the test's


def _loopback_listeners() -> set[int]:
    """Ports listening on the host's loopback (or on every address), from /proc/net/tcp{,6}."""
    ports = set()
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            address, port = fields[1].split(":")
            if fields[3] != "0A":  # LISTEN
                continue
            if name == "tcp":  # little-endian: 127.x.y.z ends in 7F
                local = address.endswith("7F") or address == "0" * 8
            else:
                local = address in ("0" * 32, "0" * 24 + "01000000")
            if local:
                ports.add(int(port, 16))
    return ports


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture
def private_network() -> Iterator[tuple[int, int]]:
    """A veth from the host (HOST_SIDE, 10.254.77.1) to a namespace of the test's
    (PRIVATE_PEER), a listener on each side: (host-side port, peer port)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to build a test network")
    host_if, peer_if = f"gplh{os.getpid() % 100000}", f"gplp{os.getpid() % 100000}"
    _sh("ip", "netns", "add", PRIVATE_NS)
    peer: subprocess.Popen[bytes] | None = None
    listener = socket.socket()
    try:
        _sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if)
        _sh("ip", "link", "set", peer_if, "netns", PRIVATE_NS)
        _sh("ip", "addr", "add", f"{HOST_SIDE}/24", "dev", host_if)
        _sh("ip", "addr", "add", "10.254.77.1/24", "dev", host_if)
        _sh("ip", "link", "set", host_if, "up")
        inside = ("ip", "netns", "exec", PRIVATE_NS)
        _sh(*inside, "ip", "addr", "add", f"{PRIVATE_PEER}/24", "dev", peer_if)
        _sh(*inside, "ip", "link", "set", peer_if, "up")
        _sh(*inside, "ip", "link", "set", "lo", "up")
        peer_port = free_port()
        peer = subprocess.Popen(
            [*inside, sys.executable, "-m", "http.server", "--bind", PRIVATE_PEER, str(peer_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        listener.bind((HOST_SIDE, 0))
        listener.listen()
        deadline = time.monotonic() + 20
        while True:  # the host reaches both
            try:
                socket.create_connection((PRIVATE_PEER, peer_port), timeout=1).close()
                socket.create_connection((HOST_SIDE, listener.getsockname()[1]), 1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield listener.getsockname()[1], peer_port
    finally:
        listener.close()
        if peer is not None:
            peer.terminate()
            peer.wait(10)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", PRIVATE_NS], capture_output=True, check=False)


def _index() -> tuple[str, str]:
    """The package index's host and URL: pip's configured http(s) index, else PyPI."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    for line in result.stdout.splitlines():
        key, _, value = line.partition("=")
        for url in value.strip("'\"").split():
            if key.endswith("index-url") and url.startswith(("http://", "https://")):
                return urlsplit(url).hostname or "pypi.org", url
    return "pypi.org", "https://pypi.org/simple"


def _host_reaches(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError:
        return False
    return True


def test_a_job_has_its_own_network_and_uid(
    platform: Platform, private_network: tuple[int, int], tmp_path: Path
) -> None:
    host_port, peer_port = private_network
    _register(platform, "ann")
    platform.cli(
        "instance", "create", "--gpu", "T4:1", "--template", "python", "--name", "n", "--wait"
    )
    listening = _loopback_listeners()
    assert platform.port in listening
    targets = [["127.0.0.1", port] for port in sorted(listening)]
    targets += [["10.0.2.2", port] for port in sorted(listening)]  # slirp's host loopback
    targets += [["::1", port] for port in sorted(listening)]
    targets += [[HOST_SIDE, host_port], [PRIVATE_PEER, peer_port], ["169.254.169.254", 80]]
    index_host, index_url = _index()
    download = _host_reaches(index_host, 443)
    spec = {
        "targets": targets,
        "index_host": index_host,
        "index_url": index_url,
        "download": download,
        "server_port": platform.port,
        "trap_s": 5,
    }
    platform.cli("exec", "n", "--", f"cat > netcheck.py <<'EOF'\n{NETCHECK}\nEOF")
    job = platform.popen_cli(
        "exec",
        "n",
        "--",
        f"exec python3 netcheck.py '{json.dumps(spec)}'",
        stderr_path=tmp_path / "netcheck.err",
    )
    try:
        assert job.stdout is not None
        line = job.stdout.readline()
        assert line, (tmp_path / "netcheck.err").read_text()
        result = json.loads(line)
        assert job.stdout.readline().strip() == "bound"
        # The job holds 127.0.0.1:PORT in its namespace; the host's port is still the server.
        assert httpx.get(f"{platform.url}/healthz", timeout=10).status_code == 200
        status = _job_status(_host_pid_of_script("netcheck.py"))
        assert job.stdout.readline().strip() == "nothing"
    finally:
        job.wait(60)
        if job.stdout is not None:
            job.stdout.close()
    assert result["reached"] == []
    assert result["uid"] != 0
    # Seen from the host too: the job's process is not root there.
    assert status["Uid"].split()[0] == str(result["uid"]) != "0"
    assert isinstance(result["dns"], list) and result["dns"], result["dns"]
    if download:
        assert result["pip"] == 0, result["pip_error"]
    else:
        print(f"the host cannot reach {index_host}:443: outbound download not checked")
    owner = (platform.home / "workspaces").glob("*/netcheck.py")
    assert [path.stat().st_uid for path in owner] == [result["uid"]]


def _host_pid_of_script(name: str, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if len(cmdline) > 1 and cmdline[1] == name.encode():
                return int(entry)
        time.sleep(0.2)
    raise AssertionError(f"no process running {name} on the host")


def _job_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)
