"""The heartbeat buffer core against the seed's rules (SPEC_INDEX HB-01..HB-12, HB-15..HB-18,
K01, K04, K39).

Example tests use the specification's own numbers (3 MiB chunks, 512 tags, 64 KiB, 256 KiB).
The state machine shrinks them and drives arbitrary heartbeats (valid, oversize, invalid UTF-8,
malformed), flushes, server answers and the shutdown flush, and checks the buffer after every
step against a plain model: a list of entries, a reference sanitiser written from the rules, and
sizes taken from protobuf's own ByteSize.
"""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal.encoder import _VarintBytes
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from actors.core import LogLine
from actors.core import heartbeat_sanitise as hs
from actors.core.breaker import Lane, ResultKind, Verdict, classify, classify_status
from actors.core.heartbeat_buffer import (
    CHUNK_LIMIT_BYTES,
    COALESCED,
    DROPPED,
    FLUSHED,
    INITIAL_SERIES,
    Count,
    FlushDone,
    HeartbeatBuffer,
    HeartbeatPolicy,
    Outcome,
    SendChunk,
    entry_bytes,
    outcome_for_status,
    policy_from_settings,
)
from actors.core.heartbeat_sanitise import (
    LenientHeartbeatRequest,
    RawHeartbeat,
    decode_lenient,
    sanitise,
)
from protos.yuzu.agent.v1.agent_pb2 import HeartbeatRequest
from protos.yuzu.gateway.v1.gateway_pb2 import BatchHeartbeatRequest

NODE = "gw-test-node@host"
KiB = 1024
MiB = 1024 * 1024


def hb(sid: str, tags: dict | None = None, snap: bytes = b"", sent: int | None = 1):
    msg = HeartbeatRequest(session_id=sid, status_tags=tags or {}, fleet_snapshot_json=snap)
    if sent is not None:
        msg.sent_at.millis_epoch = sent
        msg.sent_at.SetInParent()
    return msg


def copy(msg: HeartbeatRequest) -> HeartbeatRequest:
    # `intake` owns the message it is given and may change it.
    return HeartbeatRequest.FromString(msg.SerializeToString())


def buffer(**policy) -> HeartbeatBuffer:
    return HeartbeatBuffer(HeartbeatPolicy(**policy), gateway_node=NODE)


def sends(effects: list) -> list[SendChunk]:
    return [e for e in effects if isinstance(e, SendChunk)]


def one_send(effects: list) -> SendChunk:
    (send,) = sends(effects)
    return send


def done(effects: list) -> FlushDone | None:
    found = [e for e in effects if isinstance(e, FlushDone)]
    assert len(found) <= 1
    return found[0] if found else None


def dropped(effects: list) -> list[str]:
    return [
        dict(e.labels)["reason"] for e in effects if isinstance(e, Count) and e.family == DROPPED
    ]


def coalesced(effects: list) -> int:
    return sum(1 for e in effects if isinstance(e, Count) and e.family == COALESCED)


def lines(effects: list) -> list[tuple[str, str]]:
    return [(e.level, e.text) for e in effects if isinstance(e, LogLine)]


def sids(send: SendChunk) -> list[str]:
    return [h.session_id for h in send.heartbeats]


def run_cycle(buf: HeartbeatBuffer, answer, now: float = 0.0) -> tuple[list[SendChunk], list]:
    """One flush cycle, each chunk answered by `answer(send) -> Outcome`."""
    effects = buf.start_flush(now)
    chunks: list[SendChunk] = []
    everything = list(effects)
    while (send := (sends(effects) or [None])[0]) is not None:
        chunks.append(send)
        assert send.request().ByteSize() == send.size <= CHUNK_LIMIT_BYTES
        effects = buf.chunk_result(send.chunk_id, answer(send), now)
        everything += effects
    return chunks, everything


def ok(_send: SendChunk) -> Outcome:
    return Outcome.OK


# --- numbers ------------------------------------------------------------------------------------


def test_policy_defaults_and_settings() -> None:
    p = HeartbeatPolicy()
    assert (p.max_sessions, p.max_bytes, p.chunk_limit_bytes, p.max_chunks) == (
        10_000,
        64 * MiB,
        3_145_728,
        8,
    )
    assert (p.max_tags, p.max_tag_bytes, p.max_tags_total) == (512, 65_536, 262_144)
    assert (p.shutdown_s, p.shutdown_chunks, p.interval_s) == (5.0, 8, 1.0)
    q = policy_from_settings(
        heartbeat_batch_interval_ms=250, max_heartbeat_buffer=7, max_heartbeat_buffer_bytes=2 * MiB
    )
    assert (q.interval_s, q.max_sessions, q.max_bytes) == (0.25, 7, 2 * MiB)
    with pytest.raises(ValueError):
        HeartbeatPolicy(max_sessions=0)


def test_status_codes_that_mean_drop_this_heartbeat() -> None:
    assert outcome_for_status(0) is Outcome.OK
    assert outcome_for_status(8) is Outcome.REJECTED  # RESOURCE_EXHAUSTED
    assert outcome_for_status(3) is Outcome.REJECTED  # INVALID_ARGUMENT
    for code in (1, 2, 4, 5, 9, 13, 14, 16):
        assert outcome_for_status(code) is Outcome.TRANSIENT


def test_a_flush_never_feeds_the_breaker() -> None:
    # HB-16: the actor reports flush results to the buffer only; the breaker's own table agrees.
    for code in (0, 3, 8, 14):
        assert classify_status(code, Lane.HEARTBEAT_FLUSH) is Verdict.NEUTRAL
    assert classify(ResultKind.TRANSPORT, Lane.HEARTBEAT_FLUSH) is Verdict.NEUTRAL


def test_initial_series() -> None:
    assert (COALESCED, ()) in INITIAL_SERIES
    reasons = {dict(labels)["reason"] for family, labels in INITIAL_SERIES if family == DROPPED}
    assert reasons == {
        "chunk_rejected",
        "snapshot_oversize",
        "heartbeat_oversize",
        "heartbeat_invalid",
        "buffer_full",
        "snapshot_evicted",
    }


def test_the_largest_heartbeat_fills_a_chunk_exactly() -> None:
    buf = buffer()
    biggest = buf.max_heartbeat_bytes
    room = CHUNK_LIMIT_BYTES - BatchHeartbeatRequest(gateway_node=NODE).ByteSize()
    assert entry_bytes(biggest) <= room < entry_bytes(biggest + 1)
    # A heartbeat of exactly that size is kept whole and its chunk is exactly 3 MiB or just under.
    probe = hb("s", snap=b"")
    snap = b"x" * (biggest - probe.ByteSize() - 5)
    msg = hb("s", snap=snap)
    msg.fleet_snapshot_json = b"x" * (len(snap) + biggest - msg.ByteSize())
    assert msg.ByteSize() == biggest
    fitting = len(msg.fleet_snapshot_json)
    assert buf.intake(msg) == []  # the buffer owns `msg` from here on
    (send,), _ = run_cycle(buf, ok)
    assert send.request().ByteSize() == send.size <= CHUNK_LIMIT_BYTES
    assert send.size >= CHUNK_LIMIT_BYTES - 4
    assert len(send.heartbeats[0].fleet_snapshot_json) == fitting
    # One byte more and the snapshot goes.
    msg = hb("s", snap=b"x" * (fitting + 1))
    assert dropped(buf.intake(msg)) == ["snapshot_oversize"]


