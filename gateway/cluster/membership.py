"""Who this node's peers are: the membership policy (pure; the `cluster` actor performs it).

Rules (seed: "Gateway Clustering"):

- Every `interval` a round starts (`Resolve`): the seed list, or the A records of the seed name,
  are read again. No backoff: a round comes every interval whatever the last one found.
- Each address resolved that is not this node is dialled (`Dial`) unless a link to it is up or
  a dial is under way; each link that is up is probed (`Probe`) unless a probe is under way.
  A failed probe or a broken call brings the link down (`lost`); the next round dials again.
- Fail-open: no address, a failed resolution, a refused dial all leave the node serving alone;
  nothing here ever stops the node.
- `max_lifetime_addrs`: at most that many distinct addresses are ever taken on; an address past
  the cap is ignored for the life of the node (`capped` counts them), against a seed name that
  rotates through fresh addresses forever.
- A dial that reaches this node itself (the seed list names it, or the seed name resolves to it)
  marks the address as self, never dialled again and not counted as a peer.
- A link that is up stays up when its address stops resolving: only a failed probe ends it
  (a DNS hiccup must not cut the commands in flight).
- Mid-round, the addresses may change (`retarget`: a host told its cluster ports,
  gateway/cluster/hosts.py): the new ones are dialled at once, not a round later; nothing is
  probed twice in a round.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import attrs

from gateway.config.cluster_seeds import PeerAddr

__all__ = ["Dial", "DialOutcome", "Effect", "Membership", "Probe", "Resolve"]

DialOutcome = Literal["up", "self", "refused", "failed"]


@attrs.frozen
class Resolve:
    """Read the seed list or the seed name now."""


@attrs.frozen
class Dial:
    addr: PeerAddr


@attrs.frozen
class Probe:
    addr: PeerAddr


Effect = Resolve | Dial | Probe


@attrs.define
class Membership:
    interval_s: float
    max_lifetime_addrs: int
    _next_round: float | None = attrs.field(init=False, default=None)
    _resolved: frozenset[PeerAddr] = attrs.field(init=False, factory=frozenset)
    _lifetime: set[PeerAddr] = attrs.field(init=False, factory=set)
    _selves: set[PeerAddr] = attrs.field(init=False, factory=set)
    _connected: set[PeerAddr] = attrs.field(init=False, factory=set)
    _dialing: set[PeerAddr] = attrs.field(init=False, factory=set)
    _probing: set[PeerAddr] = attrs.field(init=False, factory=set)
    capped: int = attrs.field(init=False, default=0)

    @property
    def peers_resolved(self) -> int:
        return len(self._resolved)

    @property
    def peers_connected(self) -> int:
        return len(self._connected)

    def connected(self) -> frozenset[PeerAddr]:
        return frozenset(self._connected)

    def next_round(self) -> float | None:
        return self._next_round

    def tick(self, now: float) -> list[Effect]:
        """A round when one is due (the first at once)."""
        if self._next_round is not None and now < self._next_round:
            return []
        self._next_round = now + self.interval_s
        return [Resolve()]

    def resolved(self, addrs: Iterable[PeerAddr]) -> list[Effect]:
        """The addresses the round read (empty when resolution failed)."""
        effects: list[Effect] = [*self.retarget(addrs)]
        for addr in sorted(self._connected - self._probing):
            self._probing.add(addr)
            effects.append(Probe(addr))
        return effects

    def retarget(self, addrs: Iterable[PeerAddr]) -> list[Dial]:
        """The addresses to dial now instead of the round's: the new ones are dialled."""
        taken: set[PeerAddr] = set()
        for addr in sorted(set(addrs)):
            if addr in self._selves:
                continue
            if addr not in self._lifetime:
                if len(self._lifetime) >= self.max_lifetime_addrs:
                    self.capped += 1
                    continue
                self._lifetime.add(addr)
            taken.add(addr)
        self._resolved = frozenset(taken)
        dials = []
        for addr in sorted(taken - self._connected - self._dialing):
            self._dialing.add(addr)
            dials.append(Dial(addr))
        return dials

    def dialed(self, addr: PeerAddr, outcome: DialOutcome) -> bool:
        """A dial ended; True when the link is now up."""
        self._dialing.discard(addr)
        if outcome == "self":
            self._selves.add(addr)
            self._resolved = self._resolved - {addr}
            return False
        if outcome == "up":
            self._connected.add(addr)
            return True
        return False

    def probed(self, addr: PeerAddr, ok: bool) -> bool:
        """A probe ended; True when that brought the link down."""
        self._probing.discard(addr)
        return False if ok else self.lost(addr)

    def lost(self, addr: PeerAddr) -> bool:
        """A call on the link failed: the link is down (True when it was up)."""
        if addr in self._connected:
            self._connected.discard(addr)
            return True
        return False
