"""The agent directory's replication between nodes (the policy is actors/core/agent_directory.py;
docs/cluster.md, "The agent directory").

Each link carries one signed server-streaming call `Directory`, opened by the dialling node as
soon as the link is up: the dialled node answers with its full sync (its snapshot), then every
join and leave of its own agents as they happen, for as long as the link lasts. One ordered
stream per direction, so a peer never applies a record older than the snapshot after it. The
call ending for any reason is the link going down (the peer's entries are purged, the next
round dials again).

A frame's body is records, each `RECORD` (kind, stamp, agent id length) then the agent id in
UTF-8; a frame holds at most `MAX_FRAME_BYTES` of them (a sync of many agents is several
frames). Kinds: `S` sync begins, `J` join, `L` leave, `E` sync ends.

`DirectoryFeed` is the dialled side's fan-out: the `cluster` actor publishes its records into
it (`publish`, never waits) and each open `Directory` call reads its own queue. A peer that
does not read (more than `MAX_QUEUED_RECORDS` queued) has its call ended: it syncs again.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import attrs
from google.protobuf import empty_pb2

from actors.cluster.api import DIRECTORY_TABLE, PeerLink
from actors.core.agent_directory import AgentDirectory, Join, Leave, Record, SyncBegin, SyncEnd
from gateway.cluster.commands import Frame

if TYPE_CHECKING:
    from grpclib.server import Stream

    from supervisors.runtime import LoopSystemBase

__all__ = [
    "DIRECTORY_METHOD",
    "FEED_KEY",
    "DirectoryEnded",
    "DirectoryFeed",
    "DirectoryRecords",
    "decode",
    "encode",
    "feed_of",
    "follow",
    "serve_directory",
]

log = logging.getLogger("yuzu_gw.cluster")

DIRECTORY_METHOD: Final = "Directory"
FEED_KEY: Final = "feed"
RECORD: Final = struct.Struct(">cQH")
MAX_FRAME_BYTES: Final = 64 * 1024
# Records queued for one peer that does not read: about a minute of a churn of a thousand
# agents a second; past it the peer is cut off and syncs again (a sync is bounded by the agents).
MAX_QUEUED_RECORDS: Final = 65536

_KINDS: Final = {b"J": Join, b"L": Leave}


@attrs.frozen
class DirectoryRecords:
    """A peer's records, told to the `cluster` actor from its link's task."""

    peer: object
    records: list[Record] = attrs.field(repr=False)


@attrs.frozen
class DirectoryEnded:
    """The peer's `Directory` call is over (the link is down)."""

    peer: object


def _one(record: Record) -> bytes:
    match record:
        case SyncBegin():
            return RECORD.pack(b"S", 0, 0)
        case SyncEnd():
            return RECORD.pack(b"E", 0, 0)
        case Join(agent_id=agent_id, stamp=stamp) | Leave(agent_id=agent_id, stamp=stamp):
            data = agent_id.encode()
            kind = b"J" if isinstance(record, Join) else b"L"
            return RECORD.pack(kind, stamp, len(data)) + data


def encode(records: Iterable[Record]) -> list[bytes]:
    """The frame bodies for `records`, in order, each at most `MAX_FRAME_BYTES` (an agent id
    is at most 64 KiB, so one record always fits a frame of its own)."""
    frames: list[bytes] = []
    parts: list[bytes] = []
    size = 0
    for record in records:
        part = _one(record)
        if parts and size + len(part) > MAX_FRAME_BYTES:
            frames.append(b"".join(parts))
            parts, size = [], 0
        parts.append(part)
        size += len(part)
    if parts:
        frames.append(b"".join(parts))
    return frames


def decode(body: bytes) -> list[Record] | None:
    """A frame's records, or None when it is not whole records (a faulty peer)."""
    records: list[Record] = []
    offset, end = 0, len(body)
    while offset < end:
        if end - offset < RECORD.size:
            return None
        kind, stamp, length = RECORD.unpack_from(body, offset)
        offset += RECORD.size
        if end - offset < length:
            return None
        if kind == b"S":
            records.append(SyncBegin())
        elif kind == b"E":
            records.append(SyncEnd())
        elif (cls := _KINDS.get(kind)) is not None:
            try:
                agent_id = body[offset : offset + length].decode()
            except UnicodeDecodeError:
                return None
            records.append(cls(agent_id, stamp))
        else:
            return None
        offset += length
    return records


class _Subscription:
    __slots__ = ("_queue", "_waiter", "cut")

    def __init__(self, first: list[Record]) -> None:
        self._queue: collections.deque[Record] = collections.deque(first)
        self._waiter: asyncio.Future[None] | None = None
        self.cut = False

    def put(self, records: list[Record]) -> None:
        self._queue.extend(records)
        if len(self._queue) > MAX_QUEUED_RECORDS:
            self.cut = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[Record]:
        while not self._queue and not self.cut:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        taken = list(self._queue)
        self._queue.clear()
        return taken


class DirectoryFeed:
    """This node's records to every peer reading them (module doc). `refresh` brings the
    published agents up to date (the actor's scan), so a new reader's snapshot is current."""

    def __init__(self, directory: AgentDirectory, refresh: Callable[[], None]) -> None:
        self._directory = directory
        self._refresh = refresh
        self._subs: set[_Subscription] = set()

    @property
    def readers(self) -> int:
        return len(self._subs)

    def publish(self, records: list[Record]) -> None:
        if records:
            for sub in self._subs:
                sub.put(records)

    async def serve(self) -> AsyncIterator[bytes]:
        self._refresh()
        sub = _Subscription(self._directory.snapshot())
        self._subs.add(sub)
        try:
            while not sub.cut:
                for body in encode(await sub.take()):
                    yield body
        finally:
            self._subs.discard(sub)


def feed_of(runtime: LoopSystemBase) -> DirectoryFeed | None:
    table = runtime.table(DIRECTORY_TABLE)
    feed = table.get(FEED_KEY) if table is not None else None
    return feed if isinstance(feed, DirectoryFeed) else None


async def serve_directory(stream: Stream[Any, Any], runtime: LoopSystemBase) -> None:
    """The dialled side of one `Directory` call: the feed's frames until the link ends."""
    await stream.recv_message()
    feed = feed_of(runtime)
    if feed is None:
        return
    async for body in feed.serve():
        await stream.send_message(Frame(body))


async def follow(link: PeerLink, deliver: Callable[[Any], None]) -> None:
    """The dialling side: the peer's records, told as `DirectoryRecords` until the call ends,
    then `DirectoryEnded` (a malformed frame ends it too)."""
    try:
        async for frame in link.stream(DIRECTORY_METHOD, empty_pb2.Empty(), Frame, None):
            records = decode(frame.data)
            if records is None:
                break
            deliver(DirectoryRecords(link, records))
    except Exception as exc:  # the link broke or closed: the same as its end
        log.debug("cluster directory of %s ended: %r", link.addr, exc)
    finally:
        deliver(DirectoryEnded(link))
