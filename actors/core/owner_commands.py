"""The owner's pending-command map: which caller waits for the answers to each command the owner
wrote to its agent (seed: "OTP Process Model": an owner is about 2 KB plus this map; "Subscribe
Stream Proxy": responses flow back through the owner to the router).

Rules: an entry is added when a command with a `command_id` and a `reply_to` reaches the stream;
every answer of the agent with that id goes to that caller; an answer with a final status
(anything but RUNNING) removes the entry; the caller may forget an entry (its own timeout);
whatever is left when the owner ends is failed (`agent_disconnected`). A frame with the plugin
`__guard__` and no command id is not an answer: it is an unsolicited Guardian event (WIRE.md).

A command id already waiting for answers is in flight to this agent: the same id again is
refused (`duplicate_command_id`, issue 6) and not written to the agent a second time, whoever
sends it. An entry carries the caller's deadline: past it the caller has stopped waiting (its
ForgetCommand may never come: a killed router sends none), so the entry no longer counts as in
flight or against the bound, and it goes the next time the map needs room.

No protobuf and no addresses here: the caller passes the id, whether the status is final, and an
opaque `reply_to`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import attrs

__all__ = ["GUARDIAN_PLUGIN", "MAX_PENDING_COMMANDS", "PendingCommands", "is_guardian_event"]

_NEVER = math.inf

GUARDIAN_PLUGIN = "__guard__"
# Commands waiting for an answer, per owner. An agent that never answers must not grow its owner
# without bound; a healthy agent answers far fewer at once than its stream can hold queued
# (actors/agents/api.STREAM_QUEUE_MAX, 1024), so the same number bounds the map.
MAX_PENDING_COMMANDS = 1024


def is_guardian_event(plugin: str, command_id: str) -> bool:
    """An unsolicited Guardian event: forwarded upstream, never matched to a command."""
    return plugin == GUARDIAN_PLUGIN and not command_id


@attrs.define
class PendingCommands:
    limit: int = MAX_PENDING_COMMANDS
    # command id -> (the caller, the caller's deadline on the loop clock)
    _waiting: dict[str, tuple[Hashable, float]] = attrs.field(init=False, factory=dict)

    def __len__(self) -> int:
        return len(self._waiting)

    def in_flight(self, command_id: str, now: float) -> bool:
        """A caller still waits for answers to `command_id` (its deadline has not passed)."""
        entry = self._waiting.get(command_id)
        return entry is not None and now < entry[1]

    def has_room(self, now: float) -> bool:
        """False when a new entry would pass the limit even after the expired ones go."""
        if len(self._waiting) < self.limit:
            return True
        self._expire(now)
        return len(self._waiting) < self.limit

    def expect(self, command_id: str, reply_to: Hashable, deadline: float | None = None) -> None:
        """Route the answers to `command_id` to `reply_to` until `deadline` (None: until the
        final answer or a forget). The id must not be in flight (`in_flight`): that is the
        caller's `duplicate_command_id`. An expired entry of the id is replaced."""
        if command_id not in self._waiting and len(self._waiting) >= self.limit:
            raise OverflowError("pending-command map is full; check has_room first")
        self._waiting.pop(command_id, None)  # a replaced entry moves to the end (newest)
        self._waiting[command_id] = (reply_to, _NEVER if deadline is None else deadline)

    def answer(self, command_id: str, final: bool) -> Hashable | None:
        """Who waits for this answer (None: nobody, the frame is dropped)."""
        entry = self._waiting.pop(command_id, None) if final else self._waiting.get(command_id)
        return None if entry is None else entry[0]

    def forget(self, command_id: str) -> None:
        self._waiting.pop(command_id, None)

    def drain(self) -> list[tuple[str, Hashable]]:
        """Every entry left, oldest first; the map is empty afterwards."""
        left = [(command_id, entry[0]) for command_id, entry in self._waiting.items()]
        self._waiting.clear()
        return left

    def _expire(self, now: float) -> None:
        for command_id in [c for c, (_, deadline) in self._waiting.items() if now >= deadline]:
            del self._waiting[command_id]
