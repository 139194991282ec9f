"""One command forwarded to the nodes that hold its targets: whose word settles each target
(pure; docs/cluster.md, "Commands across the cluster").

The `cluster` actor gives each target its candidates, the reachable peers the agent directory
(actors/core/agent_directory.py) says hold it, newest entry first. The rules:

- A target is sent to its first candidate only (`Send`: one frame per peer and wave, never to
  every peer). Only the peer it was last sent to (its route) speaks for it: a frame of any other
  route is stale and dropped, so an old session's answer never overrides the live one's.
- That peer's frames are passed on as they come; its first terminal frame settles the target.
- The peer says it does not hold the target (`held=False`: the agent left it, or it is in its
  planned stop and refuses only what it holds): the next candidate is tried (a new wave); with
  none left the target is settled `unavailable` when an unreachable peer is known to hold it,
  else `not_connected`.
- A target with no reachable candidate is settled at once the same way (`unavailable` is
  retryable: nothing was sent).
- A route that ends before the target's terminal frame (the peer's router ended, its link
  broke) settles the target `agent_disconnected`: the peer may have delivered the command, so it
  is not retried elsewhere.

No protobuf, no clock: peers are opaque keys, targets agent ids, a route is (peer, wave).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from typing import Literal

import attrs

__all__ = ["Answer", "Fail", "FailReason", "MergeEffect", "RemoteMerge", "Route", "Send"]

FailReason = Literal["not_connected", "agent_disconnected", "unavailable"]
Route = tuple[Hashable, int]


@attrs.frozen
class Answer:
    """Pass the route's frame of `agent_id` on; `final` when it is its terminal answer."""

    agent_id: str
    final: bool


@attrs.frozen
class Fail:
    agent_id: str
    reason: FailReason


@attrs.frozen
class Send:
    """Forward the command for `agent_ids` to `peer`, as wave `wave` (its own route)."""

    peer: Hashable
    wave: int
    agent_ids: tuple[str, ...]


MergeEffect = Answer | Fail | Send


@attrs.define(slots=True)
class _Target:
    candidates: list[Hashable]
    route: Route | None = None


class RemoteMerge:
    def __init__(
        self, candidates: Mapping[str, Sequence[Hashable]], lost: Collection[str] = ()
    ) -> None:
        self._targets = {agent: _Target(list(peers)) for agent, peers in candidates.items()}
        self._lost = frozenset(lost)
        self._wave = 0

    @property
    def done(self) -> bool:
        return not self._targets

    def owing(self) -> frozenset[str]:
        return frozenset(self._targets)

    def routes(self) -> frozenset[Route]:
        return frozenset(t.route for t in self._targets.values() if t.route is not None)

    def start(self) -> list[MergeEffect]:
        """Every target to its first candidate, one `Send` per peer."""
        return self._advance(list(self._targets))

    def frame(self, route: Route, agent_id: str, held: bool, final: bool) -> list[MergeEffect]:
        target = self._targets.get(agent_id)
        if target is None or target.route != route:
            return []
        if held:
            if final:
                del self._targets[agent_id]
            return [Answer(agent_id, final)]
        return self._advance([agent_id])

    def ended(self, route: Route) -> list[MergeEffect]:
        """The route has no more word: what it owes is settled `agent_disconnected`."""
        return self._lose(lambda r: r == route)

    def peer_ended(self, peer: Hashable) -> list[MergeEffect]:
        """The peer's link is down: every route to it has ended."""
        return self._lose(lambda r: r[0] == peer)

    def _lose(self, matches: Callable[[Route], bool]) -> list[MergeEffect]:
        effects: list[MergeEffect] = []
        for agent_id, target in list(self._targets.items()):
            if target.route is not None and matches(target.route):
                del self._targets[agent_id]
                effects.append(Fail(agent_id, "agent_disconnected"))
        return effects

    def _advance(self, agent_ids: list[str]) -> list[MergeEffect]:
        """Each target to its next candidate, grouped by peer in a new wave; or settled."""
        effects: list[MergeEffect] = []
        groups: dict[Hashable, list[str]] = {}
        for agent_id in agent_ids:
            target = self._targets[agent_id]
            if not target.candidates:
                del self._targets[agent_id]
                reason: FailReason = "unavailable" if agent_id in self._lost else "not_connected"
                effects.append(Fail(agent_id, reason))
                continue
            groups.setdefault(target.candidates.pop(0), []).append(agent_id)
        for peer, group in groups.items():
            self._wave += 1
            for agent_id in group:
                self._targets[agent_id].route = (peer, self._wave)
            effects.append(Send(peer, self._wave, tuple(group)))
        return effects
