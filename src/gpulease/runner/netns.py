"""Each instance's own network: a network namespace behind slirp4netns, firewalled so that
its jobs reach the internet and DNS but not this host, private ranges or cloud metadata.

The runner (root) creates the namespace, loads its nftables rules and starts slirp4netns
before any job enters it. Jobs join it through `nsenter --net` and then run without any
capability, as an unprivileged uid (runner/sandbox.py): the namespace belongs to the host's
user namespace, so nothing in a job can change its routes or its rules.

What a job sees: `tap0` (10.0.2.100/24) with slirp's gateway 10.0.2.2 and DNS forwarder
10.0.2.3; its own loopback. slirp4netns runs with `--disable-host-loopback`, so 10.0.2.2 is
not the host's 127.0.0.1. Its NAT would still reach anything else the host reaches, so the
rules inside the namespace reject, before a packet leaves: the host's own interface
addresses, 0/8, 10/8, 100.64/10 (CGNAT), 127/8, 169.254/16 (link-local and the metadata
service), 172.16/12, 192.168/16, multicast and reserved space, and all of IPv6 but loopback.
DNS is allowed to port 53 of 10.0.2.3 and of the host's own resolvers (which may sit in a
private range), nothing else there.

A rank of a multi-node run on a job fabric (docs/ray.md) also gets the fabric interface
(`fabric0`): a macvlan (mode bridge) of the node's fabric parent NIC, made in the parent's
namespace and moved into this one with the rank's address, after the rules and before any
job. On that interface the rules let through only the addresses of the rank's own gang,
both ways and on any port; every other packet out is refused and every other packet in is
dropped (other gangs, the host, the rest of the range). The macvlan goes with the namespace.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import re
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpulease.runner.cgroups import pid_alive
from gpulease.schemas.runner import FabricLink

log = logging.getLogger(__name__)

NETNS_DIR = Path("/run/gpulease/netns")
TAP_DEVICE = "tap0"
GUEST_ADDRESS = "10.0.2.100"
GATEWAY = "10.0.2.2"
DNS_FORWARDER = "10.0.2.3"
MTU = 65520
READY_TIMEOUT_S = 10.0
# In the namespaces' directory: a probe that succeeded on this boot (probe()).
PROBE_MARK = "probe-ok"
COMMAND_TIMEOUT_S = 20.0
# Never reachable from a job, whatever slirp's NAT could reach.
BLOCKED_RANGES = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/3",
)
_TOOLS = ("slirp4netns", "nft", "unshare", "nsenter", "umount")
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_INSTALL_HINT = "on Debian/Ubuntu: apt-get install slirp4netns nftables util-linux"
_INTERFACE_NAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")


class NetworkError(Exception):
    """An instance's network cannot be set up; the message says why and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def find_tool(name: str) -> str | None:
    """The tool on PATH or in the system directories (a runner's PATH may lack sbin)."""
    path = os.environ.get("PATH", os.defpath) + os.pathsep + _SYSTEM_PATH
    return shutil.which(name, path=path)


# rtnetlink (linux/netlink.h, linux/rtnetlink.h, linux/if_addr.h)
_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, interface index
_RTATTR = struct.Struct("=HH")  # length, type
_NLMSG_ERROR, _NLMSG_DONE, _RTM_NEWADDR, _RTM_GETADDR = 2, 3, 20, 22
_NLM_F_REQUEST, _NLM_F_DUMP, _NLM_F_DUMP_INTR = 0x1, 0x300, 0x10
_NETLINK_TRIES = 3  # dumps interrupted by a change of the addresses are asked again
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_NETLINK_RECV_BYTES = 1 << 18


def host_addresses() -> list[str]:
    """This host's own IPv4 interface addresses, every address of every interface: slirp's
    NAT would reach whatever listens on them, loopback-only or not. Read from the kernel
    over rtnetlink, as `ip -4 addr` reads them (it is asked before each process an instance
    starts: a run, a terminal; starting `ip` took a few milliseconds of each); `ip` itself
    where rtnetlink cannot be used."""
    try:
        return _netlink_addresses()
    except OSError as exc:
        log.warning("reading the host's addresses over rtnetlink failed (%s); asking ip", exc)
        return _ip_addresses()


def _netlink_addresses() -> list[str]:
    """The IPv4 addresses of an RTM_GETADDR dump (each one's IFA_LOCAL, the interface's own
    end: IFA_ADDRESS is the peer's on a point-to-point link; IFA_ADDRESS when it is alone).
    A dump the kernel marks as interrupted (the addresses changed while it was sent) may
    lack one, so it is asked again."""
    for _ in range(_NETLINK_TRIES):
        found = _netlink_dump()
        if found is not None:
            return found
    raise OSError("the address dump was interrupted every time")