# --- one entry per session ----------------------------------------------------------------------


def test_a_newer_heartbeat_replaces_but_keeps_the_newest_snapshot() -> None:
    buf = buffer()
    buf.intake(hb("a", {"k": "1"}, snap=b"snap-1", sent=10))
    buf.intake(hb("b", {"k": "b"}, sent=11))
    effects = buf.intake(hb("a", {"k": "2"}, sent=20))  # no snapshot: the last one is kept
    assert coalesced(effects) == 1 and dropped(effects) == []
    a, _ = buf.heartbeats()  # "a" keeps its place ahead of "b"
    assert (a.session_id, dict(a.status_tags), a.sent_at.millis_epoch) == ("a", {"k": "2"}, 20)
    assert a.fleet_snapshot_json == b"snap-1"
    buf.intake(hb("a", {}, snap=b"snap-2", sent=30))  # a new snapshot wins
    buf.intake(hb("a", {"k": "4"}, sent=40))
    a = buf.heartbeats()[0]
    assert a.fleet_snapshot_json == b"snap-2" and dict(a.status_tags) == {"k": "4"}
    assert buf.counts[(COALESCED, ())] == 3 and buf.sessions == 2
    assert buf.bytes == sum(entry_bytes(m.ByteSize()) for m in buf.heartbeats())


def test_a_kept_snapshot_that_no_longer_fits_is_removed() -> None:
    buf = buffer()
    buf.intake(hb("a", snap=b"s" * (3 * MiB - 200)))
    big_tags = {f"k{i}": "v" * 60 * KiB for i in range(3)}  # about 180 KiB: within the bounds
    effects = buf.intake(hb("a", big_tags))
    assert dropped(effects) == ["snapshot_oversize"]
    (a,) = buf.heartbeats()
    assert a.fleet_snapshot_json == b"" and len(a.status_tags) == 3


# --- bounds -------------------------------------------------------------------------------------


def test_session_cap_drops_new_sessions_only() -> None:
    buf = buffer(max_sessions=2)
    buf.intake(hb("a"))
    buf.intake(hb("b"))
    assert dropped(buf.intake(hb("c"))) == ["buffer_full"]
    assert coalesced(buf.intake(hb("a", {"n": "2"}))) == 1  # a known session still replaces
    assert [m.session_id for m in buf.heartbeats()] == ["a", "b"]


def test_byte_cap_evicts_oldest_snapshot_first_then_oldest_session() -> None:
    buf = buffer(max_bytes=1 * MiB)
    buf.intake(hb("a", snap=b"A" * 400 * KiB))
    buf.intake(hb("b", snap=b"B" * 400 * KiB))
    buf.intake(hb("a", snap=b"C" * 400 * KiB))  # "a" now holds the newest snapshot
    effects = buf.intake(hb("c", snap=b"D" * 400 * KiB))
    assert dropped(effects) == ["snapshot_evicted"]
    by_sid = {m.session_id: m for m in buf.heartbeats()}
    assert by_sid["b"].fleet_snapshot_json == b""  # b's was the oldest snapshot
    assert by_sid["a"].fleet_snapshot_json == b"C" * 400 * KiB
    assert buf.bytes <= 1 * MiB
    # Only sessions without snapshots left to evict: the oldest session goes.
    small = buffer(max_bytes=1 * MiB)
    tags = {f"k{i}": "v" * 60 * KiB for i in range(4)}  # about 240 KiB each, within the bounds
    for sid in "abcde":
        effects = small.intake(hb(sid, tags))
    assert dropped(effects) == ["buffer_full"]
    assert [m.session_id for m in small.heartbeats()] == ["b", "c", "d", "e"]
    assert small.bytes <= 1 * MiB


# --- per-heartbeat rules with the specification's numbers ---------------------------------------


def reasons_of(heartbeat) -> tuple:
    return sanitise(heartbeat, hs.Bounds(HeartbeatBuffer(gateway_node=NODE).max_heartbeat_bytes))


def test_oversize_snapshot_is_removed_and_counted_only_when_present() -> None:
    clean = reasons_of(hb("s", {"k": "v"}, snap=b"x" * (3 * MiB)))
    assert clean.reasons == ("snapshot_oversize",)
    assert clean.message.fleet_snapshot_json == b"" and dict(clean.message.status_tags) == {
        "k": "v"
    }
    # Larger than the chunk limit without a snapshot: tags go, and snapshot_oversize is not
    # counted because there was no snapshot.
    clean = reasons_of(hb("s", {f"k{i}": "v" * 60 * KiB for i in range(60)}))
    assert clean.reasons == ("heartbeat_oversize",)
    assert len(clean.message.status_tags) == 0 and clean.message.session_id == "s"


def test_snapshot_then_tags_in_that_order() -> None:
    tags = {f"k{i}": "v" * 60 * KiB for i in range(60)}  # 3.6 MiB of tags
    clean = reasons_of(hb("s", tags, snap=b"x" * 100))
    assert clean.reasons == ("snapshot_oversize", "heartbeat_oversize")
    assert clean.message.ByteSize() == clean.size
    # A snapshot that fits once the tags are gone is still removed first: the order is fixed.


@pytest.mark.parametrize(
    ("tags", "stripped"),
    [
        ({f"k{i}": "v" for i in range(512)}, False),
        ({f"k{i}": "v" for i in range(513)}, True),
        ({"k": "v" * 64 * KiB}, False),
        ({"k": "v" * (64 * KiB + 1)}, True),
        ({"k" * (64 * KiB + 1): "v"}, True),
        ({"k": "é" * (32 * KiB)}, False),  # 64 KiB of UTF-8 bytes
        ({"k": "é" * (32 * KiB) + "x"}, True),  # bytes, not characters
        ({f"k{i}": "v" * (64 * KiB - 2) for i in range(4)}, False),  # 256 KiB less 8 bytes
        ({f"k{i}": "v" * (64 * KiB - 1) for i in range(4)}, True),  # 256 KiB and 4 bytes
    ],
)
def test_tag_bounds(tags: dict, stripped: bool) -> None:
    clean = reasons_of(hb("s", tags))
    assert clean.reasons == (("heartbeat_oversize",) if stripped else ())
    assert len(clean.message.status_tags) == (0 if stripped else len(tags))
    assert clean.size == clean.message.ByteSize()


