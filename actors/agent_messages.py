"""The contract between an agent's stream process (the Subscribe handler), its owner actor
and the actors around them. Every module of the agent plane codes against these.

The flow of one session:

    Subscribe handler  TakePending (registry) -> start_child(agent_sup, OwnerArgs(..., stream))
    owner              init: mints stream_home_id, OwnerUp (registry), owner-table row,
                       Notify CONNECTED (upstream)
    owner -> stream    stream.deliver(CommandRequest) / stream.close(status, details)
    stream -> owner    AgentFrame(response) for each CommandResponse the agent sends;
                       StreamClosed() when the agent goes away (the owner ends `normal`)
    owner              terminate: exactly one Notify DISCONNECTED, Unregister (registry)
"""

from __future__ import annotations

import asyncio
from typing import Any

import attrs

from protos.yuzu.agent.v1 import agent_pb2

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
    process's task; the owner only puts into it (no awaits inside `receiveMessage`)."""

    __slots__ = ("ended", "queue")

    def __init__(self, maxsize: int = STREAM_QUEUE_MAX) -> None:
        self.queue: asyncio.Queue[agent_pb2.CommandRequest | StreamEnd] = asyncio.Queue(maxsize)
        self.ended = False

    def deliver(self, command: agent_pb2.CommandRequest) -> bool:
        """Queue one command for the agent; False if the stream has ended or is full."""
        if self.ended:
            return False
        try:
            self.queue.put_nowait(command)
        except asyncio.QueueFull:
            return False
        return True

    def close(self, end: StreamEnd) -> None:
        """Tell the stream process to finish with `end` after what is queued."""
        if self.ended:
            return
        self.ended = True
        while True:
            try:
                self.queue.put_nowait(end)
                return
            except asyncio.QueueFull:
                # The end must get through: drop the oldest undelivered frame for it.
                self.queue.get_nowait()


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
