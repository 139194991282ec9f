"""The owner's pending-command map: which caller waits for the answers to each command the owner
wrote to its agent (seed: "OTP Process Model": an owner is about 2 KB plus this map; "Subscribe
Stream Proxy": responses flow back through the owner to the router).

Rules: an entry is added when a command with a `command_id` and a `reply_to` reaches the stream;
every answer of the agent with that id goes to that caller; an answer with a final status
(anything but RUNNING) removes the entry; the caller may forget an entry (its own timeout);
whatever is left when the owner ends is failed (`agent_disconnected`). A frame with the plugin
`__guard__` and no command id is not an answer: it is an unsolicited Guardian event (WIRE.md).

No protobuf and no addresses here: the caller passes the id, whether the status is final, and an
opaque `reply_to`.
"""

from __future__ import annotations

from collections.abc import Hashable

import attrs

__all__ = ["GUARDIAN_PLUGIN", "MAX_PENDING_COMMANDS", "PendingCommands", "is_guardian_event"]

GUARDIAN_PLUGIN = "__guard__"
# Commands waiting for an answer, per owner. An agent that never answers must not grow its owner
# without bound; a healthy agent answers far fewer at once than its stream can hold queued
# (actors/agent_messages.STREAM_QUEUE_MAX, 1024), so the same number bounds the map.
MAX_PENDING_COMMANDS = 1024


def is_guardian_event(plugin: str, command_id: str) -> bool:
    """An unsolicited Guardian event: forwarded upstream, never matched to a command."""
    return plugin == GUARDIAN_PLUGIN and not command_id


@attrs.define
class PendingCommands:
    limit: int = MAX_PENDING_COMMANDS
    _waiting: dict[str, Hashable] = attrs.field(init=False, factory=dict)

    def __len__(self) -> int:
        return len(self._waiting)

    def has_room(self, command_id: str) -> bool:
        """False when a new entry would pass the limit (a replaced one always fits)."""
        return command_id in self._waiting or len(self._waiting) < self.limit

    def expect(self, command_id: str, reply_to: Hashable) -> Hashable | None:
        """Route the answers to `command_id` to `reply_to`. Returns the caller it displaces (the
        same id sent again by another caller: the later one gets the answers)."""
        displaced = self._waiting.get(command_id)
        if len(self._waiting) >= self.limit and displaced is None:
            raise OverflowError("pending-command map is full; check has_room first")
        self._waiting[command_id] = reply_to
        return displaced if displaced != reply_to else None

    def answer(self, command_id: str, final: bool) -> Hashable | None:
        """Who waits for this answer (None: nobody, the frame is dropped)."""
        if final:
            return self._waiting.pop(command_id, None)
        return self._waiting.get(command_id)

    def forget(self, command_id: str) -> None:
        self._waiting.pop(command_id, None)

    def drain(self) -> list[tuple[str, Hashable]]:
        """Every entry left, oldest first; the map is empty afterwards."""
        left = list(self._waiting.items())
        self._waiting.clear()
        return left
