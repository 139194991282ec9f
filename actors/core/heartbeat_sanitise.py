"""The per-heartbeat rules of the heartbeat buffer, applied at intake before anything else.

Rules of this file: what one heartbeat looks like when it is buffered, or that it is dropped, and
which drop reasons it is counted under. Nothing here knows about other heartbeats, chunks in
flight, the buffer's caps or time; `heartbeat_buffer.py` calls `sanitise` once per intake.

The rules, in the order they run (seed: "Heartbeat Batching > Chunked flush"; SPEC_INDEX
HB-06..HB-10, K01, K04). Each reason is counted at most once per heartbeat.

0. Session id. Empty, not text or bytes, or not valid UTF-8: the heartbeat is dropped
   (`heartbeat_invalid`). Checked first although the seed lists it last: a heartbeat that is
   dropped anyway should cost no size walk and no repair, and should not also be counted under
   the reasons below, which the seed defines for heartbeats that are kept.
1. Tag shape (HB-09). Tags that are not a mapping, or a key or value that is neither text nor
   bytes: all tags removed, heartbeat kept (`heartbeat_invalid`). Before the size rules because
   such tags have no size to measure.
2. Snapshot (HB-06). The heartbeat is larger than `Bounds.max_bytes` (what a chunk of one can
   carry under the 3 MiB packing limit) and has a `fleet_snapshot_json`: the snapshot is removed
   (`snapshot_oversize`, only when one was present).
3. Tag bounds (HB-07). Still larger than `max_bytes`, or more than 512 tags, or one key or value
   over 64 KiB, or more than 256 KiB of key and value bytes in total: all tags removed, heartbeat
   kept (`heartbeat_oversize`). Measured on the bytes as received, before any repair, so a
   heartbeat of that size is never repaired: "repairing several MiB of invalid bytes ... 24 ms of
   the single heartbeat buffer process for 3 MiB, which a misbehaving agent could repeat on every
   heartbeat".
4. UTF-8 repair (HB-08). A tag key or value that is not valid UTF-8 gets each invalid sequence
   replaced with U+FFFD (`heartbeat_invalid`). At most 256 KiB is walked, by rule 3. Two keys
   that repair to the same text collapse to one tag, the later one winning (map semantics).
5. Repair can grow a tag (one invalid byte becomes three), so the built message is measured
   again: if it no longer fits, rules 2 and 3 run again on it. A heartbeat whose session id and
   sent time alone do not fit is dropped (`heartbeat_invalid`): no id the server mints is that
   long, and nothing else could make it fit.

Fields the gateway does not know (a newer agent's) are dropped, not forwarded: no rule could
remove them if they made the heartbeat too big.

What the wire gave. The generated `HeartbeatRequest` (upb) refuses invalid UTF-8 in a string field
both when parsing ("String field had bad UTF-8") and when a field is set, so a heartbeat parsed
the strict way only ever meets rules 0, 2 and 3. The agent service keeps such a heartbeat (the
seed keeps it and repairs its tags): it parses it with `decode_lenient`, which reads the same wire
format with every string field as bytes and gives a `RawHeartbeat`; `sanitise` takes either.
`lenient_class` builds that lenient form of any message (gateway/agent/lenient.py reads other
requests with it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import Any, Literal

import attrs
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FileDescriptor

from protos.yuzu.agent.v1.agent_pb2 import HeartbeatRequest

__all__ = [
    "MAX_TAGS",
    "MAX_TAGS_TOTAL_BYTES",
    "MAX_TAG_BYTES",
    "Bounds",
    "LenientHeartbeatRequest",
    "RawHeartbeat",
    "Reason",
    "Sanitised",
    "decode_lenient",
    "len_delimited",
    "lenient_class",
    "sanitise",
    "varint_len",
    "wire_size",
]

# K04: more than 512 status tags and they are all removed.
MAX_TAGS = 512
# "one tag key or value over about 64 KiB": a stock agent's value is at most 64 bytes and its key
# suffix 32 characters, so only a misbehaving sender gets near it.
MAX_TAG_BYTES = 64 * 1024
# "more than about 256 KiB of tag bytes in total": about 70 KiB is what 50 stock plugins send.
MAX_TAGS_TOTAL_BYTES = 256 * 1024

Reason = Literal["snapshot_oversize", "heartbeat_oversize", "heartbeat_invalid"]

_INT64 = (-(2**63), 2**63 - 1)


# --- protobuf sizes -----------------------------------------------------------------------------
# Used where no message can be built yet (raw bytes before repair) and to adjust a known size
# when one field is added or removed. Every field of HeartbeatRequest, Timestamp, the map entry
# and BatchHeartbeatRequest.heartbeats has a number below 16, so its tag is one byte.


def varint_len(n: int) -> int:
    """Bytes of `n` as a protobuf varint; a negative int64 takes ten."""
    if n < 0:
        return 10
    if n < 0x80:
        return 1
    return (n.bit_length() + 6) // 7


def len_delimited(n: int) -> int:
    """Bytes of a length-delimited field (one-byte tag) whose payload is `n` bytes."""
    return 1 + varint_len(n) + n


def _sent_at_field(millis: int | None) -> int:
    if millis is None:
        return 0
    return len_delimited(0 if millis == 0 else 1 + varint_len(millis))


def _tag_field(key_len: int, value_len: int) -> int:
    # upb writes both key and value of a map entry, even when empty.
    return len_delimited(len_delimited(key_len) + len_delimited(value_len))


def _utf8_len(text: str) -> int:
    # surrogatepass: a str from a lenient source may hold lone surrogates; they are measured
    # (3 bytes each, an upper bound of what the repair leaves) instead of raising.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _raw_len(value: str | bytes) -> int:
    return len(value) if isinstance(value, bytes) else _utf8_len(value)


def _base_size(session_id: str | bytes, sent_at_ms: int | None) -> int:
    """The session id and sent_at fields (a session id is never empty here)."""
    return len_delimited(_raw_len(session_id)) + _sent_at_field(sent_at_ms)


def _tag_sizes(tags: Mapping[str | bytes, str | bytes]) -> tuple[int, int, int]:
    """The encoded status_tags fields, the largest key or value and the key and value bytes in
    total, all from the lengths as received."""
    fields = biggest = total = 0
    for key, value in tags.items():
        k, v = _raw_len(key), _raw_len(value)
        biggest = max(biggest, k, v)
        total += k + v
        fields += _tag_field(k, v)
    return fields, biggest, total


def wire_size(
    session_id: str | bytes,
    status_tags: Mapping[str | bytes, str | bytes],
    fleet_snapshot_json: bytes = b"",
    sent_at_ms: int | None = None,
) -> int:
    """The encoded size of a non-empty-id HeartbeatRequest with these fields as received (text as
    UTF-8, bytes as they are): what the rules measure before any repair."""
    snapshot = len_delimited(len(fleet_snapshot_json)) if fleet_snapshot_json else 0
    return _base_size(session_id, sent_at_ms) + _tag_sizes(status_tags)[0] + snapshot


# --- inputs and results -------------------------------------------------------------------------


def _int64_or_none(
    _instance: object, attribute: attrs.Attribute[int | None], value: int | None
) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int or None, got {type(value).__name__}")
    if not _INT64[0] <= value <= _INT64[1]:
        raise ValueError(f"{attribute.name} is outside int64: {value}")


def _as_bytes(value: object) -> bytes:
    # Not bytes() itself: bytes(5) is five zero bytes, not a type error.
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"fleet_snapshot_json must be bytes, got {type(value).__name__}")


def _size_repr(value: object) -> str:
    return f"<{len(value)}>" if isinstance(value, Sized) else f"<{type(value).__name__}>"


@attrs.frozen
class RawHeartbeat:
    """A heartbeat as a lenient decoder (or any source that cannot promise valid UTF-8) gave it.
    `session_id` and the tags' keys and values are text or bytes (anything else is a defect the
    rules count); `status_tags` should be a mapping; `sent_at_ms` is `Timestamp.millis_epoch`,
    None when the field was absent."""

    # The repr shows sizes only: an agent's id, tags and snapshot stay out of crash reports.
    session_id: object = attrs.field(repr=False)
    status_tags: object = attrs.field(factory=dict, repr=_size_repr)
    fleet_snapshot_json: bytes = attrs.field(default=b"", converter=_as_bytes, repr=_size_repr)
    sent_at_ms: int | None = attrs.field(default=None, validator=_int64_or_none)


@attrs.frozen
class Bounds:
    """The per-heartbeat bounds. `max_bytes`: the largest encoded HeartbeatRequest that a
    BatchHeartbeatRequest of one heartbeat can carry under the chunk limit (the buffer derives
    it from the 3 MiB limit and the gateway_node field)."""

    max_bytes: int
    max_tags: int = MAX_TAGS
    max_tag_bytes: int = MAX_TAG_BYTES
    max_tags_total: int = MAX_TAGS_TOTAL_BYTES


@attrs.frozen
class Sanitised:
    """The heartbeat to buffer, encoded once (`session_id` None: dropped), and the drop reasons
    to count, in the order the rules fired. `base` is the HeartbeatRequest without its snapshot;
    the snapshot is kept apart because the buffer may carry, evict or deliver it on its own.
    fleet_snapshot_json is the message's last field, so `base` followed by the snapshot field is
    the heartbeat's encoding."""

    session_id: str | None
    base: bytes = attrs.field(repr=False)
    snapshot: bytes = attrs.field(repr=False)
    reasons: tuple[Reason, ...]

    @property
    def size(self) -> int:
        """The encoded heartbeat's size, snapshot included."""
        return len(self.base) + _snapshot_field(self.snapshot)

    @property
    def message(self) -> HeartbeatRequest | None:
        """The heartbeat, parsed again (tests and tools; the buffer keeps the bytes)."""
        if self.session_id is None:
            return None
        msg = HeartbeatRequest.FromString(self.base)
        msg.fleet_snapshot_json = self.snapshot
        return msg


