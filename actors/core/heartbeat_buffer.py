"""The heartbeat buffer: the core of the heartbeat buffer actor.

Rules of this file: which heartbeat is kept, replaced, evicted or dropped, what each flush sends
and what a chunk's result does to the buffer. Nothing here does I/O or reads a clock: time comes
in as `now` (seconds, monotonic) where a deadline needs it, and every method returns effects
(`SendChunk`, `FlushDone`, `Count`, `LogLine`) for the actor. The per-heartbeat rules (snapshot
and tag bounds, UTF-8 repair, session id) live in `heartbeat_sanitise.py` and run first.

Theory of operation (seed: "Heartbeat Batching", "Heartbeat buffer bounds", the heartbeat items
of "Known limits"; SPEC_INDEX HB-01..HB-12, HB-15..HB-18, K01, K39):

* One entry per session, in the order sessions first entered the buffer. A newer heartbeat
  replaces the entry's fields where it stands (`coalesced`) but keeps the newest non-empty
  `fleet_snapshot_json` when it carries none: an agent sends a snapshot once. If the kept
  snapshot would make the merged heartbeat too big for a chunk of one, the snapshot goes
  (`snapshot_oversize`), as at intake.
* Bounds. `max_sessions` (10,000): a heartbeat of a new session at the cap is dropped
  (`buffer_full`); a buffered session is still replaced. `max_bytes` (64 MiB): while over it,
  the oldest snapshot (by when it arrived) is removed (`snapshot_evicted`), and only when no
  entry holds one is the oldest session dropped (`buffer_full`).
* Bytes. An entry is stored encoded, once, at intake: the heartbeat without its snapshot, and the
  snapshot apart (field 4 is the message's last field, so appending it gives the same encoding;
  a snapshot carried, evicted or delivered costs no re-encoding). Its size is what it adds to a
  BatchHeartbeatRequest: the encoded heartbeat plus the repeated field's tag and length prefix.
  `max_bytes` bounds the sum, which is exact for the request and close to the memory held: one
  bytes object per part instead of a message object per tag (docs/heartbeat-buffer.md).
* A flush cycle (`start_flush`, every heartbeat_batch_interval_ms) sends chunks one at a time,
  each `SendChunk` only after the previous chunk's result: at most 8 a cycle, each encoding to at
  most 3 MiB (the request's exact size, gateway_node included), packed oldest first. A chunk is
  the encoded BatchHeartbeatRequest itself, joined from the stored parts. A cycle never overlaps
  another; a tick while one runs does nothing.
* Entries stay in the buffer while their chunk is out; a chunk remembers the version of each
  entry it sent. OK: an entry still at that version is removed; one replaced meanwhile stays
  (the newer heartbeat is not lost) and loses only a snapshot that was the one just delivered.
  Transient failure (any status but the two below, a timeout, no connection): nothing is
  removed, the cycle ends, the next cycle starts again from the oldest. RESOURCE_EXHAUSTED or
  INVALID_ARGUMENT (or the actor's encoder raising): a chunk of several is split in halves and
  the halves are sent first, in order, in this cycle and later ones until the rejected
  heartbeat is alone; it is then dropped (`chunk_rejected`; `heartbeat_invalid` for the
  encoder). Halves are remembered across cycles, so a search deeper than one cycle's budget
  still converges.
* A flush never feeds the circuit breaker and is not gated by it (HB-16): the actor reports
  results here only, and `breaker.classify` answers NEUTRAL for the HEARTBEAT_FLUSH lane.
* Shutdown (`start_shutdown_flush`): the same flush, best effort, 8 chunks and 5 s from its
  start (K39); what is left is reported and lost with the process.
"""

from __future__ import annotations

import enum
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from typing import Literal, get_args

import attrs

from actors.core import Count, LogLine
from actors.core.heartbeat_sanitise import (
    MAX_TAG_BYTES,
    MAX_TAGS,
    MAX_TAGS_TOTAL_BYTES,
    Bounds,
    RawHeartbeat,
    len_delimited,
    sanitise,
    varint_len,
)
from protos.yuzu.agent.v1.agent_pb2 import HeartbeatRequest
from protos.yuzu.gateway.v1.gateway_pb2 import BatchHeartbeatRequest

