"""The replicated agent directory: which node holds which agent, as Erlang's `pg` keeps its
groups (docs/cluster.md, "The agent directory"). Pure: no clock (`now` and `wall_ms` are passed
in), no I/O; peers are opaque keys.

Each node is the only source of its own entries:

- `observe(held, wall_ms)` compares the agents this node holds now with what it last published
  and returns the `Join`s and `Leave`s to send to every peer, in order.
- `snapshot()` is the full sync a peer gets when its link comes up: `SyncBegin`, a `Join` per
  agent held, `SyncEnd`. The snapshot and the later records travel on one ordered stream, so a
  peer never applies a record older than the snapshot after it.

Each peer's records are applied with `apply(peer, record)`:

- Entries are per (agent, node): a node's `Leave` removes only its own entry, and only when its
  stamp is the one the entry has, so a stale leave never removes a newer join (of the same node,
  after a resync, or of another node).
- A sync is staged and replaces the peer's entries at its `SyncEnd`: lookups never see half of
  a sync.
- `purge(peer, now)` (the link went down): the peer's entries stop being routable but are
  remembered as unreachable, so that its agents answer a retryable `unavailable` instead of
  `not_connected`; they are forgotten at the peer's next sync, when a newer join of the agent
  arrives from anywhere, or `UNREACHABLE_RETENTION_S` after the purge (`expire`).

Stamps order an agent's entries across nodes: a hybrid logical clock in milliseconds, the
greater of the wall clock and one past every stamp this node has seen, so a join made after
another was seen is newer whatever the clocks say, and an agent that moved to a restarted node
is found there first. `candidates(agent)` lists the nodes holding it, newest first: the live
session is tried first, an older one only if the newest says it does not hold the agent.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Final

import attrs

__all__ = [
    "UNREACHABLE_RETENTION_S",
    "AgentDirectory",
    "Join",
    "Leave",
    "Record",
    "SyncBegin",
    "SyncEnd",
]

# How long the entries of a peer whose link went down are remembered (its agents answer
# `unavailable`): long enough for a partition or a restart, short enough that a node removed for
# good stops being named. Its agents that connect elsewhere meanwhile are found there at once.
UNREACHABLE_RETENTION_S: Final = 300.0


@attrs.frozen(slots=True)
class Join:
    agent_id: str
    stamp: int


@attrs.frozen(slots=True)
class Leave:
    """The publisher no longer holds `agent_id`; `stamp` is that of the join it undoes."""

    agent_id: str
    stamp: int


@attrs.frozen(slots=True)
class SyncBegin:
    """A full sync follows: the peer's entries are replaced at `SyncEnd`."""


@attrs.frozen(slots=True)
class SyncEnd:
    pass


Record = Join | Leave | SyncBegin | SyncEnd


@attrs.define(slots=True)
class _Lost:
    since: float
    entries: dict[str, int]


def _newest_first(holders: dict[Hashable, int]) -> tuple[Hashable, ...]:
    return tuple(sorted(holders, key=lambda peer: (holders[peer], repr(peer)), reverse=True))


