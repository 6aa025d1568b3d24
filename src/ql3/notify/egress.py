"""The egress policy at send time: resolve the target's host, refuse when any address it resolves to is
refused, and connect to the address that was checked (so a second, different DNS answer cannot slip a
loopback or metadata address in between the check and the connection). docs/notifications.md.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from urllib.parse import SplitResult, urlsplit, urlunsplit

from ql3.domain.egress import Address, EgressPolicy, literal_address
from ql3.domain.notifications import DeliveryFailed

REFUSED = "refused"


def resolve(host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to (a literal address is itself)."""
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise DeliveryFailed("dns_error") from exc
    found: list[Address] = []
    for info in infos:
        address = literal_address(str(info[4][0]))
        if address is not None and address not in found:
            found.append(address)
    if not found:
        raise DeliveryFailed("dns_error")
    return found


def checked_address(policy: EgressPolicy, host: str, port: int) -> Address:
    """The address to connect to: the first one ``host`` resolves to, when the policy allows every one
    of them (or the operator opened the host by name). Refused: ``DeliveryFailed("refused")``, which
    says nothing of what the name resolved to."""
    addresses = resolve(host, port)
    if policy.host_allowed(host):
        return addresses[0]
    if not all(policy.address_allowed(a) for a in addresses):
        raise DeliveryFailed(REFUSED)
    return addresses[0]


def default_port(parts: SplitResult) -> int:
    try:
        port = parts.port
    except ValueError as exc:
        raise DeliveryFailed("invalid_url") from exc
    return port if port is not None else (443 if parts.scheme == "https" else 80)


def pinned_url(parts: SplitResult, address: Address) -> str:
    """``parts`` with its host replaced by ``address`` (userinfo, port, path and query kept)."""
    shown = f"[{address}]" if address.version == 6 else str(address)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (userinfo + "@" if userinfo else "") + shown + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def host_header(parts: SplitResult) -> str:
    return parts.netloc.rpartition("@")[2]


def check_url(policy: EgressPolicy, url: str) -> None:
    """The policy for a URL that another library connects to (apprise): resolve and judge only."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise DeliveryFailed("invalid_url") from exc
    if not parts.hostname:
        raise DeliveryFailed("invalid_url")
    checked_address(policy, parts.hostname, default_port(parts))


def own_addresses(extra_hosts: Iterable[str] = ()) -> list[Address]:
    """This host's addresses as its name resolves (and any listen host given): refused targets, since a
    webhook to the server itself would reach its API from inside."""
    found: list[Address] = []
    for host in [socket.gethostname(), *extra_hosts]:  # no getfqdn: a reverse lookup can hang
        literal = literal_address(host)
        if literal is not None:
            if not literal.is_unspecified:
                found.append(literal)
            continue
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            continue  # a host name that does not resolve adds nothing
        for info in infos:
            address = literal_address(str(info[4][0]))
            if address is not None:
                found.append(address)
    return found