__all__ = [
    "CHUNK_LIMIT_BYTES",
    "COALESCED",
    "DROPPED",
    "FLUSHED",
    "INITIAL_SERIES",
    "MAX_CHUNKS_PER_FLUSH",
    "REJECTING_STATUSES",
    "SHUTDOWN_FLUSH_CHUNKS",
    "SHUTDOWN_FLUSH_S",
    "SHUTDOWN_LEFT",
    "BufferStatus",
    "Count",
    "DropReason",
    "Effect",
    "FlushDone",
    "HeartbeatBuffer",
    "HeartbeatPolicy",
    "Outcome",
    "SendChunk",
    "entry_bytes",
    "outcome_for_status",
    "policy_from_settings",
]

# --- numbers ------------------------------------------------------------------------------------

# K01: a chunk encodes to at most 3 MiB, so a BatchHeartbeat stays under the server's gRPC receive
# limit of 4,194,304 bytes (a library default the server does not raise) with room to spare.
CHUNK_LIMIT_BYTES = 3 * 1024 * 1024
# At most 8 chunks (about 24 MiB) a cycle: a long backlog drains over several cycles instead of
# holding the one upstream stream the flush has (K18) for a long burst.
MAX_CHUNKS_PER_FLUSH = 8
# K39: the shutdown flush is best effort, at most 5 s and 8 chunks, so a stop is not held up by a
# slow or absent server; what is left costs only older heartbeat state.
SHUTDOWN_FLUSH_S = 5.0
SHUTDOWN_FLUSH_CHUNKS = 8
# C31-C33, the defaults of the three settings (their ranges live in gateway/config/keys).
INTERVAL_S = 1.0
MAX_SESSIONS = 10_000
MAX_BYTES = 64 * 1024 * 1024

# RESOURCE_EXHAUSTED (8) and INVALID_ARGUMENT (3) on BatchHeartbeat are a verdict on the request,
# not on the server's health (U01): the only source of 8 here is the receive size limit.
REJECTING_STATUSES = frozenset({3, 8})


def _at_least(lo: float) -> Callable[[object, attrs.Attribute[float], float], None]:
    def check(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
        if not value >= lo:
            raise ValueError(f"{attribute.name} must be >= {lo}, got {value!r}")

    return check


@attrs.frozen
class HeartbeatPolicy:
    """The buffer's numbers; the reasons are at the constants above. The tag bounds are the
    sanitiser's (heartbeat_sanitise.py). Tests shrink them; the gateway uses the defaults and
    the three settings."""

    interval_s: float = attrs.field(default=INTERVAL_S, validator=_at_least(0.001))
    max_sessions: int = attrs.field(default=MAX_SESSIONS, validator=_at_least(1))
    max_bytes: int = attrs.field(default=MAX_BYTES, validator=_at_least(1))
    chunk_limit_bytes: int = attrs.field(default=CHUNK_LIMIT_BYTES, validator=_at_least(64))
    max_chunks: int = attrs.field(default=MAX_CHUNKS_PER_FLUSH, validator=_at_least(1))
    max_tags: int = attrs.field(default=MAX_TAGS, validator=_at_least(0))
    max_tag_bytes: int = attrs.field(default=MAX_TAG_BYTES, validator=_at_least(0))
    max_tags_total: int = attrs.field(default=MAX_TAGS_TOTAL_BYTES, validator=_at_least(0))
    shutdown_s: float = attrs.field(default=SHUTDOWN_FLUSH_S, validator=_at_least(0.0))
    shutdown_chunks: int = attrs.field(default=SHUTDOWN_FLUSH_CHUNKS, validator=_at_least(1))


def policy_from_settings(
    *,
    heartbeat_batch_interval_ms: int,
    max_heartbeat_buffer: int,
    max_heartbeat_buffer_bytes: int,
) -> HeartbeatPolicy:
    """The policy from the three settings as the configuration resolved them (in range, or the
    default after a WARN naming the key). Read once, when the buffer actor starts."""
    return HeartbeatPolicy(
        interval_s=heartbeat_batch_interval_ms / 1000.0,
        max_sessions=max_heartbeat_buffer,
        max_bytes=max_heartbeat_buffer_bytes,
    )


def entry_bytes(message_size: int) -> int:
    """What a HeartbeatRequest of `message_size` encoded bytes adds to a BatchHeartbeatRequest:
    the repeated field's one-byte tag, the length prefix and the message."""
    return 1 + varint_len(message_size) + message_size


def _largest_message(room: int) -> int:
    """The largest message size whose `entry_bytes` is at most `room` (-1: none)."""
    size = room - 2
    while size >= 0 and entry_bytes(size) > room:
        size -= 1
    return size


class Outcome(enum.Enum):
    """How a chunk's BatchHeartbeat ended, as the actor saw it."""

    OK = "ok"
    # Unreachable, timeout, TLS, any status not in REJECTING_STATUSES, an exception out of the
    # client: the server's trouble, so the data stays.
    TRANSIENT = "transient"
    REJECTED = "rejected"  # RESOURCE_EXHAUSTED or INVALID_ARGUMENT: the request itself
    UNENCODABLE = "unencodable"  # the actor could not build or serialise the request


def outcome_for_status(code: int) -> Outcome:
    """The outcome of a gRPC status the server answered."""
    if code == 0:
        return Outcome.OK
    return Outcome.REJECTED if code in REJECTING_STATUSES else Outcome.TRANSIENT


# --- effects ------------------------------------------------------------------------------------

COALESCED = "yuzu_gw_heartbeat_coalesced_total"  # M01
DROPPED = "yuzu_gw_heartbeat_buffer_dropped_total"  # M02, label reason

DropReason = Literal[
    "chunk_rejected",
    "snapshot_oversize",
    "heartbeat_oversize",
    "heartbeat_invalid",
    "buffer_full",
    "snapshot_evicted",
]

# Series created at 0 when the actor starts (the seed does not say; an absent series should never
# have to mean "none yet").
INITIAL_SERIES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (COALESCED, ()),
    *((DROPPED, (("reason", reason),)) for reason in get_args(DropReason)),
)

