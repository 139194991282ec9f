"""Which nodes of each host to dial, from what each host advertised (pure; docs/cluster.md,
"Hosts with different node counts").

A seed entry without a port, like an A record of the seed name, names a host, and how many
nodes a host runs is its own business (`--nodes auto` gives hosts with different core counts
different counts). So every node tells each node that dials it the cluster ports of its host
(`HostAdvert`, in its answer to the challenge, proven with the cookie: gateway/cluster/auth.py,
transport.py), and `HostPlan` turns the discovery's targets into addresses:

- a host is dialled on every port it advertised, plus the configured `cluster_port` (this
  host's first port: where the seed says a node is, whatever an advert said since); before any
  node of it has answered, on this host's own ports, as every node did before adverts existed;
- a host that says fewer nodes is dialled on fewer ports: an advert replaces every range it
  overlaps (a host may run several releases on ranges of their own, each kept);
- a `host:port` entry is that one node, as the operator wrote it: the nodes its host
  advertises on no entry are not dialled, and `gaps` names them (a partial mesh);
- a peer that answers with no advert (a gateway from before adverts) leaves its host on this
  host's ports; `unadvertised` says so once per host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import attrs

from gateway.config.cluster_seeds import MAX_PORT, PeerAddr

__all__ = ["HostAdvert", "HostPlan", "Target", "port_list"]

# What discovery names: one node (`host:port`) or a host (every node it runs).
Target = PeerAddr | str
_ADVERT = re.compile(r"([0-9]{1,5})\+([0-9]{1,5})")


@attrs.frozen(order=True)
class HostAdvert:
    """A node's host runs `count` nodes on the cluster ports `first` .. `first + count - 1`."""

    first: int
    count: int

    @property
    def ports(self) -> range:
        return range(self.first, self.first + self.count)

    def overlaps(self, other: HostAdvert) -> bool:
        return self.first <= other.ports[-1] and other.first <= self.ports[-1]

    def encode(self) -> str:
        return f"{self.first}+{self.count}"

    @classmethod
    def decode(cls, text: str) -> HostAdvert | None:
        """`first+count`, or None when malformed or out of range."""
        match = _ADVERT.fullmatch(text)
        if match is None:
            return None
        # A count is bounded by the ports only: what is dialled, by cluster_max_lifetime_addrs.
        advert = cls(int(match[1]), int(match[2]))
        if advert.first < 1 or advert.count < 1 or advert.ports[-1] > MAX_PORT:
            return None
        return advert


def port_list(ports: Iterable[int]) -> str:
    """`9100..9103, 9105`: consecutive ports as runs."""
    runs: list[list[int]] = []
    for port in sorted(set(ports)):
        if runs and runs[-1][-1] == port - 1:
            runs[-1].append(port)
        else:
            runs.append([port])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}..{r[-1]}" for r in runs)


@attrs.define
class HostPlan:
    """The adverts this node has learned, per host name as its discovery names the host."""

    own_ports: tuple[int, ...]
    _adverts: dict[str, set[HostAdvert]] = attrs.field(init=False, factory=dict)
    _silent: set[str] = attrs.field(init=False, factory=set)
    _gaps: dict[str, tuple[int, ...]] = attrs.field(init=False, factory=dict)

    def learn(self, addr: PeerAddr, advert: HostAdvert) -> bool:
        """The node at `addr` advertised its host: True when that host's ports changed. An
        advert that does not cover the port it was reached on is not this node's host (a port
        translated on the way) and is ignored."""
        if addr.port not in advert.ports:
            return False
        before = self.advertised(addr.host)
        known = self._adverts.setdefault(addr.host, set())
        known -= {a for a in known if a.overlaps(advert)}
        known.add(advert)
        return self.advertised(addr.host) != before

    def unadvertised(self, host: str) -> bool:
        """A node of `host` answered with no advert: True the first time for that host."""
        if host in self._silent:
            return False
        self._silent.add(host)
        return True

    def advertised(self, host: str) -> frozenset[int]:
        return frozenset(p for advert in self._adverts.get(host, ()) for p in advert.ports)

    def ports_of(self, host: str) -> tuple[int, ...]:
        """The ports a host target is dialled on (module doc)."""
        advertised = self.advertised(host)
        if not advertised:
            return self.own_ports
        return tuple(sorted(advertised | {self.own_ports[0]}))

    def addresses(self, targets: Iterable[Target]) -> list[PeerAddr]:
        """Every address the targets name, in their order, each once."""
        found: dict[PeerAddr, None] = {}
        for target in targets:
            if isinstance(target, PeerAddr):
                found[target] = None
            else:
                found.update(dict.fromkeys(PeerAddr(target, p) for p in self.ports_of(target)))
        return list(found)

    def gaps(self, dialled: Iterable[PeerAddr]) -> dict[str, tuple[int, ...]]:
        """Each advertised host `dialled` names with nodes it leaves out: their ports. A host
        it does not name at all (gone from the discovery) has none: nothing names it."""
        by_host: dict[str, set[int]] = {}
        for addr in dialled:
            by_host.setdefault(addr.host, set()).add(addr.port)
        gaps = {
            host: tuple(sorted(self.advertised(host) - ports))
            for host, ports in by_host.items()
            if host in self._adverts
        }
        return {host: missing for host, missing in gaps.items() if missing}

    def report(self, dialled: Iterable[PeerAddr]) -> dict[str, tuple[int, ...]]:
        """The gaps of `dialled` (kept for `current_gaps`), those not reported as they are yet
        (to be said once each; a gap that closes and opens again is said again)."""
        previous, self._gaps = self._gaps, self.gaps(dialled)
        return {h: m for h, m in self._gaps.items() if previous.get(h) != m}

    def current_gaps(self) -> Mapping[str, tuple[int, ...]]:
        return self._gaps

    def status(self) -> dict[str, str]:
        """Each advertised host's ports, for the console."""
        return {host: port_list(self.advertised(host)) for host in sorted(self._adverts)}
