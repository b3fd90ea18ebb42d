"""Where a webhook may be sent: public addresses only, so that a URL cannot reach the server's
own ports, its private network or a cloud metadata service (SSRF).

A URL is checked when it is saved and again, after a fresh resolution, before every
delivery; the delivery connects to the very address that was checked (no DNS rebinding
between check and connect). An operator may allow private targets for an intranet
receiver (GPULEASE_WEBHOOK_ALLOW_PRIVATE); metadata, unspecified and multicast addresses
stay refused even then.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from gpulease.core.errors import InvalidInput

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Cloud metadata services (AWS, GCP, Azure, OpenStack; AWS's IPv6 one; Alibaba's).
METADATA = {
    ipaddress.ip_address("169.254.169.254"),
    ipaddress.ip_address("fd00:ec2::254"),
    ipaddress.ip_address("100.100.100.200"),
}
NAT64 = ipaddress.ip_network("64:ff9b::/96")
PRIVATE_HINT = "GPULEASE_WEBHOOK_ALLOW_PRIVATE"


class AddressRefused(InvalidInput):
    """A webhook host that is, or resolves to, an address this server does not send to."""


def embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (IPv4-mapped, 6to4, Teredo, NAT64), if any."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def why_refused(address: Address, *, allow_private: bool) -> str | None:
    """None when a webhook may be sent to `address`, else what kind of address it is."""
    inner = embedded_ipv4(address)
    if inner is not None:
        return why_refused(inner, allow_private=allow_private)
    if address in METADATA:
        return "a cloud metadata address"
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_global:
        return None
    if allow_private and (address.is_private or address.is_loopback or address.is_link_local):
        return None
    if address.is_loopback:
        return "a loopback address (this server itself)"
    if address.is_link_local:
        return "a link-local address"
    return "a private or reserved address"


def resolve(host: str, port: int) -> list[Address]:
    """Every address `host` stands for: itself when it is a literal, else what DNS says.
    OSError when the name does not resolve."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    addresses: list[Address] = []
    for text in lookup(host, port):
        address = ipaddress.ip_address(text.split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


def lookup(host: str, port: int) -> list[str]:
    """DNS (the system resolver): the addresses of a name, as text."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(sockaddr[0]) for _family, _type, _proto, _name, sockaddr in found]


def host_and_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    return host, parts.port or (443 if parts.scheme == "https" else 80)


def refuse_unsafe(host: str, addresses: list[Address], *, allow_private: bool) -> None:
    """AddressRefused (422) naming the first address a webhook may not go to."""
    for address in addresses:
        reason = why_refused(address, allow_private=allow_private)
        if reason is not None:
            shown = host if host == str(address) else f"{host} ({address})"
            hint = (
                ""
                if allow_private or reason.startswith(("a cloud", "an unspec", "a multi"))
                else f"; an operator can allow intranet receivers with {PRIVATE_HINT}"
            )
            raise AddressRefused(
                f"webhooks cannot be sent to {shown}: it is {reason}. Give a public "
                f"address, e.g. https://hooks.example.com/gpulease{hint}"
            )


def check_saved_url(url: str, *, allow_private: bool) -> None:
    """At save time: refuse a host that is, or now resolves to, a forbidden address. A name
    that does not resolve yet is accepted; every delivery resolves and checks it again."""
    host, port = host_and_port(url)
    name = host.lower().rstrip(".")  # "localhost." is localhost too
    local = name == "localhost" or name.endswith(".localhost")
    if local and not allow_private:
        raise AddressRefused(
            f"webhooks cannot be sent to {host}: it is this server itself. Give a public "
            f"address; an operator can allow intranet receivers with {PRIVATE_HINT}"
        )
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError):
        return
    refuse_unsafe(host, addresses, allow_private=allow_private)


def pinned_address(url: str, *, allow_private: bool) -> Address:
    """At delivery: the address to connect to (resolved now, checked). AddressRefused when
    it may not be used, OSError when the name does not resolve."""
    host, port = host_and_port(url)
    addresses = resolve(host, port)
    if not addresses:
        raise OSError(f"{host} has no address")
    refuse_unsafe(host, addresses, allow_private=allow_private)
    return addresses[0]