def _dropped(*reasons: Reason) -> Sanitised:
    return Sanitised(None, b"", b"", reasons)


def _snapshot_field(snapshot: bytes) -> int:
    return len_delimited(len(snapshot)) if snapshot else 0


# --- the rules ----------------------------------------------------------------------------------


def sanitise(heartbeat: HeartbeatRequest | RawHeartbeat, bounds: Bounds) -> Sanitised:
    """Apply the per-heartbeat rules (see the module docstring). Takes ownership of a
    `HeartbeatRequest`: it is changed (its snapshot, unknown fields and any tags the rules
    remove are cleared) and must not be used afterwards."""
    if isinstance(heartbeat, HeartbeatRequest):
        return _sanitise_message(heartbeat, bounds)
    return _sanitise_raw(heartbeat, bounds)


def _tags_over(count: int, biggest: int, total: int, size: int, bounds: Bounds) -> bool:
    """Rule 3. `size`: the heartbeat's size after rule 2."""
    return (
        size > bounds.max_bytes
        or count > bounds.max_tags
        or biggest > bounds.max_tag_bytes
        or total > bounds.max_tags_total
    )


def _sanitise_message(msg: HeartbeatRequest, bounds: Bounds) -> Sanitised:
    """A strictly parsed heartbeat: its text is valid UTF-8 and its tags are a map of text, so
    rules 1 and 4 cannot fire. Encoded once; the sizes come from that encoding."""
    sid = msg.session_id
    if not sid:
        return _dropped("heartbeat_invalid")
    # Fields the gateway does not know are not forwarded (the Erlang gateway decoded and
    # re-encoded, which dropped them too); otherwise an agent could pad a heartbeat past the
    # chunk limit with bytes no rule can remove.
    msg.DiscardUnknownFields()
    reasons: list[Reason] = []
    snapshot = msg.fleet_snapshot_json
    if snapshot:
        msg.ClearField("fleet_snapshot_json")
    base = msg.SerializeToString()
    if snapshot and len(base) + _snapshot_field(snapshot) > bounds.max_bytes:
        snapshot = b""
        reasons.append("snapshot_oversize")
    count = len(msg.status_tags)
    if count:
        sent = msg.sent_at.millis_epoch if msg.HasField("sent_at") else None
        tag_fields = len(base) - _base_size(sid, sent)
        # Encoded tags are never smaller than their raw bytes, so tags that encode within the
        # smaller of the two byte bounds cannot break either: the common case skips the walk.
        within = tag_fields <= min(bounds.max_tag_bytes, bounds.max_tags_total)
        biggest = total = 0
        if count <= bounds.max_tags and not within:
            biggest, total = _measure_text_tags(msg.status_tags, bounds)
        if _tags_over(count, biggest, total, len(base), bounds):
            msg.status_tags.clear()
            base = msg.SerializeToString()
            reasons.append("heartbeat_oversize")
    if len(base) > bounds.max_bytes:
        # Only the session id and sent time are left, and they do not fit.
        return _dropped(*reasons, "heartbeat_invalid")
    return Sanitised(sid, base, snapshot, tuple(reasons))


