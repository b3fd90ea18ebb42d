"""A job fabric for tests: a named network namespace holding a veth pair, whose end PARENT
stands for a node's fabric NIC (macvlans of it in bridge mode reach each other) and whose
other end PEER_SIDE is the rest of the fabric network (HOST_ADDRESS: a host on the range
that no rank may reach). Names carry a prefix and this process's pid; all goes at exit."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

PARENT = "gplfab0"
PEER_SIDE = "gplfab1"
HOST_ADDRESS = "10.213.0.254"
PREFIX = 24


def namespace_name() -> str:
    """The fabric namespace of this test process (GPULEASE_FABRIC_NETNS of its nodes)."""
    return f"gplfab-{os.getpid()}"


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result.stdout


def links(netns: str) -> set[str]:
    """The interface names in netns."""
    return {
        line.split(":")[1].strip().split("@")[0]
        for line in ip("-o", "link", "show", netns=netns).splitlines()
    }


def make_fabric(name: str) -> None:
    """The fabric namespace name with its veth pair, up, HOST_ADDRESS on PEER_SIDE."""
    remove_fabric(name)
    ip("netns", "add", name)
    ip("link", "add", PARENT, "type", "veth", "peer", "name", PEER_SIDE, netns=name)
    ip("link", "set", PARENT, "up", netns=name)
    ip("link", "set", PEER_SIDE, "up", netns=name)
    ip("address", "add", f"{HOST_ADDRESS}/{PREFIX}", "dev", PEER_SIDE, netns=name)


def remove_fabric(name: str) -> None:
    with contextlib.suppress(RuntimeError):
        ip("netns", "delete", name)


@contextmanager
def fabric_namespace(name: str | None = None) -> Iterator[str]:
    """make_fabric(name) for the block's time; its name."""
    name = name or namespace_name()
    make_fabric(name)
    try:
        yield name
    finally:
        remove_fabric(name)