# L01, quoted from the seed: INFO only when the flush needed more than one chunk, else DEBUG.
FLUSHED = "Flushed {n} heartbeats in {m} chunk(s)"
# Ours: the seed says only that what the shutdown flush leaves is lost with the process.
SHUTDOWN_LEFT = (
    "Planned stop: {left} buffered heartbeat session(s) not sent by the shutdown flush "
    "({why}); they are lost with the process"
)


@attrs.frozen
class SendChunk:
    """Send one BatchHeartbeat of `count` heartbeats. `payload` is the encoded
    BatchHeartbeatRequest, gateway_node included (`size` bytes, at most the chunk limit): send it
    as it is through a pass-through codec, or parse it with `request()`. Report the result with
    `chunk_result(chunk_id, ...)`. `deadline` (the shutdown flush only): give the call no more
    time than that."""

    chunk_id: int
    # Not in the repr: a snapshot can be MiBs, and tags and session ids stay out of logs.
    payload: bytes = attrs.field(repr=lambda data: f"<{len(data)} bytes>")
    count: int = 0
    gateway_node: str = ""
    deadline: float | None = None
    # A half (or less) of a rejected chunk, sent apart from other heartbeats.
    half: bool = False

    @property
    def size(self) -> int:
        return len(self.payload)

    def request(self) -> BatchHeartbeatRequest:
        return BatchHeartbeatRequest.FromString(self.payload)

    @property
    def heartbeats(self) -> tuple[HeartbeatRequest, ...]:
        """The heartbeats, parsed (tests and tools; the flush itself never needs this)."""
        return tuple(self.request().heartbeats)


EndReason = Literal["drained", "budget", "transient", "deadline"]


@attrs.frozen
class FlushDone:
    """A flush cycle ended: `delivered` heartbeats in `chunks` accepted chunks, `dropped` single
    heartbeats rejected, `left` sessions still buffered, and why it stopped (`drained`: nothing
    left that this cycle may send; `budget`: 8 chunks; `transient`: a chunk failed; `deadline`:
    the shutdown flush's 5 s)."""

    delivered: int
    chunks: int
    dropped: int
    left: int
    why: EndReason
    shutdown: bool


Effect = SendChunk | FlushDone | Count | LogLine


@attrs.frozen
class BufferStatus:
    """Counts only, for format_status and the console (HB-18, CR-09): no session id, tag or
    snapshot can appear here."""

    sessions: int
    bytes: int
    snapshots: int
    max_sessions: int
    max_bytes: int
    flush: Literal["idle", "running", "shutdown", "stopped"]
    chunk_out_heartbeats: int
    split_groups: int
    coalesced: int
    dropped: tuple[tuple[str, int], ...]
    delivered_total: int
    chunks_total: int