def _measure_text_tags(tags: Mapping[str, str], bounds: Bounds) -> tuple[int, int]:
    """The largest key or value and the total, in UTF-8 bytes; stops once a bound is broken."""
    biggest = total = 0
    for key, value in tags.items():
        k, v = _utf8_len(key), _utf8_len(value)
        biggest = max(biggest, k, v)
        total += k + v
        if biggest > bounds.max_tag_bytes or total > bounds.max_tags_total:
            break
    return biggest, total


def _session_text(value: object) -> str | None:
    """The session id as text, or None when it is empty or not UTF-8."""
    if isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    elif isinstance(value, str):
        text = value
        try:
            text.encode("utf-8")  # a lone surrogate is not UTF-8
        except UnicodeEncodeError:
            return None
    else:
        return None
    return text or None


def _sanitise_raw(raw: RawHeartbeat, bounds: Bounds) -> Sanitised:
    sid = _session_text(raw.session_id)
    if sid is None:
        return _dropped("heartbeat_invalid")
    reasons: list[Reason] = []
    tags: Mapping[Any, Any] = raw.status_tags if isinstance(raw.status_tags, Mapping) else {}
    shaped = tags is raw.status_tags and all(
        isinstance(k, str | bytes) and isinstance(v, str | bytes) for k, v in tags.items()
    )
    if not shaped:
        tags = {}
        reasons.append("heartbeat_invalid")  # rule 1
    # Rules 2 and 3 on the bytes as received: lengths only, no decoding.
    untagged = _base_size(sid, raw.sent_at_ms)
    tag_fields, biggest, total = _tag_sizes(tags)
    snapshot = raw.fleet_snapshot_json
    if snapshot and untagged + tag_fields + _snapshot_field(snapshot) > bounds.max_bytes:
        snapshot = b""
        reasons.append("snapshot_oversize")
    if tags and _tags_over(len(tags), biggest, total, untagged + tag_fields, bounds):
        tags = {}
        reasons.append("heartbeat_oversize")
    # Rule 4: the repair walk, over at most max_tags_total bytes by now.
    text_tags: dict[str, str] = {}
    repaired = False
    for key, value in tags.items():
        k, k_fixed = _repair(key)
        v, v_fixed = _repair(value)
        repaired = repaired or k_fixed or v_fixed
        text_tags[k] = v
    if repaired:
        reasons.append("heartbeat_invalid")
    msg = HeartbeatRequest(session_id=sid, status_tags=text_tags)
    if raw.sent_at_ms is not None:
        msg.sent_at.millis_epoch = raw.sent_at_ms
        msg.sent_at.SetInParent()  # present even at 0, as on the wire
    base = msg.SerializeToString()
    if snapshot and len(base) + _snapshot_field(snapshot) > bounds.max_bytes:
        # Rule 5: the repair grew the tags past the limit. Only the size rules run again; the
        # tag bounds were met by the bytes as received, which is what they bound.
        snapshot = b""
        reasons.append("snapshot_oversize")
    if len(base) > bounds.max_bytes and text_tags:
        msg.status_tags.clear()
        base = msg.SerializeToString()
        reasons.append("heartbeat_oversize")
    if len(base) > bounds.max_bytes:
        # Only the session id and sent time are left, and they do not fit (rule 3 left no tags
        # to repair, so heartbeat_invalid is not counted twice).
        return _dropped(*reasons, "heartbeat_invalid")
    return Sanitised(sid, base, snapshot, tuple(reasons))