def _netlink_dump() -> list[str] | None:
    """One dump's addresses; None when the kernel marked it interrupted."""
    sequence = secrets.randbelow(1 << 31) + 1
    request = _IFADDRMSG.pack(socket.AF_INET, 0, 0, 0, 0)
    header = _NLMSG_HEADER.pack(
        _NLMSG_HEADER.size + len(request), _RTM_GETADDR, _NLM_F_REQUEST | _NLM_F_DUMP, sequence, 0
    )
    addresses: set[str] = set()
    interrupted = False
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(COMMAND_TIMEOUT_S)
        sock.connect((0, 0))  # the kernel
        sock.send(header + request)
        while True:
            data, _ancillary, flags, _sender = sock.recvmsg(_NETLINK_RECV_BYTES)
            if flags & socket.MSG_TRUNC:
                raise OSError("an rtnetlink answer was cut short")
            at = 0
            while at + _NLMSG_HEADER.size <= len(data):
                length, kind, message_flags, seq, _ = _NLMSG_HEADER.unpack_from(data, at)
                if length < _NLMSG_HEADER.size or at + length > len(data):
                    raise OSError("a malformed rtnetlink message")
                body = data[at + _NLMSG_HEADER.size : at + length]
                at += (length + 3) & ~3
                if seq != sequence:
                    continue
                interrupted |= bool(message_flags & _NLM_F_DUMP_INTR)
                if kind == _NLMSG_DONE:
                    return None if interrupted else sorted(addresses)
                if kind == _NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", body) if len(body) >= 4 else (-1,)
                    raise OSError(-code, "rtnetlink refused the address dump")
                if kind == _RTM_NEWADDR and len(body) >= _IFADDRMSG.size:
                    address = _ipv4_of(body)
                    if address is not None:
                        addresses.add(address)


def _ipv4_of(body: bytes) -> str | None:
    """The address an RTM_NEWADDR message body gives (None for any other family)."""
    if body[0] != socket.AF_INET:
        return None
    found: dict[int, bytes] = {}
    at = _IFADDRMSG.size
    while at + _RTATTR.size <= len(body):
        length, kind = _RTATTR.unpack_from(body, at)
        if length < _RTATTR.size or at + length > len(body):
            break
        if kind in (_IFA_ADDRESS, _IFA_LOCAL) and length - _RTATTR.size == 4:
            found[kind] = body[at + _RTATTR.size : at + length]
        at += (length + 3) & ~3
    packed = found.get(_IFA_LOCAL) or found.get(_IFA_ADDRESS)
    return socket.inet_ntoa(packed) if packed else None