class AgentDirectory:
    """This node's published agents and every peer's (module doc)."""

    __slots__ = (
        "_by_agent",
        "_clock",
        "_local",
        "_lost",
        "_lost_by_agent",
        "_peers",
        "_staging",
        "_synced",
    )

    def __init__(self) -> None:
        self._clock = 0
        self._local: dict[str, int] = {}
        self._peers: dict[Hashable, dict[str, int]] = {}
        self._staging: dict[Hashable, dict[str, int]] = {}
        self._lost: dict[Hashable, _Lost] = {}
        # agent -> {peer: stamp}: the live entries, indexed for an O(1) lookup per target.
        self._by_agent: dict[str, dict[Hashable, int]] = {}
        # agent -> the unreachable peers that held it.
        self._lost_by_agent: dict[str, set[Hashable]] = {}
        # The peers whose full sync has ended since their link came up.
        self._synced: set[Hashable] = set()

    # -- this node's own agents ----------------------------------------------------------------

    def observe(self, held: Collection[str], wall_ms: int) -> list[Record]:
        """The records that bring the peers from what was published to `held` (module doc)."""
        local = self._local
        records: list[Record] = []
        for agent_id in [a for a in local if a not in held]:
            records.append(Leave(agent_id, local.pop(agent_id)))
        for agent_id in held:
            if agent_id not in local:
                stamp = self._tick(wall_ms)
                local[agent_id] = stamp
                self._forget_lost_older(agent_id, stamp)
                records.append(Join(agent_id, stamp))
        return records

    def snapshot(self) -> list[Record]:
        return [SyncBegin(), *(Join(a, s) for a, s in self._local.items()), SyncEnd()]

    def local_count(self) -> int:
        return len(self._local)

    # -- the peers' records --------------------------------------------------------------------

    def apply(self, peer: Hashable, record: Record) -> None:
        match record:
            case SyncBegin():
                self._staging[peer] = {}
            case SyncEnd():
                staged = self._staging.pop(peer, None)
                if staged is not None:
                    self._replace(peer, staged)
                    self._synced.add(peer)
            case Join(agent_id=agent_id, stamp=stamp):
                self._clock = max(self._clock, stamp)
                staged = self._staging.get(peer)
                if staged is not None:
                    staged[agent_id] = max(stamp, staged.get(agent_id, stamp))
                else:
                    self._join(peer, agent_id, stamp)
            case Leave(agent_id=agent_id, stamp=stamp):
                staged = self._staging.get(peer)
                if staged is not None:
                    if staged.get(agent_id, stamp + 1) <= stamp:
                        del staged[agent_id]
                else:
                    self._leave(peer, agent_id, stamp)

    def purge(self, peer: Hashable, now: float) -> None:
        """The peer's link is down: its entries are unreachable from now (module doc)."""
        self._staging.pop(peer, None)
        self._synced.discard(peer)
        entries = self._drop_live(peer)
        old = self._lost.pop(peer, None)
        if old is not None:
            self._unindex_lost(peer, old.entries)
            entries = {**old.entries, **entries}
        self._lost[peer] = _Lost(now, entries)
        for agent_id in entries:
            self._lost_by_agent.setdefault(agent_id, set()).add(peer)

    def expire(self, now: float) -> None:
        for peer, lost in list(self._lost.items()):
            if lost.since + UNREACHABLE_RETENTION_S <= now:
                del self._lost[peer]
                self._unindex_lost(peer, lost.entries)

    # -- reads ---------------------------------------------------------------------------------

    def candidates(self, agent_id: str) -> tuple[Hashable, ...]:
        """The reachable peers that hold `agent_id`, newest entry first."""
        holders = self._by_agent.get(agent_id)
        return _newest_first(holders) if holders else ()

    def unreachable_holder(self, agent_id: str) -> Hashable | None:
        """An unreachable peer last known to hold `agent_id` (the newest), or None."""
        peers = self._lost_by_agent.get(agent_id)
        if not peers:
            return None
        return max(peers, key=lambda p: (self._lost[p].entries[agent_id], repr(p)))

    def synced(self, peer: Hashable) -> bool:
        """Whether the peer's full sync has ended (its entries are whole) since it came up."""
        return peer in self._synced

    def remote_count(self) -> int:
        return len(self._by_agent)

    def any_unreachable(self) -> bool:
        return bool(self._lost)

    def unreachable_peers(self) -> list[Hashable]:
        return sorted(self._lost, key=repr)

    def broadcast_plan(
        self, held_here: Collection[str]
    ) -> tuple[dict[Hashable, list[str]], dict[Hashable, list[str]]]:
        """A broadcast's remote targets: for each reachable peer the agents whose newest entry is
        its (none held here), and for each unreachable peer the agents known only there."""
        plan: dict[Hashable, list[str]] = {}
        for agent_id, holders in self._by_agent.items():
            if agent_id not in held_here:
                best = _newest_first(holders)[0] if len(holders) > 1 else next(iter(holders))
                plan.setdefault(best, []).append(agent_id)
        lost: dict[Hashable, list[str]] = {peer: [] for peer in self._lost}
        for agent_id in self._lost_by_agent:
            if agent_id not in held_here and agent_id not in self._by_agent:
                best = self.unreachable_holder(agent_id)
                if best is not None:
                    lost[best].append(agent_id)
        return plan, lost

    # -- upkeep --------------------------------------------------------------------------------

    def _tick(self, wall_ms: int) -> int:
        self._clock = max(self._clock + 1, wall_ms)
        return self._clock

    def _join(self, peer: Hashable, agent_id: str, stamp: int) -> None:
        entries = self._peers.setdefault(peer, {})
        if entries.get(agent_id, stamp) > stamp:
            return
        entries[agent_id] = stamp
        self._by_agent.setdefault(agent_id, {})[peer] = stamp
        self._forget_lost_older(agent_id, stamp)

    def _leave(self, peer: Hashable, agent_id: str, stamp: int) -> None:
        entries = self._peers.get(peer)
        if entries is None or entries.get(agent_id, stamp + 1) > stamp:
            return
        del entries[agent_id]
        self._unindex(peer, agent_id)

    def _replace(self, peer: Hashable, staged: dict[str, int]) -> None:
        self._drop_live(peer)
        lost = self._lost.pop(peer, None)
        if lost is not None:
            self._unindex_lost(peer, lost.entries)
        for agent_id, stamp in staged.items():
            self._join(peer, agent_id, stamp)

    def _drop_live(self, peer: Hashable) -> dict[str, int]:
        entries = self._peers.pop(peer, {})
        for agent_id in entries:
            self._unindex(peer, agent_id)
        return entries

    def _unindex(self, peer: Hashable, agent_id: str) -> None:
        holders = self._by_agent.get(agent_id)
        if holders is not None:
            holders.pop(peer, None)
            if not holders:
                del self._by_agent[agent_id]

    def _forget_lost_older(self, agent_id: str, stamp: int) -> None:
        """A newer join of `agent_id` anywhere: an unreachable peer's older entry is stale."""
        peers = self._lost_by_agent.get(agent_id)
        if not peers:
            return
        for peer in [p for p in peers if self._lost[p].entries[agent_id] < stamp]:
            del self._lost[peer].entries[agent_id]
            peers.discard(peer)
        if not peers:
            del self._lost_by_agent[agent_id]

    def _unindex_lost(self, peer: Hashable, entries: dict[str, int]) -> None:
        for agent_id in entries:
            peers = self._lost_by_agent.get(agent_id)
            if peers is not None:
                peers.discard(peer)
                if not peers:
                    del self._lost_by_agent[agent_id]
