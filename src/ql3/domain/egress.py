"""Where a notification may go: the egress policy of webhook (and generic apprise HTTP) channels.

By default a channel may reach only global unicast addresses: loopback, link-local (the cloud metadata
address 169.254.169.254 among them), private and shared ranges, multicast, reserved addresses and the
server's own addresses are refused. ``--notify-allow CIDR|HOST`` opens what an operator chooses.
Pure rules; the resolution and the pinned connection live in ``ql3.notify.egress`` (docs/notifications.md
"Egress policy").
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from ql3.domain.errors import ValidationFailed

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# A DNS name as an operator writes it in --notify-allow (labels of letters, digits and hyphens).
_HOST_RE: Final = re.compile(
    r"^(?=.{1,253}$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*$"
)
MAX_ALLOW_ENTRIES: Final = 64
# apprise plugins whose URL names an arbitrary host (the generic JSON, XML and form posts); the other
# apprise services talk to their own public endpoints.
APPRISE_HOST_SCHEMES: Final = frozenset({"json", "jsons", "xml", "xmls", "form", "forms"})


class EgressRefused(ValidationFailed):
    """The channel's target is refused by the server's egress policy."""

    code = "egress_refused"


def _unmapped(address: Address) -> Address:
    """``::ffff:127.0.0.1`` is 127.0.0.1 (and NAT64/6to4 wrappers are judged by the v6 rules)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def normal_host(host: str) -> str:
    return host.lower().rstrip(".")


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """What an operator opened (``networks``, ``hosts``) and the server's own addresses (``own``,
    refused unless a network opens them)."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()
    own: frozenset[Address] = field(default_factory=frozenset)

    def host_allowed(self, host: str) -> bool:
        """An operator named this host: it is reached whatever it resolves to."""
        return normal_host(host) in self.hosts

    def address_allowed(self, address: Address) -> bool:
        address = _unmapped(address)
        if any(address.version == net.version and address in net for net in self.networks):
            return True
        if address in self.own:
            return False
        return address.is_global and not address.is_multicast

    def with_own(self, addresses: Iterable[Address]) -> EgressPolicy:
        return EgressPolicy(
            networks=self.networks, hosts=self.hosts, own=self.own | {_unmapped(a) for a in addresses}
        )


def parse_allow(entries: Iterable[str]) -> EgressPolicy:
    """``--notify-allow`` values: a CIDR (``10.0.0.0/8``), an address (``127.0.0.1``) or a host name."""
    networks: list[Network] = []
    hosts: set[str] = set()
    for raw in entries:
        entry = raw.strip()
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        host = normal_host(entry)
        if not _HOST_RE.fullmatch(host):
            raise ValidationFailed("a CIDR, an address or a host name", field="--notify-allow")
        hosts.add(host)
    if len(networks) + len(hosts) > MAX_ALLOW_ENTRIES:
        raise ValidationFailed(f"at most {MAX_ALLOW_ENTRIES} entries", field="--notify-allow")
    return EgressPolicy(networks=tuple(networks), hosts=frozenset(hosts))


def literal_address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def target_host(kind: str, url: str) -> str | None:
    """The host a channel's URL makes the server connect to, or None when the policy does not apply
    (an apprise service with its own endpoint)."""
    scheme = url.split("://", 1)[0].lower()
    if kind == "webhook" or (kind == "apprise" and scheme in APPRISE_HOST_SCHEMES):
        try:
            return urlsplit(url).hostname or ""
        except ValueError:
            return ""
    return None


def check_channel_target(policy: EgressPolicy, kind: str, url: str) -> None:
    """At creation, without resolving: a literal address or a ``localhost`` name the policy refuses.
    Names are judged again on every delivery, after resolution (``ql3.notify.egress``)."""
    host = target_host(kind, url)
    if host is None or policy.host_allowed(host):
        return
    address = literal_address(host)
    if address is not None:
        if not policy.address_allowed(address):
            raise EgressRefused()
        return
    name = normal_host(host)
    loopback = name == "localhost" or name.endswith(".localhost")  # RFC 6761: always loopback
    if loopback and not policy.address_allowed(ipaddress.IPv4Address("127.0.0.1")):
        raise EgressRefused()