def test_invalid_utf8_tags_are_repaired_and_the_heartbeat_kept() -> None:
    raw = RawHeartbeat(b"s-1", {b"ok": b"fine", b"bad\xff": "x\udcfe", b"v": b"\xc3("}, b"snap", 5)
    clean = reasons_of(raw)
    assert clean.reasons == ("heartbeat_invalid",)
    msg = clean.message
    assert dict(msg.status_tags) == {
        "ok": "fine",
        "bad\ufffd": "x\ufffd\ufffd\ufffd",
        "v": "\ufffd(",
    }
    assert (msg.session_id, msg.fleet_snapshot_json, msg.sent_at.millis_epoch) == (
        "s-1",
        b"snap",
        5,
    )
    assert clean.size == msg.ByteSize()
    # Valid bytes are decoded without being counted.
    assert reasons_of(RawHeartbeat("s", {b"k": "é".encode()})).reasons == ()


def test_the_size_check_runs_before_the_utf8_repair(monkeypatch) -> None:
    repaired: list = []
    real = hs._repair

    def spy(value):
        repaired.append(value)
        return real(value)

    monkeypatch.setattr(hs, "_repair", spy)
    over = {b"k%d" % i: b"\xff" for i in range(513)}  # invalid and too many
    clean = reasons_of(RawHeartbeat("s", over))
    assert clean.reasons == ("heartbeat_oversize",)  # not heartbeat_invalid: never repaired
    assert repaired == [] and len(clean.message.status_tags) == 0
    huge = {b"k": b"\xff" * (3 * MiB)}
    assert reasons_of(RawHeartbeat("s", huge)).reasons == ("heartbeat_oversize",)
    assert repaired == []


def test_malformed_tags_are_removed_and_the_heartbeat_kept() -> None:
    for tags in (None, [("k", "v")], {"k": 1}, {2: "v"}, "k=v"):
        clean = reasons_of(RawHeartbeat("s", tags, b"snap"))
        assert clean.reasons == ("heartbeat_invalid",), tags
        assert len(clean.message.status_tags) == 0 and clean.message.fleet_snapshot_json == b"snap"


@pytest.mark.parametrize("sid", ["", b"", b"\xff\xfe", "a\udcff", None, 7])
def test_an_empty_or_invalid_session_id_is_dropped(sid) -> None:
    clean = reasons_of(RawHeartbeat(sid, {b"k": b"\xff" * 600 * KiB}, b"x" * (4 * MiB)))
    assert clean.message is None
    assert clean.reasons == ("heartbeat_invalid",)  # checked first: nothing else is counted
    buf = buffer()
    assert dropped(buf.intake(RawHeartbeat(sid))) == ["heartbeat_invalid"]
    assert dropped(buf.intake(hb(""))) == ["heartbeat_invalid"]
    assert buf.sessions == 0


def test_a_repair_that_grows_the_heartbeat_past_the_limit_is_measured_again() -> None:
    buf = buffer(chunk_limit_bytes=400, max_tag_bytes=200, max_tags_total=300)
    limit = buf.max_heartbeat_bytes
    # 150 invalid bytes pass the bounds, then repair into 450 bytes of U+FFFD.
    raw = RawHeartbeat("s", {b"k": b"\xff" * 150}, b"snap" * 10)
    effects = buf.intake(raw)
    assert dropped(effects) == ["heartbeat_invalid", "snapshot_oversize", "heartbeat_oversize"]
    (msg,) = buf.heartbeats()
    assert msg.ByteSize() <= limit and len(msg.status_tags) == 0


def test_a_session_id_that_cannot_fit_any_chunk_is_dropped() -> None:
    buf = buffer(chunk_limit_bytes=100)
    assert dropped(buf.intake(hb("s" * 200))) == ["heartbeat_invalid"]
    assert dropped(buf.intake(RawHeartbeat("s" * 200, {"k": "v"}))) == [
        "heartbeat_oversize",
        "heartbeat_invalid",
    ]
    assert buf.sessions == 0


def test_unknown_fields_are_not_forwarded() -> None:
    # A newer agent's field 9 (3 KiB): kept by the strict parse, dropped at intake.
    sent = hb("s", {"k": "v"}).SerializeToString() + b"\x4a\x80\x18" + b"u" * 3072
    msg = HeartbeatRequest.FromString(sent)
    assert msg.ByteSize() == len(sent)
    buf = buffer()
    buf.intake(msg)
    assert buf.heartbeats() == [hb("s", {"k": "v"})]
    assert buf.bytes == entry_bytes(hb("s", {"k": "v"}).ByteSize())


def test_lenient_decode_keeps_what_the_strict_parser_refuses() -> None:
    wire = LenientHeartbeatRequest(session_id=b"s-1", fleet_snapshot_json=b"{}")
    for key, value in ((b"a", b"1"), (b"bad", b"\xff"), (b"a", b"2")):
        entry = wire.status_tags.add()
        entry.key, entry.value = key, value
    wire.sent_at.SetInParent()
    data = wire.SerializeToString()
    with pytest.raises(DecodeError):
        HeartbeatRequest.FromString(data)
    raw = decode_lenient(data)
    assert raw == RawHeartbeat(b"s-1", {b"a": b"2", b"bad": b"\xff"}, b"{}", 0)  # last key wins
    assert decode_lenient(hb("s", {"k": "v"}, sent=None).SerializeToString()).sent_at_ms is None
    buf = buffer()
    assert dropped(buf.intake(raw)) == ["heartbeat_invalid"]
    (msg,) = buf.heartbeats()
    assert dict(msg.status_tags) == {"a": "2", "bad": "\ufffd"} and msg.HasField("sent_at")
    # A valid heartbeat reads the same either way.
    strict = hb("s-2", {"é": "ü"}, snap=b"j", sent=-3)
    again = buffer()
    again.intake(decode_lenient(strict.SerializeToString()))
    assert again.heartbeats() == [strict]


def test_nothing_agent_controlled_in_reprs_or_status() -> None:
    buf = buffer()
    secret = "secret-tag-value"
    buf.intake(hb("session-secret", {"k": secret}, snap=b"snapshot-secret"))
    raw = RawHeartbeat("session-secret", {"k": secret}, b"snapshot-secret")
    effects = buf.start_flush(0.0)
    text = repr(effects) + repr(buf.status()) + repr(raw)
    for needle in ("session-secret", secret, "snapshot-secret"):
        assert needle not in text
    status = buf.status()
    assert (status.sessions, status.snapshots, status.flush, status.chunk_out_heartbeats) == (
        1,
        1,
        "running",
        1,
    )


# --- flushing -----------------------------------------------------------------------------------


def test_chunks_stay_under_3_mib_oldest_first_at_most_8_per_cycle() -> None:
    buf = buffer()
    for i in range(40):
        buf.intake(hb(f"s{i:02}", {"i": str(i)}, snap=bytes([65 + i % 26]) * (700 * KiB)))
    chunks, effects = run_cycle(buf, ok)
    assert len(chunks) == 8
    assert [len(c.heartbeats) for c in chunks] == [4] * 8  # 4 x 700 KiB fit, 5 do not
    assert [s for c in chunks for s in sids(c)] == [f"s{i:02}" for i in range(32)]
    assert lines(effects) == [("info", FLUSHED.format(n=32, m=8))]
    assert done(effects) == FlushDone(32, 8, 0, 8, "budget", False)
    chunks, effects = run_cycle(buf, ok)  # the rest drains next cycle
    assert [sids(c) for c in chunks] == [
        [f"s{i:02}" for i in range(32, 36)],
        ["s36", "s37", "s38", "s39"],
    ]
    assert done(effects).why == "drained" and buf.sessions == 0


