"""A link's command stream: every command forwarded to a peer, and its answers, on one
long-lived bidi call (`Commands`) instead of one HTTP/2 stream per command (docs/cluster.md).

The dialling node opens it right after the challenge, with a signed call (gateway/cluster/auth.py:
the dialled node refuses a bad or replayed signature before reading a frame, as for every
call); it lasts as long as the link. Each frame is sealed (`Sealer`, `Opener`: per-direction
sequence number and HMAC under the key of that signed call), so it costs a DATA frame each
way, not HEADERS, DATA and trailers. A frame that does not open is refused and counted, and
ends the stream: the link is down, its commands fail at once, the next round dials again.

| kind | from | body | means |
| --- | --- | --- | --- |
| `C` | dialler | SendCommandRequest | route this to your own agents (never forwarded again) |
| `F` | dialler | empty | forget command `id` (the origin's command ended) |
| `A` | dialled | SendCommandResponse | one frame of a target, as a local operator gets it (1) |
| `E` | dialled | empty | no more word on command `id` (its router ended, it was refused) |
| `B` | dialled | records | several `A` and `E`, in order (2) |

`id` is the dialling node's number for the forwarded command. (1) A target the dialled node does
not hold is a response with no `response` field. A command that completes or times out on the
dialled node needs no `E`: by then every target has had its terminal word. (2) The dialled side
puts what it sends in an outbox, whose writer, woken at the end of the loop turn (a ready
callback, no timer), sends all the turn produced together (gateway/cluster/batches.py): a
broadcast's answers cost a frame per batch, not one per answer, and a lone answer still leaves
at the end of its turn, as a plain `A` frame.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from grpclib.client import Channel
from grpclib.client import Stream as ClientStream
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream as ServerStream

from actors.cluster.api import LinkEnded, PeerEnded, PeerFrame
from gateway.cluster.auth import UNAUTHENTICATED_DETAILS, Opener, Sealer
from gateway.cluster.batches import BATCH, MAX_BATCH_BYTES, Record, pack, unpack
from gateway.mgmt.command import ResponseWriter
from gateway.mgmt.metrics import CommandOutcome
from protos.yuzu.server.v1 import management_pb2 as mgmt

__all__ = ["COMMANDS_METHOD", "CommandLink", "Frame", "Route", "serve_commands"]

log = logging.getLogger("yuzu_gw.cluster")

COMMANDS_METHOD = "Commands"
COMMAND: Final = b"C"
FORGET: Final = b"F"
ANSWER: Final = b"A"
END: Final = b"E"
# Directions, part of every MAC, so a frame cannot be reflected back to the side that sealed it.
TO_DIALLED: Final = b">"
TO_DIALLER: Final = b"<"
# Outcomes after which every target has had its terminal word (no `E` needed).
_SETTLED: frozenset[CommandOutcome] = frozenset({"completed", "timeout"})

# What answers one forwarded command on the dialled node (run_command, scoped to its agents).
Route = Callable[[mgmt.SendCommandRequest, ResponseWriter], Awaitable[CommandOutcome]]


class Frame:
    """A sealed frame as grpclib's proto codec carries it: bytes in, the same bytes out."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:
        return self.data

    @classmethod
    def FromString(cls, data: bytes) -> Frame:
        return cls(data)


class _Refused(Exception):
    """A frame did not open: the stream is not to be trusted."""


class _Outbox:
    """What the dialled side sends on one command stream. `put` never waits; the writer (`run`,
    a task `serve_commands` owns) takes every record put since it last ran and sends them as
    few sealed frames (gateway/cluster/batches.py). `room` holds the answers' writers while
    `MAX_BATCH_BYTES` or more wait, so an origin that does not read backs up into the sink's
    bound (gateway/mgmt/command.py), not here."""

    __slots__ = ("_bytes", "_failed", "_records", "_room", "_sealer", "_stream", "_wake")

    def __init__(self, stream: ServerStream[Frame, Frame], sealer: Sealer) -> None:
        self._stream = stream
        self._sealer = sealer
        self._records: list[Record] = []
        self._bytes = 0
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._failed: Exception | None = None

    def put(self, kind: bytes, command_id: int, body: bytes) -> None:
        """Queue a record; raises what ended the writer once it has ended."""
        if self._failed is not None:
            raise self._failed
        self._records.append((kind, command_id, body))
        self._bytes += len(body)
        self._wake.set()
        if self._bytes >= MAX_BATCH_BYTES:
            self._room.clear()

    async def room(self) -> None:
        await self._room.wait()

    async def run(self) -> None:
        stream, sealer, wake = self._stream, self._sealer, self._wake
        try:
            while True:
                await wake.wait()
                wake.clear()
                records, self._records, self._bytes = self._records, [], 0
                self._room.set()
                for kind, command_id, body in pack(records):
                    await stream.send_message(Frame(sealer.seal(kind, command_id, body)))
        except Exception as exc:  # the stream broke: the answers' writers learn it from `put`
            self._failed = exc
            self._room.set()


class _Answers:
    """One forwarded command's responses, put as `A` records in the stream's outbox; `cancel`
    (an origin that reads nothing) resets the whole stream."""

    __slots__ = ("_command_id", "_outbox", "_stream")

    def __init__(
        self, command_id: int, outbox: _Outbox, stream: ServerStream[Frame, Frame]
    ) -> None:
        self._command_id = command_id
        self._outbox = outbox
        self._stream = stream

    async def send_message(self, message: mgmt.SendCommandResponse) -> None:
        outbox = self._outbox
        outbox.put(ANSWER, self._command_id, message.SerializeToString())
        await outbox.room()

    async def cancel(self) -> None:
        await self._stream.cancel()


