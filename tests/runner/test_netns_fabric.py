"""The job fabric in an instance's network: a macvlan of the node's fabric parent moved into
the namespace, reachable from the rank's own gang only (runner/netns.py). Real namespaces,
a real veth parent (tests/fabric_support.py) and real TCP."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import pytest

from fabric_support import HOST_ADDRESS, PARENT, PREFIX, fabric_namespace, links
from gpulease.runner import netns
from gpulease.schemas.runner import FabricLink

PORT = 29611
# Connect to sys.argv[1]:PORT and say how it went.
CONNECT = f"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], {PORT}), timeout=2).close()
    print("connected")
except OSError as exc:
    print("refused" if isinstance(exc, ConnectionRefusedError) else type(exc).__name__)
"""
# Accept connections on PORT and answer each; say when listening.
LISTEN = f"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {PORT}))
s.listen()
print("listening", flush=True)
while True:
    s.accept()[0].close()
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    if (reason := netns.probe(tmp_path / "probe")) is not None:
        pytest.skip(f"no instance network here: {reason}")
    return tmp_path / "netns"


@pytest.fixture
def fabric() -> Iterator[str]:
    with fabric_namespace(f"gplfabt-{os.getpid()}") as name:
        yield name


def link(address: str, peers: tuple[str, ...], fabric: str) -> FabricLink:
    return FabricLink(
        address=f"{address}/{PREFIX}", peers=peers, parent=PARENT, parent_netns=fabric
    )