def test_packing_is_oldest_first_and_never_skips_ahead() -> None:
    buf = buffer()
    buf.intake(hb("a", snap=b"x" * (2 * MiB)))
    buf.intake(hb("b", snap=b"x" * (2 * MiB)))  # does not fit beside "a"
    buf.intake(hb("c"))  # would fit beside "a", but it is newer than "b"
    chunks, _ = run_cycle(buf, ok)
    assert [sids(c) for c in chunks] == [["a"], ["b", "c"]]


def test_the_gateway_node_counts_toward_the_chunk() -> None:
    room = CHUNK_LIMIT_BYTES - BatchHeartbeatRequest(gateway_node=NODE).ByteSize()
    # Two heartbeats that fill the room but one byte, then exactly one byte too many (sizes kept
    # where a length prefix is 3 bytes, so each snapshot byte adds one).
    first, second = hb("a", snap=b"x" * (1500 * KiB)), hb("b", snap=b"y" * (1400 * KiB))
    short = room - 1 - entry_bytes(first.ByteSize()) - entry_bytes(second.ByteSize())
    first.fleet_snapshot_json += b"x" * short
    assert entry_bytes(first.ByteSize()) + entry_bytes(second.ByteSize()) == room - 1
    third = hb("c", snap=b"z" * (1400 * KiB + 2))
    assert entry_bytes(first.ByteSize()) + entry_bytes(third.ByteSize()) == room + 1
    fitting = buffer()
    fitting.intake(copy(first))
    fitting.intake(second)
    chunks, _ = run_cycle(fitting, ok)
    assert [sids(c) for c in chunks] == [["a", "b"]] and chunks[0].size == CHUNK_LIMIT_BYTES - 1
    over = buffer()
    over.intake(first)
    over.intake(third)
    chunks, _ = run_cycle(over, ok)
    assert [sids(c) for c in chunks] == [["a"], ["c"]]


def test_a_one_chunk_flush_logs_at_debug_and_an_empty_one_not_at_all() -> None:
    buf = buffer()
    assert buf.start_flush(0.0) == []
    buf.intake(hb("a"))
    _, effects = run_cycle(buf, ok)
    assert lines(effects) == [("debug", "Flushed 1 heartbeats in 1 chunk(s)")]


def test_a_tick_while_a_cycle_runs_does_nothing() -> None:
    buf = buffer()
    buf.intake(hb("a"))
    send = one_send(buf.start_flush(0.0))
    assert buf.start_flush(1.0) == [] and buf.flushing
    assert done(buf.chunk_result(send.chunk_id, Outcome.OK, 1.0)).delivered == 1
    assert buf.chunk_result(send.chunk_id, Outcome.OK, 1.0) == []  # a repeated result


def test_what_arrives_while_a_cycle_runs_waits_for_the_next_cycle() -> None:
    """A cycle sends what was buffered when it started: cut from the live buffer it went on
    packing the few heartbeats each round trip brought, 8 small calls where one would do."""
    buf = buffer()
    buf.intake(hb("a"))
    buf.intake(hb("b"))
    send = one_send(buf.start_flush(0.0))
    buf.intake(hb("c"))  # arrives while the chunk is out
    buf.intake(hb("a"))  # a newer heartbeat of a session being sent
    end = done(buf.chunk_result(send.chunk_id, Outcome.OK, 0.5))
    assert (end.delivered, end.chunks, end.why, end.left) == (2, 1, "drained", 2)
    chunks, _ = run_cycle(buf, ok, now=1.0)
    assert [sids(c) for c in chunks] == [["a", "c"]]  # "a" kept its place while it was out


def test_the_shutdown_flush_sends_what_arrived_during_it_too() -> None:
    buf = buffer()
    buf.intake(hb("a"))
    send = one_send(buf.start_flush(0.0))
    buf.intake(hb("b"))
    assert buf.start_shutdown_flush(0.1) == []  # the cycle out becomes the shutdown flush
    second = one_send(buf.chunk_result(send.chunk_id, Outcome.OK, 0.2))
    assert sids(second) == ["b"]


def test_a_transient_failure_keeps_the_chunk_and_those_not_sent() -> None:
    buf = buffer()
    for i in range(6):
        buf.intake(hb(f"s{i}", snap=b"x" * MiB))
    first = one_send(buf.start_flush(0.0))
    assert sids(first) == ["s0", "s1"]
    second = one_send(buf.chunk_result(first.chunk_id, Outcome.OK, 0.0))
    effects = buf.chunk_result(second.chunk_id, Outcome.TRANSIENT, 0.0)
    assert sends(effects) == [] and done(effects).why == "transient"
    assert [m.session_id for m in buf.heartbeats()] == ["s2", "s3", "s4", "s5"]
    assert all(m.fleet_snapshot_json == b"x" * MiB for m in buf.heartbeats())
    chunks, _ = run_cycle(buf, ok)
    assert [sids(c) for c in chunks] == [["s2", "s3"], ["s4", "s5"]]


def server_rejecting(*bad: str):
    def answer(send: SendChunk) -> Outcome:
        return Outcome.REJECTED if set(sids(send)) & set(bad) else Outcome.OK

    return answer


def test_split_and_drop_isolates_exactly_the_rejected_heartbeat() -> None:
    buf = buffer()
    for i in range(8):
        buf.intake(hb(f"s{i}"))
    chunks, effects = run_cycle(buf, server_rejecting("s5"))
    assert [sids(c) for c in chunks] == [
        [f"s{i}" for i in range(8)],
        ["s0", "s1", "s2", "s3"],
        ["s4", "s5", "s6", "s7"],
        ["s4", "s5"],
        ["s4"],
        ["s5"],
        ["s6", "s7"],
    ]
    assert [c.half for c in chunks] == [False] + [True] * 6
    assert dropped(effects) == ["chunk_rejected"]
    assert done(effects) == FlushDone(7, 3, 1, 0, "drained", False)


def test_a_search_deeper_than_one_cycle_goes_on_in_the_next() -> None:
    buf = buffer()
    for i in range(1000):
        buf.intake(hb(f"s{i:04}", {"k": "v" * 20}))
    answer = server_rejecting("s0777")
    delivered = set()
    for cycle in range(10):
        chunks, _ = run_cycle(buf, answer, now=float(cycle))
        assert len(chunks) <= 8
        for c in chunks:
            if answer(c) is Outcome.OK:
                delivered.update(sids(c))
        if buf.sessions == 0:
            break
    assert buf.sessions == 0 and cycle >= 1
    assert delivered == {f"s{i:04}" for i in range(1000)} - {"s0777"}
    assert buf.counts[(DROPPED, (("reason", "chunk_rejected"),))] == 1


