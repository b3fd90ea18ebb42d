"""Jobs as an unprivileged uid of their own, on a network of their own: the real bwrap,
setpriv, slirp4netns and nftables (the whole-system checks are in tests/e2e)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpulease.runner import netns, sandbox
from gpulease.runner.netns import InstanceNetwork
from gpulease.runner.sandbox import (
    LOADER_PREFIX,
    UID_BASE,
    Sandbox,
    SandboxError,
    base_environment,
    find_bwrap,
    give_tree,
    instance_uid,
    open_parents,
)
from gpulease.server.isolation import SandboxRequired, require_sandbox
from gpulease.server.settings import Settings

BWRAP = find_bwrap()
pytestmark = pytest.mark.skipif(
    BWRAP is None or os.geteuid() != 0, reason="needs bubblewrap and root"
)
VENV = Path(sys.prefix)
# Far from the ids of instances that real servers on this host may be running.
INSTANCE_ID = 4_000_000 + os.getpid()
UID = instance_uid(INSTANCE_ID)


def make_sandbox(workspace: Path, network: InstanceNetwork | None = None) -> Sandbox:
    assert BWRAP is not None
    return Sandbox(
        workspace=workspace,
        env_dir=VENV,
        hostname="gpulease-7",
        bwrap=BWRAP,
        uid=UID,
        network=network,
    )


def run_in(jail: Sandbox, script: str, env: dict[str, str] | None = None) -> str:
    argv = jail.command(["bash", "-c", script])
    environment = jail.environment(env if env is not None else base_environment(os.environ))
    result = subprocess.run(
        argv, env=environment, cwd=jail.workspace, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_job_runs_as_the_instance_uid_without_capabilities(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    (workspace / "venv" / "bin").mkdir(parents=True)
    (workspace / "venv" / "bin" / "tool").write_text("the runner's file")  # root's, for now
    out = run_in(
        make_sandbox(workspace),
        "id -u; id -G; grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; "
        "echo made > /workspace/made; echo more >> /workspace/venv/bin/tool; "
        "touch /tmp/t /dev/shm/s && echo tmp-ok; "
        "(echo x > /etc/owned) 2>/dev/null && echo etc=WROTE || echo etc=denied",
    )
    lines = out.split()
    assert lines[0] == lines[1] == str(UID) == str(UID_BASE + INSTANCE_ID)
    assert "CapEff:\t0000000000000000" in out and "CapBnd:\t0000000000000000" in out
    assert "NoNewPrivs:\t1" in out
    assert "tmp-ok" in out and "etc=denied" in out
    # The workspace is the instance's: what the job made and what the runner left there.
    for path in (workspace, workspace / "made", workspace / "venv" / "bin" / "tool"):
        assert (path.stat().st_uid, path.stat().st_gid) == (UID, UID)


def test_handing_the_workspace_over_follows_no_link(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    host_file = tmp_path / "host-secret"
    host_file.write_text("root's")
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    (host_dir / "inside").write_text("root's too")
    (workspace / "file-link").symlink_to(host_file)
    (workspace / "dir-link").symlink_to(host_dir)
    os.link(host_file, workspace / "hard-link")  # as a job could where hard links are free
    (workspace / "own").write_text("mine")

    give_tree(workspace, UID)

    for path in (host_file, host_dir, host_dir / "inside"):
        assert path.stat().st_uid == 0, path
    assert (workspace / "own").stat().st_uid == UID
    assert os.lstat(workspace / "file-link").st_uid == UID  # the link itself, harmless


def test_loader_variables_take_effect_only_as_the_job(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    jail = make_sandbox(workspace)
    env = {
        **base_environment(os.environ),
        "LD_LIBRARY_PATH": "/workspace/lib",
        "GCONV_PATH": "/workspace/gconv",
        f"{LOADER_PREFIX}LD_PRELOAD": "/workspace/evil.so",  # only the sandbox names these
    }
    outside = jail.environment(env)
    # Nothing that runs as root on the way in (nsenter, bwrap, setpriv) sees them.
    assert not [key for key in outside if key.startswith("LD_") or key == "GCONV_PATH"]
    assert f"{LOADER_PREFIX}LD_PRELOAD" not in outside
    out = run_in(jail, 'echo "$LD_LIBRARY_PATH|$GCONV_PATH|${LD_PRELOAD-unset}"; env', env)
    assert out.splitlines()[0] == "/workspace/lib|/workspace/gconv|unset"
    assert LOADER_PREFIX not in out


def test_missing_parents_of_mount_points_are_made_enterable() -> None:
    options = [
        "--ro-bind",
        "/etc/hosts",
        "/etc/hosts",
        "--bind",
        "/srv/ws",
        "/workspace",
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--ro-bind",
        "/srv/ws/sub",
        "/workspace/sub/dir",
        "--",
        "--ro-bind",
    ]
    assert open_parents(options) == [
        "--perms",
        "0755",
        "--dir",
        "/etc",
        "--ro-bind",
        "/etc/hosts",
        "/etc/hosts",
        "--bind",
        "/srv/ws",
        "/workspace",
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        # /workspace/sub lies in the host's /srv/ws: not made here
        "--ro-bind",
        "/srv/ws/sub",
        "/workspace/sub/dir",
        "--",
        "--ro-bind",
    ]


def test_instance_uids_stay_in_range() -> None:
    assert instance_uid(1) == UID_BASE + 1
    assert instance_uid(3, base=500_000) == 500_003
    with pytest.raises(SandboxError, match="GPULEASE_SANDBOX_UID_BASE"):
        instance_uid(2**32, base=UID_BASE)
    with pytest.raises(SandboxError):
        instance_uid(1, base=0)  # root's neighbourhood


def test_the_network_keeps_the_host_out_and_goes_with_the_sandbox(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    network = InstanceNetwork("test", root=tmp_path / "netns")
    jail = make_sandbox(workspace, network)
    with socket.socket() as listener:  # a service on the host's loopback
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        out = run_in(
            jail,
            f"for h in 127.0.0.1 10.0.2.2; do (exec 3<>/dev/tcp/$h/{port}) 2>/dev/null "
            "&& echo $h=REACHED || echo $h=refused; done; "
            "nft flush ruleset 2>/dev/null && echo nft=FLUSHED || echo nft=denied; "
            "ip link set tap0 down 2>/dev/null && echo link=DOWN || echo link=denied; "
            "cat /etc/resolv.conf",
        )
    assert "127.0.0.1=refused" in out and "10.0.2.2=refused" in out
    assert "nft=denied" in out and "link=denied" in out
    assert f"nameserver {netns.DNS_FORWARDER}" in out
    rules = subprocess.run(
        [*network.enter_args(), "nft", "list", "ruleset"], capture_output=True, text=True
    ).stdout
    assert "169.254.0.0/16" in rules and "10.0.0.0/8" in rules  # still in force
    assert network.path.exists()

    jail.close()
    jail.close()  # idempotent
    assert not network.path.exists() and not network.resolv_conf.exists()
    with pytest.raises(SandboxError, match="network"):
        jail.command(["true"])


def test_closing_kills_what_is_still_in_the_instance_network(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    network = InstanceNetwork("test", root=tmp_path / "netns")
    jail = make_sandbox(workspace, network)
    leftover = subprocess.Popen(
        jail.command(["sleep", "600"]),
        env=jail.environment(base_environment(os.environ)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not _runs_as(UID):
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.05)
        jail.close()
        assert leftover.wait(20) != 0  # its processes were killed, bwrap with them
        assert not _runs_as(UID)
    finally:
        leftover.kill()
        leftover.wait()


def _runs_as(uid: int) -> bool:
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        uids = [line.split()[1:3] for line in status.splitlines() if line.startswith("Uid:")]
        if uids and str(uid) in uids[0]:
            return True
    return False


def test_an_address_the_host_gets_later_is_refused_to_new_processes(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    network = InstanceNetwork("test", root=tmp_path / "netns")
    jail = make_sandbox(workspace, network)
    dummy = f"gpld{os.getpid() % 100000}"
    address = "198.51.100.77"  # outside the private ranges: refused only as the host's
    try:
        run_in(jail, "true")  # the network is up before the host has the address
        peer = dummy.replace("gpld", "gple")
        subprocess.run(
            ["ip", "link", "add", dummy, "type", "veth", "peer", "name", peer], check=True
        )
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", dummy], check=True)
        subprocess.run(["ip", "link", "set", dummy, "up"], check=True)
        with socket.socket() as listener:
            listener.bind((address, 0))
            listener.listen()
            port = listener.getsockname()[1]
            out = run_in(
                jail,
                f"(exec 3<>/dev/tcp/{address}/{port}) 2>/dev/null && echo REACHED || echo refused",
            )
        assert out.strip() == "refused"
    finally:
        subprocess.run(["ip", "link", "del", dummy], check=False, capture_output=True)
        jail.close()


def test_rules_allow_dns_to_the_resolvers_only(tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("search lab.example\nnameserver 10.255.255.53\nnameserver ::1\n")
    assert netns.host_nameservers(resolv) == ["10.255.255.53"]
    assert netns.sandbox_resolv_conf(resolv) == (
        f"nameserver {netns.DNS_FORWARDER}\nsearch lab.example\n"
    )
    rules = netns.ruleset(["192.0.2.7"], ["10.255.255.53"])
    assert "ip daddr { 10.0.2.3, 10.255.255.53 } udp dport 53 accept" in rules
    assert "192.0.2.7" in rules and "100.64.0.0/10" in rules
    # the DNS exceptions come before the private ranges are refused
    assert rules.index("dport 53 accept") < rules.index("10.0.0.0/8")


def test_the_server_refuses_multi_user_without_job_isolation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sandbox, "SETPRIV", str(tmp_path / "no-setpriv"))
    with pytest.raises(SandboxRequired) as refused:
        require_sandbox(Settings(home=tmp_path / "home"))
    message = str(refused.value)
    assert "setpriv is missing" in message and "apt-get install util-linux" in message
    assert "GPULEASE_UNSANDBOXED_SINGLE_USER=true" in message


def test_an_unusable_network_is_reported_with_the_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    reason = netns.probe(root=blocker / "netns")
    assert reason is not None and "cannot hold network namespaces" in reason