# --- internals ----------------------------------------------------------------------------------


@attrs.frozen
class _Entry:
    base: bytes = attrs.field(repr=False)  # the encoded heartbeat without its snapshot
    snapshot: bytes = attrs.field(repr=False)
    version: int  # the intake that wrote it; a newer heartbeat of the session moves it
    snap_seq: int  # the intake that brought its snapshot; 0 = none
    # Derived once: the packing loop reads them for every entry of every chunk.
    size: int = attrs.field(init=False)  # the encoded HeartbeatRequest's size
    cost: int = attrs.field(init=False)  # what it adds to a BatchHeartbeatRequest

    def __attrs_post_init__(self) -> None:
        snapshot = len_delimited(len(self.snapshot)) if self.snapshot else 0
        object.__setattr__(self, "size", len(self.base) + snapshot)
        object.__setattr__(self, "cost", entry_bytes(self.size))

    def parts(self) -> list[bytes]:
        """This heartbeat as one element of BatchHeartbeatRequest.heartbeats."""
        return [_HEARTBEATS_TAG, _varint(self.size), *self._message_parts()]

    def encoded(self) -> bytes:
        """The encoded HeartbeatRequest."""
        return b"".join(self._message_parts())

    def _message_parts(self) -> list[bytes]:
        if not self.snapshot:
            return [self.base]
        return [self.base, _SNAPSHOT_TAG, _varint(len(self.snapshot)), self.snapshot]


@attrs.frozen
class _Sent:
    session_id: str
    version: int
    snap_seq: int


@attrs.frozen
class _Chunk:
    chunk_id: int
    members: tuple[_Sent, ...]
    from_group: bool


@attrs.define
class _Cycle:
    shutdown: bool
    budget: int  # chunks this cycle may still send
    deadline: float | None
    # The newest intake a cycle may send (None: any, the shutdown flush's). What arrives while
    # a cycle runs waits for the next one: cut from the live buffer, a cycle went on packing
    # the few heartbeats each chunk's round trip brought, 8 small calls where one would do.
    upto: int | None
    out: _Chunk | None = None
    attempted: set[str] = attrs.field(factory=set)  # sent in this cycle: not packed again
    delivered: int = 0
    chunks_ok: int = 0
    dropped: int = 0


# Wire tags (field number << 3 | length-delimited): BatchHeartbeatRequest.heartbeats = 1,
# HeartbeatRequest.fleet_snapshot_json = 4.
_HEARTBEATS_TAG = b"\x0a"
_SNAPSHOT_TAG = b"\x22"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# --- the core -----------------------------------------------------------------------------------