def run_in(network: netns.InstanceNetwork, code: str, *args: str) -> str:
    argv = [*network.enter_args(), sys.executable, "-c", code, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()


def listen_in(stack: ExitStack, prefix: list[str]) -> None:
    """A listener on PORT in the namespace that the argv prefix enters."""
    process = subprocess.Popen(
        [*prefix, sys.executable, "-c", LISTEN],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    stack.callback(process.stdout.close)
    stack.callback(process.wait)
    stack.callback(process.kill)
    assert process.stdout.readline().strip() == "listening"


def network(stack: ExitStack, root: Path, name: str, fabric: FabricLink) -> netns.InstanceNetwork:
    made = netns.InstanceNetwork(name, root, fabric=fabric)
    stack.callback(made.close)
    made.ensure()
    return made


def test_ranks_of_one_gang_reach_each_other_and_nothing_else_on_the_fabric(
    root: Path, fabric: str
) -> None:
    a0_addr, a1_addr, b0_addr = "10.213.0.1", "10.213.0.2", "10.213.0.3"
    with ExitStack() as stack:
        a0 = network(stack, root, "a0", link(a0_addr, (a1_addr,), fabric))
        a1 = network(stack, root, "a1", link(a1_addr, (a0_addr,), fabric))
        b0 = network(stack, root, "b0", link(b0_addr, ("10.213.0.4",), fabric))
        # a hostile gang whose peers would name a0: a0's own rules still drop it
        b1 = network(stack, root, "b1", link("10.213.0.5", (a0_addr,), fabric))
        for each in (a0, a1, b0):
            listen_in(stack, each.enter_args())
        listen_in(stack, ["ip", "netns", "exec", fabric])  # a host of the range, listening
        assert run_in(a1, CONNECT, a0_addr) == "connected"  # both ways, any port
        assert run_in(a0, CONNECT, a1_addr) == "connected"
        assert run_in(b0, CONNECT, a0_addr) == "refused"  # another gang's rank, out
        assert run_in(a1, CONNECT, b0_addr) == "refused"  # a fabric address outside its gang
        assert run_in(a1, CONNECT, HOST_ADDRESS) == "refused"  # the rest of the range
        assert run_in(b1, CONNECT, a0_addr) == "TimeoutError"  # dropped by a0, on the way in
        # the sandbox's other blocks stay: the node's loopback is not reachable
        assert run_in(a1, CONNECT, "10.0.2.2") == "refused"
        before = links(fabric)
        assert not any(name.startswith("gf") for name in before), before
    # closed: the namespaces and their macvlans are gone, the parent is as it was
    assert links(fabric) == {"lo", PARENT, "gplfab1"}
    assert not [p for p in root.iterdir() if p.name != netns.PROBE_MARK]


def test_the_rules_are_in_place_before_the_interface_is_up(root: Path, fabric: str) -> None:
    with ExitStack() as stack:
        made = network(stack, root, "r0", link("10.213.0.7", ("10.213.0.8",), fabric))
        nft = netns.find_tool("nft") or "nft"
        rules = subprocess.run(
            ["nsenter", f"--net={made.path}", "--", nft, "list", "ruleset"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert 'oifname "fabric0" ip daddr 10.213.0.8 accept' in rules, rules
        assert 'iifname "fabric0" ip saddr 10.213.0.8 accept' in rules
        assert 'iifname "fabric0" drop' in rules
        shown = subprocess.run(
            ["nsenter", f"--net={made.path}", "--", "ip", "-o", "-4", "address"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "fabric0" in shown and "10.213.0.7/24" in shown


def test_ruleset_on_the_fabric_allows_only_the_peers() -> None:
    rules = netns.ruleset(
        ["192.168.1.5"], [], FabricLink(address="10.9.0.2/16", peers=("10.9.0.1", "10.9.0.3"))
    )
    output = rules.index("chain output")
    accept = rules.index('oifname "fabric0" ip daddr { 10.9.0.1, 10.9.0.3 } accept')
    reject = rules.index('oifname "fabric0" reject with icmpx type admin-prohibited')
    blocked = rules.index("ip daddr { 0.0.0.0/8")  # the range blocks stay, after
    assert output < accept < reject < blocked
    assert 'iifname "fabric0" ip saddr { 10.9.0.1, 10.9.0.3 } accept' in rules
    assert "fabric0" not in netns.ruleset(["192.168.1.5"], [])


@pytest.mark.parametrize(
    ("parent", "where", "said"),
    [
        (None, None, "this node names no fabric parent: set GPULEASE_FABRIC_PARENT"),
        ("gplnone0", "own", "parent interface gplnone0 (GPULEASE_FABRIC_PARENT) is not on"),
        (PARENT, "gplfab-none", "is not on this node in network namespace gplfab-none"),
        ("eth0\nlink delete lo", "own", "is not an interface name"),
    ],
)
def test_a_missing_parent_fails_the_network_with_what_to_set(
    root: Path, fabric: str, parent: str | None, where: str | None, said: str
) -> None:
    parent_netns = fabric if where == "own" else where
    made = netns.InstanceNetwork(
        "m0",
        root,
        fabric=FabricLink(address="10.213.0.9/24", parent=parent, parent_netns=parent_netns),
    )
    started = time.monotonic()
    with pytest.raises(netns.NetworkError, match="GPULEASE_FABRIC") as failed:
        made.ensure()
    made.close()
    assert said in failed.value.message, failed.value.message
    assert time.monotonic() - started < 30
    assert not made.path.exists()  # nothing left behind
    assert links(fabric) == {"lo", PARENT, "gplfab1"}


def test_the_ray_runner_actor_adds_its_nodes_parent_to_the_spec(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'gpulease[ray]'")
    from gpulease.backends.ray import with_node_fabric
    from gpulease.core.templates import get_template
    from gpulease.schemas.runner import RunnerSpec

    plain = RunnerSpec(
        instance_id=7,
        server_url="http://127.0.0.1:1",
        token="t",
        workspace=tmp_path / "w",
        run_dir=tmp_path / "r",
        env_cache=tmp_path / "e",
        template=get_template("python"),
    )
    node = {"GPULEASE_FABRIC_PARENT": "ens5", "GPULEASE_FABRIC_NETNS": ""}
    assert with_node_fabric(plain, node) == plain  # no fabric: as it was
    rank = replace(plain, fabric=FabricLink(address="10.213.0.2/16", peers=("10.213.0.1",)))
    assert rank.fabric is not None
    placed = with_node_fabric(rank, node).fabric
    assert placed == replace(rank.fabric, parent="ens5", parent_netns=None)
    assert with_node_fabric(rank, {}).fabric == rank.fabric  # a node without a parent
