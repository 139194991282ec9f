"""One command forwarded to the other nodes: which node's word settles each target (pure).

The router forwards the targets it does not hold to every connected peer (it does not know
which holds them). Each peer routes them locally and streams back, per target, either that it
does not hold it (`held=False`) or the agent's frames and one terminal answer. The rules:

- A target's frames are passed on as they come, from whichever peer holds it; its first
  terminal frame settles it (`Answer(final=True)`); nothing of it is passed on afterwards.
- A target every peer said it does not hold is settled `not_connected`.
- A peer whose stream ends (it left the cluster, its link broke) before its word on a target
  counts as possibly holding it: if no other peer answers for it, it is settled
  `agent_disconnected`, never left waiting.

No protobuf, no clock: peers are opaque keys, targets agent ids.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Literal

import attrs

__all__ = ["Answer", "Fail", "MergeEffect", "RemoteMerge"]


@attrs.frozen
class Answer:
    """Pass the peer's frame of `agent_id` on; `final` when it is its terminal answer."""

    agent_id: str
    final: bool


@attrs.frozen
class Fail:
    agent_id: str
    reason: Literal["not_connected", "agent_disconnected"]


MergeEffect = Answer | Fail


class RemoteMerge:
    def __init__(self, targets: Iterable[str], peers: Iterable[Hashable]) -> None:
        peer_set = frozenset(peers)
        # target -> the peers whose word on it is still to come.
        self._waiting: dict[str, set[Hashable]] = {t: set(peer_set) for t in targets}
        self._lost: set[str] = set()

    @property
    def done(self) -> bool:
        return not self._waiting

    def owing(self) -> frozenset[str]:
        return frozenset(self._waiting)

    def frame(self, peer: Hashable, agent_id: str, held: bool, final: bool) -> list[MergeEffect]:
        waiting = self._waiting.get(agent_id)
        if waiting is None or peer not in waiting:
            return []
        if held:
            if final:
                del self._waiting[agent_id]
            return [Answer(agent_id, final)]
        waiting.discard(peer)
        return self._settle_if_unheld(agent_id)

    def peer_ended(self, peer: Hashable) -> list[MergeEffect]:
        """The peer's stream is over: whatever it has not answered for, it never will."""
        effects: list[MergeEffect] = []
        for agent_id, waiting in list(self._waiting.items()):
            if peer in waiting:
                waiting.discard(peer)
                self._lost.add(agent_id)
                effects += self._settle_if_unheld(agent_id)
        return effects

    def _settle_if_unheld(self, agent_id: str) -> list[MergeEffect]:
        if self._waiting[agent_id]:
            return []
        del self._waiting[agent_id]
        return [Fail(agent_id, "agent_disconnected" if agent_id in self._lost else "not_connected")]
