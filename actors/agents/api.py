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
                      (actors/upstream/api.py)

The owner table: one row per agent session, written by the session's owner.

A public table owned by the root supervisor (`gateway_sup`), not by any owner, so a row
survives its owner's crash (seed: "When an agent's owner process crashes": the session's
details survive the crash in the owner table, written when the session is set up and removed
when the owner ends for good). Any actor of the node may write it; by convention each owner
writes only its own session's row, and a restarted owner deletes its dead predecessor's.

Rows honour `actors.registry.api.OwnerRecord` (owner, conn_key, state): heartbeat admission
reads them to keep a session admitted while its owner is dead or recovering (ADM-08). The
registration replay reads a row's stored RegisterRequest (`register`) and its stream home id.

A row exists exactly while its owner has announced CONNECTED and owes the DISCONNECTED
(actors/core/owner_lifecycle.py), so the row is also the record of that debt.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from actors.registry.api import OWNERS_TABLE
from actors.upstream.api import stored_session
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.address import Address

if TYPE_CHECKING:
    from supervisors.process import Process
    from supervisors.runtime import LoopSystemBase
    from supervisors.table import Table


# The supervisor of the owners (actors/agents/sup.py): the Subscribe handler starts each owner
# under it by this name.
AGENT_SUP_NAME: Final = "agent_sup"

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

    __slots__ = ("_frames", "_maxsize", "_on_adopt", "_waiter", "adopted", "ended")

    def __init__(self, maxsize: int = STREAM_QUEUE_MAX) -> None:
        self._maxsize = maxsize
        self._frames: collections.deque[agent_pb2.CommandRequest | StreamEnd] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._on_adopt: Callable[[Address], None] | None = None
        # The last restarted owner that took the session over, kept for a stream process that
        # was not yet listening when it did.
        self.adopted: Address | None = None
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
        self.adopted = owner
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


# `live`: the owner holds the session. `recovering`, `ending`, `superseded`: written by the
# owner-crash recovery of issue 7 (see OwnerRecord in actors/registry/api.py); `superseded` by a
# restarted owner the registry refused because its agent has a newer session.
OwnerState = Literal["live", "recovering", "ending", "superseded"]


@attrs.frozen
class OwnerRow:
    owner: Address
    session_id: str
    agent_id: str
    conn_key: Hashable | None
    stream_home_id: str
    state: OwnerState = "live"
    # The agent's stored RegisterRequest, which the registration replay presents to the server
    # again (actors/upstream/replay.py). Never compared or printed: it holds the enrolment token.
    register: agent_pb2.RegisterRequest | None = attrs.field(default=None, eq=False, repr=False)
    # Owner-crash recovery (actors/core/owner_recovery.py): the owner's start arguments, so a
    # new agent_sup can restart an owner for an orphaned session, and the loop-clock times of
    # the session's owner restarts within the last 60 s.
    args: OwnerArgs | None = attrs.field(default=None, eq=False, repr=False)
    restarts: tuple[float, ...] = attrs.field(default=(), eq=False)
    # When the registry first registered the session (loop clock, `OwnerRegistered.since`): a
    # restarted owner registers it again under it, so a newer session of the agent wins.
    since: float = attrs.field(default=0.0, eq=False)


def create_owner_table(process: Process) -> Table[str, OwnerRow]:
    """Create the public owner table, owned by `process` (the root supervisor)."""
    return process.new_table(OWNERS_TABLE, "public")


def owner_row(runtime: LoopSystemBase, session_id: str) -> OwnerRow | None:
    """The session's row, or None (no row, or no table)."""
    row = stored_session(runtime, session_id)
    return row if isinstance(row, OwnerRow) else None