def test_a_transient_failure_of_a_half_keeps_the_split() -> None:
    buf = buffer(max_chunks=2)
    for i in range(4):
        buf.intake(hb(f"s{i}"))
    answers = iter([Outcome.REJECTED, Outcome.TRANSIENT])
    chunks, _ = run_cycle(buf, lambda _send: next(answers))
    assert [sids(c) for c in chunks] == [["s0", "s1", "s2", "s3"], ["s0", "s1"]]
    chunks, _ = run_cycle(buf, ok, now=1.0)
    # The halves go first and alone, in order, though everything would fit in one chunk.
    assert [(sids(c), c.half) for c in chunks] == [(["s0", "s1"], True), (["s2", "s3"], True)]


def test_a_removed_entry_leaves_its_half() -> None:
    tags = {f"k{i}": "v" * 60 * KiB for i in range(4)}  # about 240 KiB each
    buf = buffer(max_chunks=1, max_bytes=1 * MiB)
    buf.intake(hb("a", tags))
    buf.intake(hb("b", tags))
    chunks, _ = run_cycle(buf, lambda _send: Outcome.REJECTED)  # split into [a], [b]; budget
    assert [sids(c) for c in chunks] == [["a", "b"]]
    buf.intake(hb("c", tags))
    buf.intake(hb("d", tags))
    assert dropped(buf.intake(hb("e", tags))) == ["buffer_full"]  # "a" was the oldest
    buf.intake(hb("a", {"n": "new"}))  # a new entry: sent with the others, not as a half
    assert dropped(buf.intake(hb("f", tags))) == ["buffer_full"]  # now "b" goes too
    chunks, _ = run_cycle(buf, ok, now=1.0)
    assert [(sids(c), c.half) for c in chunks] == [(["c", "d", "e", "a", "f"], False)]


def test_an_encoder_failure_drops_the_one_heartbeat_as_invalid() -> None:
    buf = buffer()
    buf.intake(hb("a"))
    buf.intake(hb("b"))
    whole = one_send(buf.start_flush(0.0))
    left = one_send(buf.chunk_result(whole.chunk_id, Outcome.UNENCODABLE, 0.0))
    right = one_send(buf.chunk_result(left.chunk_id, Outcome.UNENCODABLE, 0.0))
    effects = buf.chunk_result(right.chunk_id, Outcome.OK, 0.0)
    assert (sids(left), sids(right)) == (["a"], ["b"])
    assert buf.counts[(DROPPED, (("reason", "heartbeat_invalid"),))] == 1
    assert done(effects).delivered == 1 and buf.sessions == 0


def test_a_newer_heartbeat_while_its_chunk_is_out_is_not_lost() -> None:
    buf = buffer()
    buf.intake(hb("a", {"n": "1"}, snap=b"snap-1"))
    buf.intake(hb("b", {"n": "1"}))
    send = one_send(buf.start_flush(0.0))
    buf.intake(hb("a", {"n": "2"}))  # carries snap-1 forward
    buf.intake(hb("b", {"n": "2"}, snap=b"snap-b"))
    effects = buf.chunk_result(send.chunk_id, Outcome.OK, 0.0)
    assert done(effects).delivered == 2
    a, b = buf.heartbeats()
    # Both newer heartbeats stay; a's snapshot was delivered with the chunk, b's is new.
    assert (dict(a.status_tags), a.fleet_snapshot_json) == ({"n": "2"}, b"")
    assert (dict(b.status_tags), b.fleet_snapshot_json) == ({"n": "2"}, b"snap-b")
    # The chunk as sent is unchanged by what happened meanwhile.
    assert [dict(h.status_tags) for h in send.heartbeats] == [{"n": "1"}, {"n": "1"}]
    assert send.heartbeats[0].fleet_snapshot_json == b"snap-1"


def test_a_newer_heartbeat_survives_a_failed_or_rejected_chunk() -> None:
    buf = buffer()
    buf.intake(hb("a", {"n": "1"}))
    send = one_send(buf.start_flush(0.0))
    buf.intake(hb("a", {"n": "2"}))
    buf.chunk_result(send.chunk_id, Outcome.TRANSIENT, 0.0)
    assert [dict(m.status_tags) for m in buf.heartbeats()] == [{"n": "2"}]
    send = one_send(buf.start_flush(1.0))
    buf.intake(hb("a", {"n": "3"}))
    effects = buf.chunk_result(send.chunk_id, Outcome.REJECTED, 1.0)
    assert dropped(effects) == ["chunk_rejected"]  # the {"n": "2"} heartbeat, as sent
    assert [dict(m.status_tags) for m in buf.heartbeats()] == [{"n": "3"}]


# --- the shutdown flush -------------------------------------------------------------------------


def test_shutdown_flush_sends_at_most_8_chunks() -> None:
    buf = buffer()
    for i in range(30):
        buf.intake(hb(f"s{i:02}", snap=b"x" * MiB))
    effects = buf.start_shutdown_flush(100.0)
    count = 0
    while sends(effects):
        send = one_send(effects)
        assert send.deadline == 105.0
        count += 1
        effects = buf.chunk_result(send.chunk_id, Outcome.OK, 101.0)
    assert count == 8
    assert done(effects) == FlushDone(16, 8, 0, 14, "budget", True)
    assert (
        "warning",
        "Planned stop: 14 buffered heartbeat session(s) not sent by the shutdown "
        "flush (budget); they are lost with the process",
    ) in lines(effects)
    assert buf.stopped and buf.start_flush(102.0) == [] and buf.start_shutdown_flush(102.0) == []


def test_shutdown_flush_ends_at_its_deadline() -> None:
    buf = buffer()
    buf.intake(hb("a", snap=b"x" * (2 * MiB)))
    buf.intake(hb("b", snap=b"x" * (2 * MiB)))
    first = one_send(buf.start_flush(0.0))  # a regular cycle is out when the stop begins
    assert buf.start_shutdown_flush(1.0) == [] and buf.deadline == 6.0
    second = one_send(buf.chunk_result(first.chunk_id, Outcome.OK, 2.0))
    assert second.deadline == 6.0
    assert buf.poll(5.9) == []
    effects = buf.poll(6.0)
    assert done(effects) == FlushDone(1, 1, 0, 1, "deadline", True)
    assert buf.chunk_result(second.chunk_id, Outcome.OK, 6.1) == []  # too late: ignored
    empty = buffer()
    assert done(empty.start_shutdown_flush(0.0)) == FlushDone(0, 0, 0, 0, "drained", True)


def test_no_chunk_is_sent_after_the_shutdown_deadline() -> None:
    buf = buffer()
    for sid in "ab":
        buf.intake(hb(sid, snap=b"x" * (2 * MiB)))
    first = one_send(buf.start_shutdown_flush(0.0))
    effects = buf.chunk_result(first.chunk_id, Outcome.OK, 5.0)
    assert sends(effects) == [] and done(effects).why == "deadline"


