"""The values of a listener's `origin` option: its mode and the proxies it trusts (seed:
"Client addresses behind a proxy").

Addresses are bare IPs; IPv4-mapped IPv6 addresses are folded to IPv4, in peers, claims and
`sources` alike, so a source written either way matches a peer seen either way. The rules that
use these values on each call are gateway/listeners/origin.py.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable

import attrs

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class Mode(enum.Enum):
    """Whose word names the client: the TCP peer, a PROXY header or x-forwarded-for."""

    TRANSPORT = "transport"
    PROXY_PROTOCOL = "proxy_protocol"
    FORWARDED_FOR = "forwarded_for"


def fold(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address (::ffff:a.b.c.d) as the IPv4 address it carries."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


_MAPPED_V4 = ipaddress.IPv6Network("::ffff:0:0/96")


class MappedPrefixTooShort(ValueError):
    """An IPv4-mapped source network with a prefix of 96 or less: it would be all of IPv4
    (or more), which is never what an operator means by one proxy's address."""


def fold_network(network: IPNetwork) -> IPNetwork:
    """A network written in IPv4-mapped form as the IPv4 network it covers."""
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_MAPPED_V4):
        if network.prefixlen <= 96:
            raise MappedPrefixTooShort(str(network))
        v4 = ipaddress.IPv6Address(int(network.network_address)).ipv4_mapped
        assert v4 is not None
        return ipaddress.IPv4Network((v4, network.prefixlen - 96))
    if (
        isinstance(network, ipaddress.IPv6Network)
        and network.prefixlen <= 96
        and _MAPPED_V4.subnet_of(network)
    ):
        # A wider IPv6 network that contains the mapped range would trust every IPv4 peer
        # once peers are folded: refused for the same reason.
        raise MappedPrefixTooShort(str(network))
    return network


@attrs.frozen
class Sources:
    """The proxies a listener trusts, as its socket sees them: single addresses (a set, so
    the common case is one hash lookup) and networks."""

    addresses: frozenset[IPAddress] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def of(cls, items: Iterable[IPAddress | IPNetwork]) -> Sources:
        addresses: set[IPAddress] = set()
        networks: list[IPNetwork] = []
        for item in items:
            if isinstance(item, ipaddress.IPv4Address | ipaddress.IPv6Address):
                addresses.add(fold(item))
            else:
                folded = fold_network(item)
                if folded.num_addresses == 1:
                    addresses.add(folded.network_address)
                else:
                    networks.append(folded)
        return cls(frozenset(addresses), tuple(networks))

    def __len__(self) -> int:
        return len(self.addresses) + len(self.networks)

    def trusts(self, peer: str) -> bool:
        """Is the (folded, bare) TCP peer address one of the sources?"""
        try:
            address = fold(ipaddress.ip_address(peer))
        except ValueError:
            return False
        if address in self.addresses:
            return True
        return any(
            address.version == network.version and address in network for network in self.networks
        )