@attrs.define
class HeartbeatBuffer:
    """One entry per session, bounded in sessions and bytes, flushed in chunks. No clock
    inside; `gateway_node` is stamped on every request and counted in every chunk's size."""

    policy: HeartbeatPolicy = attrs.field(factory=HeartbeatPolicy)
    gateway_node: str = attrs.field(kw_only=True, default="")
    # Plain counts for status and tests; the actor turns the `Count` effects into metrics.
    counts: Counter[tuple[str, tuple[tuple[str, str], ...]]] = attrs.field(
        init=False, factory=Counter
    )
    delivered_total: int = attrs.field(init=False, default=0)
    chunks_total: int = attrs.field(init=False, default=0)
    _bounds: Bounds = attrs.field(init=False)
    _envelope: bytes = attrs.field(init=False)  # the encoded gateway_node field
    _entries: OrderedDict[str, _Entry] = attrs.field(init=False, factory=OrderedDict)
    # Sessions holding a snapshot, oldest snapshot first: the byte cap's eviction order.
    _snaps: OrderedDict[str, None] = attrs.field(init=False, factory=OrderedDict)
    _bytes: int = attrs.field(init=False, default=0)
    _seq: int = attrs.field(init=False, default=0)
    # Halves of rejected chunks still to send, each packed apart from everything else.
    _groups: deque[list[str]] = attrs.field(init=False, factory=deque)
    _grouped: set[str] = attrs.field(init=False, factory=set)
    _cycle: _Cycle | None = attrs.field(init=False, default=None)
    _chunk_seq: int = attrs.field(init=False, default=0)
    _stopped: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        envelope = BatchHeartbeatRequest(gateway_node=self.gateway_node)
        self._envelope = envelope.SerializeToString()
        largest = _largest_message(self.policy.chunk_limit_bytes - len(self._envelope))
        if largest < 1:
            raise ValueError("chunk_limit_bytes leaves no room for a heartbeat")
        p = self.policy
        self._bounds = Bounds(largest, p.max_tags, p.max_tag_bytes, p.max_tags_total)

    # -- reading -----------------------------------------------------------------------------

    @property
    def sessions(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """The encoded bytes retained: what `max_bytes` bounds."""
        return self._bytes

    @property
    def max_heartbeat_bytes(self) -> int:
        """The largest HeartbeatRequest a chunk of one can carry."""
        return self._bounds.max_bytes

    @property
    def flushing(self) -> bool:
        return self._cycle is not None

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def deadline(self) -> float | None:
        """When the actor should call `poll` (the shutdown flush's end), or None."""
        return self._cycle.deadline if self._cycle is not None else None

    def heartbeats(self) -> list[HeartbeatRequest]:
        """The buffered heartbeats, oldest session first, parsed (tests and tools)."""
        return [HeartbeatRequest.FromString(e.encoded()) for e in self._entries.values()]

    def status(self) -> BufferStatus:
        c = self._cycle
        flush: Literal["idle", "running", "shutdown", "stopped"]
        if self._stopped:
            flush = "stopped"
        elif c is None:
            flush = "idle"
        else:
            flush = "shutdown" if c.shutdown else "running"
        dropped = tuple(
            (reason, self.counts[(DROPPED, (("reason", reason),))])
            for reason in get_args(DropReason)
        )
        return BufferStatus(
            sessions=len(self._entries),
            bytes=self._bytes,
            snapshots=len(self._snaps),
            max_sessions=self.policy.max_sessions,
            max_bytes=self.policy.max_bytes,
            flush=flush,
            chunk_out_heartbeats=len(c.out.members) if c is not None and c.out else 0,
            split_groups=len(self._groups),
            coalesced=self.counts[(COALESCED, ())],
            dropped=dropped,
            delivered_total=self.delivered_total,
            chunks_total=self.chunks_total,
        )

    # -- intake ------------------------------------------------------------------------------

    def intake(self, heartbeat: HeartbeatRequest | RawHeartbeat) -> list[Effect]:
        """An admitted heartbeat. Takes ownership of a `HeartbeatRequest` (it is changed and
        must not be used afterwards); a `RawHeartbeat` is what a lenient decode gave."""
        clean = sanitise(heartbeat, self._bounds)
        effects: list[Effect] = [self._drop(reason) for reason in clean.reasons]
        sid = clean.session_id
        if sid is None:
            return effects
        old = self._entries.get(sid)
        if old is None and len(self._entries) >= self.policy.max_sessions:
            effects.append(self._drop("buffer_full"))
            return effects
        self._seq += 1
        base, snapshot = clean.base, clean.snapshot
        snap_seq = self._seq if snapshot else 0
        if old is not None:
            effects.append(self._count(COALESCED))
            if not snap_seq and old.snap_seq:
                if len(base) + len_delimited(len(old.snapshot)) <= self._bounds.max_bytes:
                    snapshot, snap_seq = old.snapshot, old.snap_seq
                else:
                    # The same rule as at intake: a snapshot that makes the heartbeat too big
                    # for a chunk of one is removed.
                    effects.append(self._drop("snapshot_oversize"))
        self._store(sid, _Entry(base, snapshot, self._seq, snap_seq))
        effects += self._enforce_byte_cap()
        return effects

    # -- flushing ----------------------------------------------------------------------------

    def start_flush(self, now: float) -> list[Effect]:
        """The flush timer fired. Nothing when a cycle is already running (cycles never
        overlap), after the shutdown flush, or when nothing is buffered."""
        if self._cycle is not None or self._stopped or not self._entries:
            return []
        self._cycle = _Cycle(
            shutdown=False, budget=self.policy.max_chunks, deadline=None, upto=self._seq
        )
        return self._advance(now)

    def start_shutdown_flush(self, now: float) -> list[Effect]:
        """The planned stop's flush: best effort, `shutdown_chunks` more chunks within
        `shutdown_s`. A cycle already running becomes this flush (its chunk out is not counted
        against the budget). Ends with a `FlushDone(shutdown=True)`; arm a timer for `deadline`
        and call `poll` then."""
        if self._stopped:
            return []
        deadline = now + self.policy.shutdown_s
        c = self._cycle
        if c is not None:
            c.shutdown, c.budget, c.deadline = True, self.policy.shutdown_chunks, deadline
            c.upto = None
            return []  # a cycle exists only while its chunk is out: its result goes on
        self._cycle = _Cycle(
            shutdown=True, budget=self.policy.shutdown_chunks, deadline=deadline, upto=None
        )
        return self._advance(now)

    def poll(self, now: float) -> list[Effect]:
        """The shutdown flush's deadline timer: end it even with a chunk still out (that
        chunk's result is then ignored)."""
        c = self._cycle
        if c is None or c.deadline is None or now < c.deadline:
            return []
        return self._finish("deadline")

    def chunk_result(self, chunk_id: int, outcome: Outcome, now: float) -> list[Effect]:
        """The result of `SendChunk(chunk_id)`; returns the next chunk or the end of the
        cycle. A result for a chunk that is not out (a late one after `poll`) is ignored."""
        c = self._cycle
        if c is None or c.out is None or c.out.chunk_id != chunk_id:
            return []
        chunk, c.out = c.out, None
        effects: list[Effect] = []
        if outcome is Outcome.OK:
            self._settle(chunk)
            c.delivered += len(chunk.members)
            c.chunks_ok += 1
            self.delivered_total += len(chunk.members)
            self.chunks_total += 1
        elif outcome is Outcome.TRANSIENT:
            if chunk.from_group:
                self._regroup([m.session_id for m in chunk.members])
            return self._finish("transient")
        elif len(chunk.members) == 1:
            # Rejected alone: it is the heartbeat the server refuses. Dropped so it cannot block
            # the newer heartbeats behind it.
            reason: DropReason = (
                "heartbeat_invalid" if outcome is Outcome.UNENCODABLE else "chunk_rejected"
            )
            effects.append(self._drop(reason))
            self._settle(chunk)
            c.dropped += 1
        else:
            sids = [m.session_id for m in chunk.members]
            c.attempted.difference_update(sids)
            half = (len(sids) + 1) // 2
            self._regroup(sids[half:])
            self._regroup(sids[:half])
        return effects + self._advance(now)

    # -- internals: the cycle ----------------------------------------------------------------

    def _advance(self, now: float) -> list[Effect]:
        """No chunk is out: send the next one, or end the cycle."""
        c = self._cycle
        assert c is not None and c.out is None
        if c.deadline is not None and now >= c.deadline:
            return self._finish("deadline")
        if c.budget <= 0:
            return self._finish("budget")
        chunk = self._pack(c)
        if chunk is None:
            return self._finish("drained")
        c.budget -= 1
        c.out = chunk
        parts: list[bytes] = []
        for m in chunk.members:
            parts += self._entries[m.session_id].parts()
        parts.append(self._envelope)  # field 2 after the heartbeats, as protobuf orders them
        payload = b"".join(parts)
        count = len(chunk.members)
        n = chunk.chunk_id
        return [SendChunk(n, payload, count, self.gateway_node, c.deadline, chunk.from_group)]

    def _finish(self, why: EndReason) -> list[Effect]:
        c = self._cycle
        assert c is not None
        self._cycle = None
        effects: list[Effect] = []
        if c.chunks_ok:
            level = "info" if c.chunks_ok > 1 else "debug"
            effects.append(LogLine(level, FLUSHED.format(n=c.delivered, m=c.chunks_ok)))
        left = len(self._entries)
        if c.shutdown:
            self._stopped = True
            if left:
                effects.append(LogLine("warning", SHUTDOWN_LEFT.format(left=left, why=why)))
        effects.append(FlushDone(c.delivered, c.chunks_ok, c.dropped, left, why, c.shutdown))
        return effects

    def _pack(self, c: _Cycle) -> _Chunk | None:
        """The next chunk: the oldest remembered half first, else the oldest entries not yet
        sent in this cycle, as many as fit, stopping at the first that does not (oldest first,
        never skipping ahead)."""
        room = self.policy.chunk_limit_bytes - len(self._envelope)
        while self._groups:
            # A sid leaves _grouped when it is sent or its entry is removed, so stale copies in
            # a list are skipped here.
            group = [sid for sid in self._groups.popleft() if sid in self._grouped]
            members = self._fit(group, room, skip=frozenset())
            if not members:
                continue
            taken = {m.session_id for m in members}
            self._grouped.difference_update(taken)
            # What did not fit stays a group of its own, still ahead of everything else.
            self._regroup([sid for sid in group if sid not in taken])
            c.attempted.update(taken)
            return self._new_chunk(members, from_group=True)
        members = self._fit(self._entries, room, skip=c.attempted | self._grouped, upto=c.upto)
        if not members:
            return None
        c.attempted.update(m.session_id for m in members)
        return self._new_chunk(members, from_group=False)

    def _fit(
        self, sids: Iterable[str], room: int, skip: AbstractSet[str], upto: int | None = None
    ) -> list[_Sent]:
        """The buffered sessions of `sids`, in order, until the next one would not fit; none
        written by an intake after `upto`."""
        members: list[_Sent] = []
        used = 0
        for sid in sids:
            entry = self._entries.get(sid)
            if entry is None or sid in skip or (upto is not None and entry.version > upto):
                continue
            if used + entry.cost > room:
                break
            used += entry.cost
            members.append(_Sent(sid, entry.version, entry.snap_seq))
        return members

    def _new_chunk(self, members: list[_Sent], *, from_group: bool) -> _Chunk:
        self._chunk_seq += 1
        return _Chunk(self._chunk_seq, tuple(members), from_group)

    def _regroup(self, sids: list[str]) -> None:
        """Remember the buffered sessions of `sids` as a group to send next, apart from other
        entries."""
        present = [sid for sid in sids if sid in self._entries]
        if present:
            self._groups.appendleft(present)
            self._grouped.update(present)

    def _settle(self, chunk: _Chunk) -> None:
        """What was sent is done with (delivered, or dropped as rejected): remove each entry
        still at the version sent. An entry replaced meanwhile holds a newer heartbeat and
        stays; if the snapshot it carries is the one that was sent, that snapshot goes."""
        for sent in chunk.members:
            entry = self._entries.get(sent.session_id)
            if entry is None:
                continue  # evicted while out
            if entry.version == sent.version:
                self._remove(sent.session_id)
            elif sent.snap_seq and entry.snap_seq == sent.snap_seq:
                self._strip_snapshot(sent.session_id)

    # -- internals: entries and bytes --------------------------------------------------------

    def _store(self, sid: str, entry: _Entry) -> None:
        old = self._entries.get(sid)
        if old is not None:
            self._bytes -= old.cost
        self._entries[sid] = entry  # a replaced session keeps its place
        self._bytes += entry.cost
        if entry.snap_seq == 0:
            self._snaps.pop(sid, None)
        elif old is None or old.snap_seq != entry.snap_seq:
            self._snaps[sid] = None
            self._snaps.move_to_end(sid)  # a new snapshot is the newest

    def _remove(self, sid: str) -> None:
        entry = self._entries.pop(sid)
        self._bytes -= entry.cost
        self._snaps.pop(sid, None)
        # A later heartbeat of this session is a new entry, not a member of an old half.
        self._grouped.discard(sid)

    def _strip_snapshot(self, sid: str) -> None:
        entry = self._entries[sid]
        self._store(sid, _Entry(entry.base, b"", entry.version, 0))

    def _enforce_byte_cap(self) -> list[Effect]:
        effects: list[Effect] = []
        while self._bytes > self.policy.max_bytes:
            if self._snaps:
                self._strip_snapshot(next(iter(self._snaps)))
                effects.append(self._drop("snapshot_evicted"))
            else:
                self._remove(next(iter(self._entries)))
                effects.append(self._drop("buffer_full"))
        return effects

    # -- internals: counts -------------------------------------------------------------------

    def _drop(self, reason: DropReason) -> Count:
        return self._count(DROPPED, reason=reason)

    def _count(self, family: str, **labels: str) -> Count:
        pairs = tuple(labels.items())
        self.counts[(family, pairs)] += 1
        return Count(family, pairs)
