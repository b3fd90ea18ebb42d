"""The host's own addresses, which an instance's rules refuse: read over rtnetlink, as `ip`
reads them, every address of every interface."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys

import pytest

from gpulease.runner import netns

# In a network namespace of its own: two addresses on one interface (the second is a
# secondary one), a point-to-point address (its peer is not ours) and 1,000 more, which the
# kernel sends over several answers; then both readers' results.
IN_NAMESPACE = """
import json, subprocess
from gpulease.runner import netns
batch = ["link set lo up", "link add d0 type veth peer name d1", "link set d0 up",
         "addr add 10.9.0.1/24 dev d0", "addr add 10.9.0.2/24 dev d0",
         "addr add 10.9.1.1 peer 10.9.1.2 dev d0", "addr add 2001:db8::1/64 dev d0"]
batch += [f"addr add 10.8.{i // 250}.{i % 250 + 1}/32 dev d0" for i in range(1000)]
subprocess.run(["ip", "-batch", "-"], input="\\n".join(batch), text=True, check=True)
print(json.dumps([netns._netlink_addresses(), netns._ip_addresses()]))
"""


def test_every_address_of_the_namespace_is_read_as_ip_reads_it() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("needs root, ip and unshare to give the test a network namespace")
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", IN_NAMESPACE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    from_netlink, from_ip = json.loads(done.stdout)
    expected = {"127.0.0.1", "10.9.0.1", "10.9.0.2", "10.9.1.1"}
    expected |= {f"10.8.{i // 250}.{i % 250 + 1}" for i in range(1000)}
    assert from_netlink == sorted(expected) == from_ip
    assert "10.9.1.2" not in from_netlink  # the point-to-point peer


def _attribute(kind: int, data: bytes) -> bytes:
    header = struct.pack("=HH", 4 + len(data), kind)
    return header + data + b"\0" * (-len(data) % 4)


def _message(family: int, *attributes: bytes) -> bytes:
    return struct.pack("=BBBBI", family, 24, 0, 0, 2) + b"".join(attributes)


def test_an_address_message_gives_its_own_end_and_nothing_for_other_families() -> None:
    local, peer = socket.inet_aton("10.1.1.1"), socket.inet_aton("10.1.1.2")
    both = _message(socket.AF_INET, _attribute(1, peer), _attribute(2, local))
    assert netns._ipv4_of(both) == "10.1.1.1"
    assert netns._ipv4_of(_message(socket.AF_INET, _attribute(1, peer))) == "10.1.1.2"
    assert netns._ipv4_of(_message(socket.AF_INET6, _attribute(1, b"\0" * 16))) is None
    assert netns._ipv4_of(_message(socket.AF_INET)) is None
    cut = _message(socket.AF_INET, _attribute(2, local))[:-2]  # its attribute cut short
    assert netns._ipv4_of(cut) is None


def test_without_rtnetlink_ip_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> list[str]:
        raise PermissionError("netlink is not allowed here")

    monkeypatch.setattr(netns, "_netlink_addresses", refused)
    monkeypatch.setattr(netns, "_ip_addresses", lambda: ["192.0.2.9"])
    assert netns.host_addresses() == ["192.0.2.9"]


def test_an_interrupted_dump_is_asked_again_and_then_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[list[str] | None] = [None, None, ["10.0.0.7"]]
    monkeypatch.setattr(netns, "_netlink_dump", lambda: answers.pop(0))
    assert netns.host_addresses() == ["10.0.0.7"] and answers == []
    monkeypatch.setattr(netns, "_netlink_dump", lambda: None)
    monkeypatch.setattr(netns, "_ip_addresses", lambda: ["192.0.2.9"])
    assert netns.host_addresses() == ["192.0.2.9"]
