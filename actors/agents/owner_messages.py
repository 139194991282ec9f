"""What an agent owner sends to the callers of `DeliverCommand` (the router of a later issue),
and what those callers may send back. The contract with the stream process and the registry is
in actors/agents/api.py and actors/registry/api.py.

    caller -> owner   DeliverCommand(command, reply_to)       (actors/agents/api.py)
    owner -> caller   CommandAnswer for each CommandResponse with the command's id (RUNNING
                      ones are progress; the last one has a final status)
                      CommandFailed when the command cannot get (more) answers
    caller -> owner   ForgetCommand when it stops waiting (its own timeout)
    upstream -> owner EndSession when the server refused the session on a registration replay
"""

from __future__ import annotations

from typing import Literal

import attrs

from protos.yuzu.agent.v1 import agent_pb2

__all__ = ["CommandAnswer", "CommandFailed", "EndSession", "FailReason", "ForgetCommand"]

# `stream_stuck`: the agent's stream is full, the owner ends it. `agent_disconnected`: the owner
# ended (the agent went away, a planned stop, a fault) or is ending. `too_many_pending`: the
# owner already waits for MAX_PENDING_COMMANDS answers. `duplicate_command_id`: the same command
# id is already in flight to this agent; this delivery was not written (the first one's caller
# keeps its answers).
FailReason = Literal[
    "stream_stuck", "agent_disconnected", "too_many_pending", "duplicate_command_id"
]


@attrs.frozen
class CommandAnswer:
    """One CommandResponse of the agent to a command the owner delivered. `agent_id` is the
    owner's (the gateway-asserted identity of the stream), never read from the frame."""

    agent_id: str
    response: agent_pb2.CommandResponse = attrs.field(repr=False)


@attrs.frozen
class CommandFailed:
    """No (more) answers will come for `command_id` from this owner."""

    agent_id: str
    command_id: str
    reason: FailReason


@attrs.frozen
class ForgetCommand:
    """Tell: the caller stopped waiting for `command_id`; later answers are dropped."""

    command_id: str


@attrs.frozen
class EndSession:
    """Tell (the `upstream` actor's registration replay): the server refused this session (a
    replay answered accepted=false, or FAILED_PRECONDITION: superseded). The owner of
    `session_id` ends it normally, so its DISCONNECTED goes once, and closes the agent's stream
    UNAVAILABLE with `details` so the agent registers afresh."""

    session_id: str = attrs.field(repr=False)
    details: str