@settings(max_examples=400, deadline=None)
@given(
    limit=st.integers(64, 260),
    sid=st.sampled_from(["s", "session-1", b"s", b"\xff", ""]),
    tags=st.one_of(
        st.dictionaries(
            st.sampled_from(["a", "bb", b"c", b"\xfe", "é"]),
            st.sampled_from(["", "x" * 9, "y" * 40, b"\xff" * 12, "é" * 7, b"ok" * 20]),
            max_size=4,
        ),
        st.sampled_from([None, {"a": 3}]),
    ),
    snap=st.integers(0, 260),
    sent=st.sampled_from([None, 0, 5, 2**33, -2]),
    strict=st.booleans(),
)
def test_sanitise_matches_the_reference_at_every_boundary(  # noqa: PLR0917
    limit, sid, tags, snap, sent, strict
) -> None:
    policy = HeartbeatPolicy(
        chunk_limit_bytes=limit, max_tags=3, max_tag_bytes=30, max_tags_total=70
    )
    snapshot = b"j" * snap
    buf = HeartbeatBuffer(policy, gateway_node=NODE)
    want, reasons = reference_sanitise(sid, tags, snapshot, sent, policy)
    text = isinstance(sid, str) and isinstance(tags, dict)
    if strict and text and all(isinstance(x, str) for kv in tags.items() for x in kv):
        heartbeat = hb(sid, tags, snapshot, sent)
    else:
        heartbeat = RawHeartbeat(sid, tags, snapshot, sent)
    effects = buf.intake(heartbeat)
    assert dropped(effects) == reasons
    assert buf.heartbeats() == ([] if want is None else [want])


@settings(max_examples=200, deadline=None)
@given(
    sid=st.one_of(st.text(min_size=1, max_size=300), st.binary(min_size=1, max_size=300)),
    tags=st.dictionaries(
        st.one_of(st.text(max_size=200), st.binary(max_size=200)),
        st.one_of(st.text(max_size=20000), st.binary(max_size=20000)),
        max_size=5,
    ),
    snap=st.integers(0, 20000),
    sent=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
)
def test_the_size_before_repair_is_the_wire_size(sid, tags, snap, sent) -> None:
    assert hs.wire_size(sid, tags, b"s" * snap, sent) == oracle_size(sid, tags, b"s" * snap, sent)
    valid = {k: v for k, v in tags.items() if isinstance(k, str) and isinstance(v, str)}
    if isinstance(sid, str):
        strict = hb(sid, valid, b"s" * snap, sent)
        assert hs.wire_size(sid, valid, b"s" * snap, sent) == strict.ByteSize()


# --- the state machine --------------------------------------------------------------------------

SIDS = [f"s{i}" for i in range(6)]
POISON_SERVER = "p"  # a tag key the fake server refuses (RESOURCE_EXHAUSTED)
POISON_ENCODER = "q"  # a tag key the actor's encoder fails on
SMALL = HeartbeatPolicy(
    max_sessions=4,
    max_bytes=1600,
    chunk_limit_bytes=600,
    max_chunks=3,
    max_tags=3,
    max_tag_bytes=24,
    max_tags_total=50,
    shutdown_s=5.0,
    shutdown_chunks=2,
)
ENVELOPE = BatchHeartbeatRequest(gateway_node=NODE).ByteSize()


