"""The fan-out of one SendCommand: which targets still owe the operator a terminal answer.

Rules of this file (seed: "Subscribe Stream Proxy"; issue 6 section 1):

- Every target gets exactly one terminal answer on the operator's stream: the agent's own frame
  with a final status (anything but RUNNING), a FAILURE the gateway writes for it (`refused`:
  not held here; `failed`: its owner gave up, e.g. `agent_disconnected`), or TIMEOUT when the
  command's time is up (`expire`).
- Until then every frame of the target is forwarded as it arrives, RUNNING ones included; after
  it nothing of that target is forwarded again (a late or repeated answer is dropped).
- The command is over (`Done`) once every target has been decided (dispatched or refused) and
  none still owes, or at `expire`. `Done` comes exactly once.
- At `expire`, and when the operator goes away (`abandon`), each owner that still routes
  answers for a target is told to stop (`Forget`), so it drops them instead of sending them to
  a command nobody waits for.

Theory of operation: a target is `undecided` until the router either dispatches it to an owner
(`dispatched`: it now owes, and `route` is how to reach that owner) or refuses it (`refused`).
The router decides every target inside one message, so `Done` can never be emitted while some
target is still undecided.

No protobuf, no clock, no addresses: targets are agent ids, `route` is opaque (the owner's
address), and every method returns effect records the router carries out in order.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Literal

import attrs

__all__ = [
    "CommandFanout",
    "Done",
    "Effect",
    "FanoutError",
    "Forget",
    "Forward",
    "Settle",
    "unique_targets",
]

Outcome = Literal["completed", "timeout"]


@attrs.frozen
class Forward:
    """Write the agent's own frame to the operator; `final` when it was its terminal answer."""

    agent_id: str
    final: bool


@attrs.frozen
class Settle:
    """Write a terminal answer the gateway makes for `agent_id`: FAILURE with `output` naming
    the reason, or TIMEOUT."""

    agent_id: str
    status: Literal["FAILURE", "TIMEOUT"]
    output: str = ""


@attrs.frozen
class Forget:
    """Tell the owner behind `route` to stop routing `agent_id`'s answers of this command."""

    agent_id: str
    route: Hashable


@attrs.frozen
class Done:
    """Every target has its terminal answer: end the operator's stream (OK)."""

    outcome: Outcome


Effect = Forward | Settle | Forget | Done


class FanoutError(Exception):
    """A target decided twice, or one that is not a target: a defect of the caller."""


def unique_targets(agent_ids: Iterable[str]) -> tuple[str, ...]:
    """The targets of a request, first occurrence kept: an agent named twice gets the command
    once and owes one terminal answer."""
    return tuple(dict.fromkeys(agent_ids))


@attrs.define
class CommandFanout:
    targets: tuple[str, ...] = attrs.field(converter=unique_targets)
    _undecided: set[str] = attrs.field(init=False)
    # target -> the route of its owner, while it owes a terminal answer.
    _owing: dict[str, Hashable] = attrs.field(init=False, factory=dict)
    _done: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self._undecided = set(self.targets)

    @property
    def owing(self) -> int:
        return len(self._owing)

    @property
    def settled(self) -> int:
        return len(self.targets) - len(self._undecided) - len(self._owing)

    @property
    def done(self) -> bool:
        return self._done

    def owes(self, agent_id: str) -> bool:
        return agent_id in self._owing

    # -- deciding each target ----------------------------------------------------------------

    def _decide(self, agent_id: str) -> None:
        if agent_id not in self._undecided:
            raise FanoutError("a target decided twice, or not a target")
        self._undecided.discard(agent_id)

    def dispatched(self, agent_id: str, route: Hashable) -> None:
        """The command went to the target's owner: the target owes a terminal answer."""
        self._decide(agent_id)
        self._owing[agent_id] = route

    def refused(self, agent_id: str, reason: str) -> list[Effect]:
        """The command cannot go to the target (not held here, already in flight to it)."""
        self._decide(agent_id)
        return self._maybe_done([Settle(agent_id, "FAILURE", reason)])

    def routed(self) -> list[Effect]:
        """Every target is decided: the end at once when none owes (no targets at all, or every
        one refused)."""
        if self._undecided:
            raise FanoutError("routed with targets still undecided")
        return self._maybe_done([])

    # -- what comes back ---------------------------------------------------------------------

    def answered(self, agent_id: str, final: bool) -> list[Effect]:
        """A frame of the agent for this command."""
        if agent_id not in self._owing:
            return []
        if not final:
            return [Forward(agent_id, final=False)]
        del self._owing[agent_id]
        return self._maybe_done([Forward(agent_id, final=True)])

    def failed(self, agent_id: str, reason: str) -> list[Effect]:
        """The target's owner will send no (more) answers (it ended, its stream is stuck...)."""
        if self._owing.pop(agent_id, _ABSENT) is _ABSENT:
            return []
        return self._maybe_done([Settle(agent_id, "FAILURE", reason)])

    # -- the end -----------------------------------------------------------------------------

    def expire(self) -> list[Effect]:
        """The command's time is up: TIMEOUT for every target that still owes, its owner told to
        forget the command, and the end. Nothing once already done."""
        if self._undecided:
            # Undecided targets only exist inside the router's routing step, never at a timer.
            raise FanoutError("expire with targets still undecided")
        if self._done:
            return []
        effects: list[Effect] = []
        for agent_id, route in self._owing.items():
            effects.append(Settle(agent_id, "TIMEOUT"))
            effects.append(Forget(agent_id, route))
        self._owing.clear()
        self._done = True
        effects.append(Done("timeout"))
        return effects

    def abandon(self) -> list[Effect]:
        """The operator went away: every owner still routing answers is told to forget them."""
        effects: list[Effect] = [Forget(a, route) for a, route in self._owing.items()]
        self._owing.clear()
        self._undecided.clear()
        self._done = True
        return effects

    def _maybe_done(self, effects: list[Effect]) -> list[Effect]:
        if not self._done and not self._undecided and not self._owing:
            self._done = True
            effects.append(Done("completed"))
        return effects


_ABSENT = object()