def _ip_addresses() -> list[str]:
    """host_addresses() from `ip -j -4 addr`."""
    ip = find_tool("ip")
    if ip is None:
        return []
    try:
        result = subprocess.run(
            [ip, "-j", "-4", "addr"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
        interfaces = json.loads(result.stdout or "[]")
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return []
    addresses = []
    for interface in interfaces:
        for entry in interface.get("addr_info", []):
            local = entry.get("local")
            if isinstance(local, str) and _is_ipv4(local):
                addresses.append(local)
    return sorted(set(addresses))


def host_nameservers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The IPv4 nameservers of resolv.conf: the only private addresses a job may reach,
    and only on port 53."""
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return []
    servers = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver" and _is_ipv4(fields[1]):
            servers.append(fields[1])
    return servers


def sandbox_resolv_conf(resolv_conf: Path = Path("/etc/resolv.conf")) -> str:
    """The resolv.conf jobs get: slirp's DNS forwarder (which asks the host's resolvers,
    loopback ones included), with the host's search domains and options."""
    lines = [f"nameserver {DNS_FORWARDER}"]
    with contextlib.suppress(OSError):
        for line in resolv_conf.read_text().splitlines():
            if line.split()[:1] in (["search"], ["domain"], ["options"]):
                lines.append(line.strip())
    return "\n".join(lines) + "\n"


def ruleset(
    addresses: Iterable[str], nameservers: Iterable[str], fabric: FabricLink | None = None
) -> str:
    """The nftables rules loaded in an instance's namespace (see the module docstring).
    A refused connection is reset at once, so a job fails fast instead of timing out.
    With fabric: on its interface, the gang's peers only, both ways."""
    blocked = ", ".join([*BLOCKED_RANGES, *sorted(set(addresses))])
    dns = ", ".join(sorted({DNS_FORWARDER, *nameservers}))
    fabric_out = fabric_in = ""
    if fabric is not None:
        link = json.dumps(fabric.interface)  # a quoted nft string
        peers = ", ".join(sorted(set(fabric.peers)))
        if peers:
            fabric_out = f"        oifname {link} ip daddr {{ {peers} }} accept\n"
            fabric_in = f"        iifname {link} ip saddr {{ {peers} }} accept\n"
        fabric_out += (
            f"        oifname {link} meta l4proto tcp reject with tcp reset\n"
            f"        oifname {link} reject with icmpx type admin-prohibited\n"
        )
        fabric_in = f"""    chain input {{
        type filter hook input priority 0; policy accept;
{fabric_in}        iifname {link} drop
    }}
"""
    return f"""flush ruleset
table inet gpulease {{
    chain output {{
        type filter hook output priority 0; policy accept;
        oif "lo" accept
{fabric_out}        ip daddr {{ {dns} }} udp dport 53 accept
        ip daddr {{ {dns} }} tcp dport 53 accept
        meta nfproto ipv6 reject with icmpv6 type admin-prohibited
        ip daddr {{ {blocked} }} meta l4proto tcp reject with tcp reset
        ip daddr {{ {blocked} }} reject with icmp type admin-prohibited
    }}
{fabric_in}}}
"""


def _is_ipv4(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False


def _run(argv: Sequence[str], *, stdin: str | None = None) -> None:
    try:
        result = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetworkError(f"{argv[0]} could not be run: {exc}") from exc
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip() or f"exit code {result.returncode}"
        raise NetworkError(f"`{' '.join(argv[:4])}` failed: {detail}")


def _tools() -> dict[str, str]:
    found = {name: find_tool(name) for name in _TOOLS}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise NetworkError(f"{', '.join(missing)} not found; {_INSTALL_HINT}")
    return {name: path for name, path in found.items() if path is not None}


class InstanceNetwork:
    """One instance's network namespace, bound at `path` (NETNS_DIR/NAME-PID, the runner's
    pid, so two runners never share one). ensure() sets it up once, on first use, from any
    thread; enter_args() is what runs a command in it; close() takes it down and is
    idempotent. slirp4netns also exits by itself when the runner dies (its --exit-fd is a
    pipe only the runner holds), so no process outlives the runner; a namespace file left by
    a dead runner is removed by the next ensure() on the host."""

    def __init__(self, name: str, root: Path = NETNS_DIR, fabric: FabricLink | None = None) -> None:
        self.name = name
        self.root = root
        self.fabric = fabric
        self.path = root / f"{name}-{os.getpid()}"
        self.resolv_conf = root / f"{name}-{os.getpid()}.resolv.conf"
        self._lock = threading.Lock()
        self._slirp: subprocess.Popen[bytes] | None = None
        self._exit_write = -1
        self._ready = False
        self._closed = False
        self._addresses: list[str] = []  # the host addresses the rules refuse now

    def enter_args(self) -> list[str]:
        """The argv prefix that runs a command in this namespace (set up first if need be);
        NetworkError when it cannot be."""
        self.ensure()
        nsenter = find_tool("nsenter") or "nsenter"
        return [nsenter, f"--net={self.path}", "--"]

    def ensure(self) -> None:
        with self._lock:
            if self._closed:
                raise NetworkError("the instance is stopping: its network is closed")
            if self._ready:
                self._refresh_rules()
                return
            try:
                self._create()
            except BaseException:
                self._teardown()
                raise
            self._ready = True

    def _create(self) -> None:
        if os.geteuid() != 0:
            raise NetworkError(
                "the runner is not root, so it cannot give each instance a network namespace "
                "of its own; run the server as root"
            )
        tools = _tools()
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            _remove_stale(self.root, tools["umount"])
            self.path.unlink(missing_ok=True)
            self.path.touch(mode=0o600)
            self.resolv_conf.write_text(sandbox_resolv_conf())
            self.resolv_conf.chmod(0o644)
        except OSError as exc:
            raise NetworkError(
                f"{self.root} cannot hold network namespaces ({exc}); it must be a writable "
                "local directory, such as the default /run/gpulease/netns"
            ) from exc
        _run([tools["unshare"], f"--net={self.path}", "true"])
        self._load_rules(host_addresses())
        if self.fabric is not None:
            attach_fabric(self.fabric, self.path)
        self._start_slirp(tools["slirp4netns"])
        log.info("network %s is up (slirp4netns pid %d)", self.path, self._pid())

    def _load_rules(self, addresses: list[str]) -> None:
        """Replace the namespace's rules at once (`flush ruleset` and the new table are one
        nft transaction: there is no moment without rules)."""
        rules = ruleset(addresses, host_nameservers(), self.fabric)
        nft = find_tool("nft") or "nft"
        nsenter = find_tool("nsenter") or "nsenter"
        _run([nsenter, f"--net={self.path}", "--", nft, "-f", "-"], stdin=rules)
        self._addresses = addresses

    def _refresh_rules(self) -> None:
        """Before each new process: refuse the host's addresses as they are now (one added
        since the network came up, a new interface's, must not stay reachable)."""
        addresses = host_addresses()
        if addresses != self._addresses:
            log.info("the host's addresses changed; reloading the rules of %s", self.path)
            self._load_rules(addresses)

    def _pid(self) -> int:
        return self._slirp.pid if self._slirp is not None else 0

    def _start_slirp(self, slirp: str) -> None:
        with tempfile.TemporaryFile() as errors:
            exit_read, self._exit_write = os.pipe()
            ready_read, ready_write = os.pipe()
            try:
                self._slirp = subprocess.Popen(
                    [
                        slirp,
                        "--configure",
                        f"--mtu={MTU}",
                        "--disable-host-loopback",
                        f"--exit-fd={exit_read}",
                        f"--ready-fd={ready_write}",
                        "--netns-type=path",
                        str(self.path),
                        TAP_DEVICE,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    pass_fds=(exit_read, ready_write),
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                os.close(ready_read)
                raise NetworkError(f"slirp4netns could not be started: {exc}") from exc
            finally:
                os.close(exit_read)
                os.close(ready_write)
            try:
                ready, _, _ = select.select([ready_read], [], [], READY_TIMEOUT_S)
                answer = os.read(ready_read, 1) if ready else b""
            finally:
                os.close(ready_read)
            if answer != b"1":
                self._stop_slirp()
                errors.seek(0)
                detail = errors.read().decode(errors="replace").strip()[-500:]
                raise NetworkError(f"slirp4netns did not come up: {detail or 'no output'}")

    def close(self) -> None:
        """Kill every process still in the namespace, stop slirp4netns and remove the
        namespace's file."""
        with self._lock:
            self._closed = True
            if self._ready:
                kill_members(self.path)
            self._teardown()

    def _teardown(self) -> None:
        self._stop_slirp()
        self._ready = False
        umount = find_tool("umount")
        if umount is not None and self.path.exists():
            with contextlib.suppress(NetworkError):
                _run([umount, "--lazy", str(self.path)])
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.resolv_conf.unlink(missing_ok=True)

    def _stop_slirp(self) -> None:
        if self._exit_write >= 0:
            os.close(self._exit_write)  # slirp4netns exits on its own when this closes
            self._exit_write = -1
        if self._slirp is not None and self._slirp.poll() is None:
            try:
                self._slirp.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._slirp.kill()
                self._slirp.wait()


def attach_fabric(fabric: FabricLink, namespace: Path) -> None:
    """Give the namespace bound at `namespace` its fabric interface: a macvlan (mode bridge)
    of fabric.parent, made in the parent's namespace under a name of this runner's own,
    moved in, renamed to fabric.interface and brought up with fabric.address. NetworkError
    (the rank does not start) when the node names no parent or has no such interface."""
    if not fabric.parent:
        raise NetworkError(
            "this rank's multi-node run talks over the job fabric, but this node names no "
            "fabric parent: set GPULEASE_FABRIC_PARENT (the interface of the cluster's "
            "private network) in the environment of `ray start` on this node"
        )
    if not _INTERFACE_NAME.fullmatch(fabric.parent):
        raise NetworkError(
            f"GPULEASE_FABRIC_PARENT={fabric.parent!r} is not an interface name (1 to 15 "
            "letters, digits and ._-:@); set it to the node's fabric NIC"
        )
    if any(character.isspace() for character in str(namespace)):
        raise NetworkError(f"{namespace} holds a space: keep the namespaces' directory without")
    ip = find_tool("ip")
    if ip is None:
        raise NetworkError("ip not found; on Debian/Ubuntu: apt-get install iproute2")
    outside = [ip, "-n", fabric.parent_netns] if fabric.parent_netns else [ip]
    made = f"gf{secrets.token_hex(6)}"  # no other runner's, 15 characters at most
    try:  # one `ip -batch` each side: it stops at the first command that fails
        _run(
            [*outside, "-batch", "-"],
            stdin=f"link add link {fabric.parent} name {made} type macvlan mode bridge\n"
            f"link set {made} netns {namespace}\n",
        )
    except NetworkError as exc:
        with contextlib.suppress(NetworkError):  # made but not moved
            _run([*outside, "link", "delete", made])
        raise _fabric_error(fabric, outside, exc) from exc
    nsenter = find_tool("nsenter") or "nsenter"
    _run(
        [nsenter, f"--net={namespace}", "--", ip, "-batch", "-"],
        stdin=f"link set {made} name {fabric.interface}\n"
        f"address add {fabric.address} dev {fabric.interface}\n"
        f"link set {fabric.interface} up\n",
    )
    log.info(
        "fabric %s (%s on %s) is up in %s",
        fabric.interface,
        fabric.address,
        fabric.parent,
        namespace,
    )


def _fabric_error(fabric: FabricLink, outside: list[str], failed: NetworkError) -> NetworkError:
    """Why the macvlan could not be made, in words: most often the parent is not there."""
    where = f" in network namespace {fabric.parent_netns}" if fabric.parent_netns else ""
    try:
        _run([*outside, "link", "show", "dev", str(fabric.parent)])
    except NetworkError as exc:
        return NetworkError(
            f"the job fabric's parent interface {fabric.parent} (GPULEASE_FABRIC_PARENT) is "
            f"not on this node{where}: {exc.message}; set GPULEASE_FABRIC_PARENT (and "
            "GPULEASE_FABRIC_NETNS) of this node to its fabric NIC"
        )
    return NetworkError(
        f"the job fabric's interface could not be made on {fabric.parent}{where}: {failed.message}"
    )


def kill_members(namespace: Path, proc: Path = Path("/proc")) -> int:
    """SIGKILL every process whose network namespace is the one bound at namespace; how
    many were signalled."""
    try:
        target = os.stat(namespace)
    except OSError:
        return 0
    killed = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            info = os.stat(entry / "ns" / "net")
        except OSError:
            continue  # gone meanwhile, or a kernel thread
        if (info.st_dev, info.st_ino) == (target.st_dev, target.st_ino):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    if killed:
        log.warning("killed %d process(es) left in %s", killed, namespace)
    return killed


def _remove_stale(root: Path, umount: str) -> None:
    """Namespace files of runners that are gone (NAME-PID with PID dead)."""
    for entry in root.iterdir():
        stem = entry.name.removesuffix(".resolv.conf")
        _, _, pid = stem.rpartition("-")
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        if not entry.name.endswith(".resolv.conf"):
            with contextlib.suppress(NetworkError):
                _run([umount, "--lazy", str(entry)])
        with contextlib.suppress(OSError):
            entry.unlink()


def probe(root: Path = NETNS_DIR) -> str | None:
    """None when an instance network can be set up here (one is made and taken down);
    otherwise why not, in words, with what to do.

    A success is kept for the rest of the host's boot in root's PROBE_MARK (root's own
    directory, 0700: no job reaches it), with the tools it used: a later probe with the same
    boot and tools answers at once. Nothing rests on the mark but this answer: every
    instance still makes and checks its own network, and fails with its reason if it
    cannot."""
    mark = root / PROBE_MARK
    key = _probe_key()
    if key is not None:
        with contextlib.suppress(OSError):
            if mark.read_text() == key:
                return None
    network = InstanceNetwork(f"probe{time.monotonic_ns()}", root)
    try:
        network.ensure()
    except NetworkError as exc:
        return exc.message
    finally:
        network.close()
    if key is not None:
        with contextlib.suppress(OSError):
            partial = root / f"{PROBE_MARK}.{os.getpid()}"
            partial.write_text(key)
            partial.chmod(0o600)
            partial.replace(mark)
    return None


def _probe_key(boot_id: Path = Path("/proc/sys/kernel/random/boot_id")) -> str | None:
    """What a kept probe result holds for: this boot, this uid and the tools' paths and
    change times. None when it cannot be told (then every probe makes its network)."""
    try:
        found = [f"boot {boot_id.read_text().strip()}", f"uid {os.geteuid()}"]
        for name, path in sorted(_tools().items()):
            found.append(f"{name} {path} {os.stat(path).st_mtime_ns}")
    except (OSError, NetworkError):
        return None
    return "\n".join(found) + "\n"