async def serve_commands(
    stream: ServerStream[Frame, Frame], key: bytes, route: Route, on_refused: Callable[[], None]
) -> None:
    """The dialled side of one command stream, until the dialler ends it or a frame is refused.
    Each command runs as a local operator's would (`route`), in its own task (owned here:
    cancelled when its `F` comes or the stream ends, which abandons it on the router); the
    outbox's writer is a task owned here too."""
    opener = Opener(key, TO_DIALLED)
    outbox = _Outbox(stream, Sealer(key, TO_DIALLER))
    tasks: dict[int, asyncio.Task[None]] = {}

    async def one(command_id: int, body: bytes) -> None:
        outcome: CommandOutcome | None = None
        try:
            request = mgmt.SendCommandRequest.FromString(body)
            outcome = await route(request, _Answers(command_id, outbox, stream))
        except Exception as exc:  # refused or its router ended: the origin settles the rest
            log.debug("cluster forwarded command ended: %s", type(exc).__name__)
        finally:
            tasks.pop(command_id, None)
        if outcome not in _SETTLED:
            with contextlib.suppress(Exception):
                outbox.put(END, command_id, b"")

    await stream.send_initial_metadata()
    writer = asyncio.create_task(outbox.run())
    try:
        async for frame in stream:
            opened = opener.open(frame.data)
            if opened is None:
                on_refused()
                raise GRPCError(Status.UNAUTHENTICATED, UNAUTHENTICATED_DETAILS)
            kind, command_id, body = opened
            if kind == COMMAND and command_id not in tasks:
                tasks[command_id] = asyncio.create_task(one(command_id, body))
            elif kind == FORGET and (task := tasks.get(command_id)) is not None:
                task.cancel()
    finally:
        for task in list(tasks.values()):
            task.cancel()
        writer.cancel()


class CommandLink:
    """The dialling side of one command stream (module doc): `open` once, then `forward` and
    `forget` from the actor (they never wait: a writer task sends them in order). What comes
    back is handed to `deliver` as the cluster actor's messages: `PeerFrame`, `PeerEnded`,
    and once, when the stream ends for any reason after it opened, `LinkEnded`."""

    def __init__(self, peer: object, deliver: Callable[[Any], None]) -> None:
        self._peer = peer
        self._deliver = deliver
        # Frames not yet written: one per forwarded command and per forgotten one, so no more
        # than the actor's commands in flight.
        self._outbox: collections.deque[tuple[bytes, int, bytes]] = collections.deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.ended = False

    async def open(
        self, channel: Channel, path: str, metadata: dict[str, str], key: bytes, timeout: float
    ) -> None:
        """Open the stream (raises GRPCError UNAUTHENTICATED when the peer refuses it)."""
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(channel, path, metadata, key, opened))
        await asyncio.wait_for(asyncio.shield(opened), timeout)

    def forward(self, command_id: int, request: mgmt.SendCommandRequest) -> None:
        self._put(COMMAND, command_id, request.SerializeToString())

    def forget(self, command_id: int) -> None:
        self._put(FORGET, command_id, b"")

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _put(self, kind: bytes, command_id: int, body: bytes) -> None:
        self._outbox.append((kind, command_id, body))
        self._wake.set()

    async def _run(
        self,
        channel: Channel,
        path: str,
        metadata: dict[str, str],
        key: bytes,
        opened: asyncio.Future[None],
    ) -> None:
        refused = False  # by this node: a frame of the peer did not open
        try:
            async with channel.request(
                path, Cardinality.STREAM_STREAM, Frame, Frame, metadata=metadata
            ) as stream:
                await stream.send_request()
                await stream.recv_initial_metadata()
                opened.set_result(None)
                writer = asyncio.create_task(self._write(stream, Sealer(key, TO_DIALLED)))
                try:
                    await self._read(stream, Opener(key, TO_DIALLER))
                finally:
                    writer.cancel()
        except _Refused:
            refused = True
        except Exception as exc:  # the connection failed, the peer refused or ended it
            if not opened.done():
                opened.set_exception(exc)
        finally:
            self.ended = True
            if opened.done() and not opened.cancelled() and opened.exception() is None:
                self._deliver(LinkEnded(self._peer, refused))
            elif not opened.done():
                opened.cancel()

    async def _write(self, stream: ClientStream[Frame, Frame], sealer: Sealer) -> None:
        outbox, wake = self._outbox, self._wake
        while True:
            while outbox:
                kind, command_id, body = outbox.popleft()
                await stream.send_message(Frame(sealer.seal(kind, command_id, body)))
            wake.clear()
            await wake.wait()

    async def _read(self, stream: ClientStream[Frame, Frame], opener: Opener) -> None:
        deliver, peer = self._deliver, self._peer
        async for frame in stream:
            opened = opener.open(frame.data)
            if opened is None:
                raise _Refused
            if opened[0] == BATCH:
                records = unpack(opened[2])
                if records is None:
                    raise _Refused
            else:
                records = [opened]
            for kind, command_id, body in records:
                if kind == ANSWER:
                    answer = mgmt.SendCommandResponse.FromString(body)
                    response = answer.response if answer.HasField("response") else None
                    deliver(PeerFrame(command_id, peer, answer.agent_id, response))
                elif kind == END:
                    deliver(PeerEnded(command_id, peer))
