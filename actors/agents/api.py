"""The contract between an agent's stream process (the Subscribe handler), its owner actor
and the actors around them. Every module of the agent plane codes against these.

The flow of one session:

    Subscribe handler  TakePending (registry) -> start_child(agent_sup, OwnerArgs(..., stream))
    owner              init: mints stream_home_id, OwnerUp (registry), owner-table row,
                       Notify CONNECTED (upstream)
    owner -> stream    stream.deliver(CommandRequest) / stream.close(status, details)
    stream -> owner    AgentFrame(response) for each CommandResponse the agent sends;
                       StreamClosed() when the agent goes away (the owner ends `normal`)
    restarted owner    stream.adopt(owner): it took the session over after a crash
    owner              terminate: exactly one Notify DISCONNECTED, Unregister (registry)

What an agent owner sends to the callers of `DeliverCommand` (the router), and what those
callers may send back (the registry's side is actors/registry/api.py):

    caller -> owner   DeliverCommand(command, reply_to)       (actors/agents/api.py)
    owner -> caller   CommandAnswer for each CommandResponse with the command's id (RUNNING
                      ones are progress; the last one has a final status)
                      CommandFailed when the command cannot get (more) answers
    caller -> owner   ForgetCommand when it stops waiting (its own timeout)
    upstream -> owner EndSession when the server refused the session on a registration replay
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any, Literal

import attrs

from protos.yuzu.agent.v1 import agent_pb2
from supervisors.address import Address

# Outbound frames queued for one agent before the owner treats the stream as stuck and
# ends it: a healthy agent drains its stream continuously; a stuck one must not hold memory.
STREAM_QUEUE_MAX = 1024


@attrs.frozen
class StreamEnd:
    """What the stream process ends the Subscribe call with (a gRPC status code and
    details; metadata such as a retry hint may follow)."""

    status: int
    details: str = ""
    trailers: tuple[tuple[str, str], ...] = ()


class StreamHandle:
    """The owner's side of one Subscribe stream: a bounded queue of outbound frames that the
    stream process writes, and the end the stream process finishes with. Owned by the stream
    process's task; the owner only puts into it (no awaits inside `receiveMessage`).

    Not an `asyncio.Queue`: one is held per agent for the life of its stream, and a Queue
    carries four deques (about 2.5 KB) where this needs one, made only while frames wait (an
    idle agent's stream, the common case, holds none), and one waiter: its only reader.

    It also carries the restarted owner's word that it has taken the session over (`adopt`),
    so the stream process follows it at once instead of looking for it (docs/owner-recovery.md).
    """

    __slots__ = ("_frames", "_maxsize", "_on_adopt", "_waiter", "ended")

    def __init__(self, maxsize: int = STREAM_QUEUE_MAX) -> None:
        self._maxsize = maxsize
        self._frames: collections.deque[agent_pb2.CommandRequest | StreamEnd] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._on_adopt: Callable[[Address], None] | None = None
        self.ended = False

    def qsize(self) -> int:
        return 0 if self._frames is None else len(self._frames)

    def deliver(self, command: agent_pb2.CommandRequest) -> bool:
        """Queue one command for the agent; False if the stream has ended or is full."""
        if self.ended or self.qsize() >= self._maxsize:
            return False
        self._put(command)
        return True

    def close(self, end: StreamEnd) -> None:
        """Tell the stream process to finish with `end` after what is queued."""
        if self.ended:
            return
        self.ended = True
        if self._frames is not None and len(self._frames) >= self._maxsize:
            # The end must get through: drop the oldest undelivered frame for it.
            self._frames.popleft()
        self._put(end)

    def on_adopt(self, callback: Callable[[Address], None] | None) -> None:
        """The stream process's `callback(owner)` for `adopt` (None: no longer told)."""
        self._on_adopt = callback

    def adopt(self, owner: Address) -> None:
        """A restarted owner has taken this stream's session over: tell the stream process."""
        callback = self._on_adopt
        if callback is not None:
            callback(owner)

    def take_nowait(self) -> agent_pb2.CommandRequest | StreamEnd | None:
        """The oldest queued frame, or None when none is queued."""
        frames = self._frames
        if frames is None:
            return None
        item = frames.popleft()
        if not frames:
            self._frames = None
        return item

    async def next(self) -> agent_pb2.CommandRequest | StreamEnd:
        """The oldest queued frame, waiting for one (one reader only: the stream process)."""
        while self._frames is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self.take_nowait()
        assert item is not None
        return item

    def _put(self, item: agent_pb2.CommandRequest | StreamEnd) -> None:
        if self._frames is None:
            self._frames = collections.deque()
        self._frames.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


@attrs.frozen
class OwnerArgs:
    """`init` argument of an owner actor (the template child of `agent_sup`)."""

    session_id: str
    agent_id: str
    conn_key: Any
    peer: str
    register: agent_pb2.RegisterRequest = attrs.field(repr=False)
    stream: StreamHandle = attrs.field(repr=False, eq=False)
    plugins: tuple[str, ...] = ()


@attrs.frozen
class AgentFrame:
    """A CommandResponse the agent sent on its stream."""

    response: agent_pb2.CommandResponse = attrs.field(repr=False)


@attrs.frozen
class StreamClosed:
    """The agent's side of the stream ended (cancelled, reset, or the connection closed)."""

    reason: str = "agent_disconnected"


@attrs.frozen
class DeliverCommand:
    """Ask an owner to write a command to its agent (the router, the management plane)."""

    command: agent_pb2.CommandRequest = attrs.field(repr=False)
    reply_to: Any = None
    # When `reply_to` stops waiting, on the loop clock (None: until the final answer). Past it
    # the owner no longer counts the command as in flight, even if no ForgetCommand came.
    deadline: float | None = None


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