def _repair(value: str | bytes) -> tuple[str, bool]:
    """`value` as valid UTF-8 text, and whether anything had to be replaced."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8"), False
        except UnicodeDecodeError:
            return value.decode("utf-8", "replace"), True
    if value.isascii():
        return value, False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (e.g. from a surrogateescape decode): encoded as the invalid bytes
        # they stand for, then replaced like any other invalid sequence.
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace"), True
    return value, False


# --- the lenient decoder ------------------------------------------------------------------------


def lenient_class(descriptor: Descriptor) -> Any:
    """The message class of `descriptor`'s wire format with every string field as bytes, so
    that text which is not valid UTF-8 parses. A map is a repeated entry message on the wire,
    and a bytes map key is not allowed, so each map is declared as its repeated entry (`key`,
    `value`). Built, with the files it depends on, in a private descriptor pool so it cannot
    clash with the generated classes."""
    pool = descriptor_pool.DescriptorPool()
    _add_loosened(pool, descriptor.file, set())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(descriptor.full_name))


def _add_loosened(
    pool: descriptor_pool.DescriptorPool, file: FileDescriptor, added: set[str]
) -> None:
    if file.name in added:
        return
    added.add(file.name)
    for dependency in file.dependencies:
        _add_loosened(pool, dependency, added)
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    for message in proto.message_type:
        _loosen(message)
    pool.Add(proto)


def _loosen(message: descriptor_pb2.DescriptorProto) -> None:
    message.options.ClearField("map_entry")
    for field in message.field:
        if field.type == field.TYPE_STRING:
            field.type = field.TYPE_BYTES
    for nested in message.nested_type:
        _loosen(nested)


# The lenient message class, public so tests (and tools) can write a heartbeat with bytes that
# the generated class would refuse.
LenientHeartbeatRequest: Any = lenient_class(HeartbeatRequest.DESCRIPTOR)


def decode_lenient(data: bytes) -> RawHeartbeat:
    """Parse a serialised HeartbeatRequest without the UTF-8 check; raises
    `google.protobuf.message.DecodeError` only for a malformed wire format. A repeated tag key
    keeps its last value, as a map does."""
    msg = LenientHeartbeatRequest.FromString(data)
    return RawHeartbeat(
        session_id=msg.session_id,
        status_tags={e.key: e.value for e in msg.status_tags},
        fleet_snapshot_json=msg.fleet_snapshot_json,
        sent_at_ms=msg.sent_at.millis_epoch if msg.HasField("sent_at") else None,
    )