def _oracle_class():
    """HeartbeatRequest's wire format as upb writes it, for bytes that are not valid UTF-8: a
    map entry always carries its key and value, even empty, which proto2 optional fields set
    explicitly reproduce (the lenient proto3 class would leave empty ones out)."""
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="test/oracle_heartbeat.proto", package="test.oracle", syntax="proto2"
    )
    ts = proto.message_type.add(name="Timestamp")
    ts.field.add(name="millis_epoch", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    entry = proto.message_type.add(name="TagEntry")
    entry.field.add(name="key", number=1, type=f.TYPE_BYTES, label=f.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=f.TYPE_BYTES, label=f.LABEL_OPTIONAL)
    msg = proto.message_type.add(name="Heartbeat")
    msg.field.add(name="session_id", number=1, type=f.TYPE_BYTES, label=f.LABEL_OPTIONAL)
    msg.field.add(
        name="sent_at",
        number=2,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_OPTIONAL,
        type_name=".test.oracle.Timestamp",
    )
    msg.field.add(
        name="status_tags",
        number=3,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_REPEATED,
        type_name=".test.oracle.TagEntry",
    )
    msg.field.add(name="snapshot", number=4, type=f.TYPE_BYTES, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("test.oracle.Heartbeat"))


OracleHeartbeat = _oracle_class()


def oracle_size(sid, tags: dict, snap: bytes, sent) -> int:
    m = OracleHeartbeat(session_id=as_bytes(sid))
    if snap:
        m.snapshot = snap
    for k, v in tags.items():
        entry = m.status_tags.add()
        entry.key, entry.value = as_bytes(k), as_bytes(v)
    if sent is not None:
        m.sent_at.SetInParent()
        if sent:
            m.sent_at.millis_epoch = sent
    return m.ByteSize()


def fits(size: int, policy: HeartbeatPolicy) -> bool:
    return ENVELOPE + 1 + len(_VarintBytes(size)) + size <= policy.chunk_limit_bytes


def cost(msg: HeartbeatRequest) -> int:
    return BatchHeartbeatRequest(heartbeats=[msg]).ByteSize()


def as_bytes(x: str | bytes) -> bytes:
    return x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass")


def reference_sanitise(sid, tags, snap: bytes, sent, policy: HeartbeatPolicy):
    """The rules as the seed states them, written plainly: sizes from protobuf (the lenient
    class for bytes not yet repaired), no shortcuts."""
    reasons: list[str] = []
    if isinstance(sid, bytes):
        try:
            sid = sid.decode("utf-8")
        except UnicodeDecodeError:
            return None, ["heartbeat_invalid"]
    elif isinstance(sid, str):
        try:
            sid.encode("utf-8")
        except UnicodeEncodeError:
            return None, ["heartbeat_invalid"]
    else:
        return None, ["heartbeat_invalid"]
    if not sid:
        return None, ["heartbeat_invalid"]
    if not isinstance(tags, dict) or not all(
        isinstance(x, str | bytes) for kv in tags.items() for x in kv
    ):
        tags = {}
        reasons.append("heartbeat_invalid")

    def wire_size(tags: dict, snap: bytes) -> int:
        return oracle_size(sid, tags, snap, sent)

    if snap and not fits(wire_size(tags, snap), policy):
        snap = b""
        reasons.append("snapshot_oversize")
    lengths = [len(as_bytes(x)) for kv in tags.items() for x in kv]
    if tags and (
        not fits(wire_size(tags, b""), policy)
        or len(tags) > policy.max_tags
        or max(lengths) > policy.max_tag_bytes
        or sum(lengths) > policy.max_tags_total
    ):
        tags = {}
        reasons.append("heartbeat_oversize")
    fixed = {
        as_bytes(k).decode("utf-8", "replace"): as_bytes(v).decode("utf-8", "replace")
        for k, v in tags.items()
    }
    if any(
        as_bytes(x).decode("utf-8", "replace").encode() != as_bytes(x)
        for kv in tags.items()
        for x in kv
    ):
        reasons.append("heartbeat_invalid")
    msg = hb(sid, fixed, snap, sent)
    if not fits(msg.ByteSize(), policy) and snap:
        msg.ClearField("fleet_snapshot_json")
        reasons.append("snapshot_oversize")
    if not fits(msg.ByteSize(), policy) and fixed:
        msg.status_tags.clear()
        reasons.append("heartbeat_oversize")
    if not fits(msg.ByteSize(), policy):
        return None, [*reasons, "heartbeat_invalid"]
    return msg, reasons


class Entry:
    def __init__(self, sid: str, msg: HeartbeatRequest, version: int, snap_seq: int) -> None:
        self.sid, self.msg, self.version, self.snap_seq = sid, msg, version, snap_seq


def strip_snapshot(msg: HeartbeatRequest) -> HeartbeatRequest:
    copy = HeartbeatRequest()
    copy.CopyFrom(msg)
    copy.ClearField("fleet_snapshot_json")
    return copy


class Model:
    """The buffer as a list, the eviction and settle rules written plainly."""

    def __init__(self, policy: HeartbeatPolicy) -> None:
        self.policy = policy
        self.entries: list[Entry] = []
        self.seq = 0
        self.counts: dict[str, int] = {}

    def count(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1

    def find(self, sid: str) -> Entry | None:
        return next((e for e in self.entries if e.sid == sid), None)

    def total(self) -> int:
        return sum(cost(e.msg) for e in self.entries)

    def intake(self, msg: HeartbeatRequest | None, reasons: list[str]) -> None:
        for reason in reasons:
            self.count(reason)
        if msg is None:
            return
        old = self.find(msg.session_id)
        if old is None and len(self.entries) >= self.policy.max_sessions:
            self.count("buffer_full")
            return
        self.seq += 1
        snap_seq = self.seq if msg.fleet_snapshot_json else 0
        if old is not None:
            self.count("coalesced")
            if not snap_seq and old.snap_seq:
                merged = HeartbeatRequest()
                merged.CopyFrom(msg)
                merged.fleet_snapshot_json = old.msg.fleet_snapshot_json
                if fits(merged.ByteSize(), self.policy):
                    msg, snap_seq = merged, old.snap_seq
                else:
                    self.count("snapshot_oversize")
            old.msg, old.version, old.snap_seq = msg, self.seq, snap_seq
        else:
            self.entries.append(Entry(msg.session_id, msg, self.seq, snap_seq))
        while self.total() > self.policy.max_bytes:
            holding = [e for e in self.entries if e.snap_seq]
            if holding:
                oldest = min(holding, key=lambda e: e.snap_seq)
                oldest.msg, oldest.snap_seq = strip_snapshot(oldest.msg), 0
                self.count("snapshot_evicted")
            else:
                self.entries.pop(0)
                self.count("buffer_full")

    def settle(self, sent: list[tuple[str, int, int]]) -> None:
        for sid, version, snap_seq in sent:
            e = self.find(sid)
            if e is None:
                continue
            if e.version == version:
                self.entries.remove(e)
            elif snap_seq and e.snap_seq == snap_seq:
                e.msg, e.snap_seq = strip_snapshot(e.msg), 0


tag_keys = st.sampled_from(["a", "b", "c", POISON_SERVER, POISON_ENCODER])
tag_values = st.sampled_from(["", "x", "y" * 20, "z" * 30, "é", b"ok", b"\xff", b"a\xc3", "\udcff"])
snap_sizes = st.sampled_from([0, 0, 20, 150, 400, 580])


class BufferMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.out: SendChunk | None = None
        self.out_members: list[tuple[str, int, int]] = []
        self.attempted: set[str] = set()
        self.reserved: set[str] = set()  # sids of rejected chunks' halves still to send
        self.cycle_chunks = 0
        self.shutdown_at: float | None = None
        self.shutdown_chunks = 0
        self.cycle_running = False
        # The newest intake the running cycle may send: None during the shutdown flush.
        self.upto: int | None = None
        self.steps = 0
        self.expect_half: list[str] = []

    @initialize(small=st.booleans())
    def start(self, small: bool) -> None:
        # Mostly the shrunk numbers; sometimes a roomier buffer so flushes carry several chunks.
        self.policy = (
            SMALL
            if small
            else HeartbeatPolicy(
                max_sessions=6,
                max_bytes=2500,
                chunk_limit_bytes=900,
                max_chunks=4,
                max_tags=3,
                max_tag_bytes=24,
                max_tags_total=50,
                shutdown_s=5.0,
                shutdown_chunks=3,
            )
        )
        self.buf = HeartbeatBuffer(self.policy, gateway_node=NODE)
        self.model = Model(self.policy)

    # -- intake --

    @rule(
        sid=st.one_of(st.sampled_from(SIDS), st.sampled_from(["", b"s1", b"\xff", None])),
        tags=st.one_of(
            st.dictionaries(tag_keys, tag_values, max_size=4),
            st.dictionaries(st.sampled_from(["a", b"\xfe", b"\xfd"]), tag_values, max_size=2),
            st.sampled_from([None, [("a", "b")], {"a": 1}]),
        ),
        snap=snap_sizes,
        sent=st.sampled_from([None, 0, 7, 2**40, -1]),
    )
    def intake(self, sid, tags, snap: int, sent) -> None:
        snapshot = bytes([97 + snap % 26]) * snap
        strict = (
            isinstance(sid, str)
            and isinstance(tags, dict)
            and all(isinstance(x, str) and "\udcff" not in x for kv in tags.items() for x in kv)
        )
        if strict:
            heartbeat = hb(sid, tags, snapshot, sent)
        else:
            heartbeat = RawHeartbeat(sid, tags, snapshot, sent)
        want, reasons = reference_sanitise(sid, tags, snapshot, sent, self.policy)
        sessions_before = {e.sid for e in self.model.entries}
        effects = self.buf.intake(heartbeat)
        self.model.intake(want, reasons)
        # A removed entry leaves its half: a later heartbeat of the session is a new entry.
        gone = sessions_before - {e.sid for e in self.model.entries}
        self.reserved -= gone
        assert [e for e in effects if not isinstance(e, Count)] == []

    # -- flushing --

    @precondition(lambda self: hasattr(self, "buf"))
    @rule()
    def tick(self) -> None:
        effects = self.buf.start_flush(self.now)
        if self.cycle_running or self.buf.stopped or not self.model.entries:
            assert effects == []
            return
        self.cycle_running = True
        self.cycle_chunks = 0
        self.attempted = set()
        self.upto = self.model.seq
        self.after(effects)

    @precondition(lambda self: getattr(self, "out", None) is not None)
    @rule(kind=st.sampled_from(["server", "server", "server", "transient"]))
    def answer(self, kind: str) -> None:
        send = self.out
        assert send is not None
        keys = {k for h in send.heartbeats for k in h.status_tags}
        if POISON_ENCODER in keys:
            outcome = Outcome.UNENCODABLE
        elif kind == "transient":
            outcome = Outcome.TRANSIENT
        elif POISON_SERVER in keys:
            outcome = Outcome.REJECTED
        else:
            outcome = Outcome.OK
        members, self.out, self.out_members = self.out_members, None, []
        chunk_sids = [m[0] for m in members]
        effects = self.buf.chunk_result(send.chunk_id, outcome, self.now)
        if outcome is Outcome.OK:
            self.model.settle(members)
        elif outcome is Outcome.TRANSIENT:
            if send.half:
                self.reserved |= {s for s in chunk_sids if self.model.find(s)}
        elif len(members) == 1:
            # Isolated: the one heartbeat left is a poisoned one, and only it is dropped.
            assert keys & {POISON_SERVER, POISON_ENCODER}
            reason = "heartbeat_invalid" if outcome is Outcome.UNENCODABLE else "chunk_rejected"
            self.model.count(reason)
            self.model.settle(members)
            assert dropped(effects) == [reason]
        else:
            self.attempted -= set(chunk_sids)
            self.reserved |= {s for s in chunk_sids if self.model.find(s)}
            # Split in halves: the first half (what is left of it) goes next.
            first = chunk_sids[: (len(chunk_sids) + 1) // 2]
            self.expect_half = [s for s in first if self.model.find(s)]
        if outcome is not Outcome.REJECTED and outcome is not Outcome.UNENCODABLE:
            assert dropped(effects) == []
        self.reserved = {s for s in self.reserved if self.model.find(s)}
        self.after(effects, last=outcome)

    def after(self, effects: list, last: Outcome | None = None) -> None:
        """Check what a flush call returned: the next chunk, or the end of the cycle."""
        chunk = sends(effects)
        end = done(effects)
        assert len(chunk) + (end is not None) == 1
        if end is not None:
            self.cycle_running = False
            if end.shutdown:
                assert self.shutdown_at is not None
            if end.why == "drained":
                # Everything the cycle could send went; what came after its start waits.
                assert all(
                    e.sid in self.attempted or not self.sendable(e) for e in self.model.entries
                )
            elif end.why == "transient":
                assert last is Outcome.TRANSIENT
            elif end.why == "budget":
                limit = self.policy.shutdown_chunks if end.shutdown else self.policy.max_chunks
                used = self.shutdown_chunks if end.shutdown else self.cycle_chunks
                assert used == limit
            else:
                assert end.shutdown and self.now >= self.shutdown_at + self.policy.shutdown_s
            assert end.left == len(self.model.entries)
            level = [lvl for lvl, text in lines(effects) if text.startswith("Flushed")]
            assert level == ([] if end.chunks == 0 else ["info" if end.chunks > 1 else "debug"])
            return
        (send,) = chunk
        self.cycle_chunks += 1
        if self.shutdown_at is not None:
            self.shutdown_chunks += 1
            assert self.shutdown_chunks <= self.policy.shutdown_chunks
            assert self.now < self.shutdown_at + self.policy.shutdown_s
            assert send.deadline == self.shutdown_at + self.policy.shutdown_s
        else:
            assert self.cycle_chunks <= self.policy.max_chunks
        # Every chunk encodes under the limit, and its size is exact.
        request = send.request()
        assert request.gateway_node == NODE
        assert request.ByteSize() == send.size <= self.policy.chunk_limit_bytes
        # What is sent is each session's newest state, oldest session first.
        order = [e.sid for e in self.model.entries]
        got = sids(send)
        assert got and len(set(got)) == len(got)
        assert [s for s in order if s in got] == got
        members = []
        for h in send.heartbeats:
            entry = self.model.find(h.session_id)
            assert entry is not None and h == entry.msg
            members.append((entry.sid, entry.version, entry.snap_seq))
        if send.half:
            assert set(got) <= self.reserved
            if self.expect_half:
                assert got == self.expect_half[: len(got)]
        else:
            eligible = [
                e
                for e in self.model.entries
                if e.sid not in self.attempted and e.sid not in self.reserved and self.sendable(e)
            ]
            expect, used = [], ENVELOPE
            for e in eligible:
                if used + cost(e.msg) > self.policy.chunk_limit_bytes:
                    break
                used += cost(e.msg)
                expect.append(e.sid)
            assert got == expect
        self.expect_half = []
        self.reserved -= set(got)
        self.attempted |= set(got)
        self.out, self.out_members = send, members

    def sendable(self, entry: Entry) -> bool:
        """Written before the running cycle started (any, in the shutdown flush)."""
        return self.upto is None or entry.version <= self.upto

    # -- time and the stop --

    @precondition(lambda self: hasattr(self, "buf"))
    @rule(dt=st.sampled_from([0.5, 2.0, 6.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        effects = self.buf.poll(self.now)
        if effects:
            end = done(effects)
            assert end is not None and end.why == "deadline" and end.shutdown
            self.out, self.out_members, self.cycle_running = None, [], False

    # The stop ends the buffer's life: late in a run, so most of each run flushes normally.
    @precondition(lambda self: self.steps >= 30 and self.shutdown_at is None)
    @rule()
    def shutdown(self) -> None:
        self.shutdown_at = self.now
        self.shutdown_chunks = 0
        self.upto = None  # the shutdown flush sends whatever is buffered, a running cycle too
        effects = self.buf.start_shutdown_flush(self.now)
        if self.cycle_running:
            assert effects == []  # the chunk out carries on under the new budget
            return
        if not self.model.entries:
            assert done(effects) == FlushDone(0, 0, 0, 0, "drained", True)
            return
        self.cycle_running = True
        self.cycle_chunks = 0
        self.attempted = set()
        self.after(effects)

    @precondition(
        lambda self: (
            self.shutdown_at is None and len(getattr(self, "model", Model(SMALL)).entries) >= 3
        )
    )
    @rule()
    def drain_everything(self) -> None:
        """A healthy server (it still refuses poisoned heartbeats): a few cycles empty the
        buffer, whatever splits are pending. Nothing is lost that was not counted."""
        for _ in range(40):
            if self.out is not None:
                self.answer("server")
            elif self.model.entries:
                self.tick()
            else:
                break
        assert not self.model.entries and self.buf.sessions == 0

    # -- invariants --

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "buf"):
            return
        self.steps += 1
        assert self.buf.heartbeats() == [e.msg for e in self.model.entries]
        assert self.buf.bytes == self.model.total()
        assert self.buf.sessions <= self.policy.max_sessions
        assert self.buf.bytes <= self.policy.max_bytes
        counts = {
            dict(labels)["reason"]: n
            for (family, labels), n in self.buf.counts.items()
            if family == DROPPED and n
        }
        counts_model = {k: v for k, v in self.model.counts.items() if k != "coalesced"}
        assert counts == counts_model
        assert self.buf.counts[(COALESCED, ())] == self.model.counts.get("coalesced", 0)
        assert self.buf.flushing == self.cycle_running


TestBufferMachine = BufferMachine.TestCase
TestBufferMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
