"""The sealed frames of a link's command stream (gateway/cluster/auth.py: Sealer, Opener) and
the batches of answers they carry (gateway/cluster/batches.py)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from gateway.cluster.auth import Opener, Sealer, new_nonce, stream_key
from gateway.cluster.batches import BATCH, MAX_BATCH_BYTES, RECORD, Record, pack, unpack
from gateway.cluster.commands import ANSWER, END

COOKIE = "c" * 64
OUT, BACK = b">", b"<"
KEY = stream_key(COOKIE, new_nonce(), 1)

frames = st.lists(
    st.tuples(st.sampled_from([b"C", b"A", b"E", b"F"]), st.integers(0, 2**64 - 1), st.binary()),
    min_size=1,
    max_size=8,
)


@given(frames)
def test_frames_open_in_order_as_sealed(sent: list[tuple[bytes, int, bytes]]) -> None:
    sealer, opener = Sealer(KEY, OUT), Opener(KEY, OUT)
    assert [opener.open(sealer.seal(*frame)) for frame in sent] == sent


@given(frames, st.data())
def test_a_frame_replayed_dropped_or_reordered_is_refused(
    sent: list[tuple[bytes, int, bytes]], data: st.DataObject
) -> None:
    sealer, opener = Sealer(KEY, OUT), Opener(KEY, OUT)
    sealed = [sealer.seal(*frame) for frame in sent]
    # Deliver a prefix, then any frame that is not the next one.
    cut = data.draw(st.integers(0, len(sealed) - 1))
    for frame in sealed[:cut]:
        assert opener.open(frame) is not None
    wrong = data.draw(st.sampled_from([i for i in range(len(sealed)) if i != cut] or [0]))
    if wrong != cut:
        assert opener.open(sealed[wrong]) is None
    # Refusing changes nothing: the next one still opens.
    assert opener.open(sealed[cut]) == sent[cut]


@given(st.binary(min_size=1, max_size=64), st.data())
def test_any_changed_byte_is_refused(body: bytes, data: st.DataObject) -> None:
    sealed = bytearray(Sealer(KEY, OUT).seal(b"C", 9, body))
    index = data.draw(st.integers(0, len(sealed) - 1))
    sealed[index] ^= data.draw(st.integers(1, 255))
    assert Opener(KEY, OUT).open(bytes(sealed)) is None


def test_another_key_direction_or_a_truncated_frame_is_refused() -> None:
    sealed = Sealer(KEY, OUT).seal(b"A", 1, b"answer")
    other_stream = stream_key(COOKIE, new_nonce(), 1)
    other_cookie = stream_key("d" * 64, "n" * 32, 1)
    assert Opener(other_stream, OUT).open(sealed) is None
    assert Opener(other_cookie, OUT).open(sealed) is None
    # A frame played back to the side that sealed it.
    assert Opener(KEY, BACK).open(sealed) is None
    assert Opener(KEY, OUT).open(sealed[:40]) is None
    assert Opener(KEY, OUT).open(sealed) == (b"A", 1, b"answer")


def test_the_stream_key_binds_the_cookie_the_challenge_and_the_opening_call() -> None:
    nonce = new_nonce()
    keys = {
        stream_key(COOKIE, nonce, 1),
        stream_key(COOKIE, nonce, 2),
        stream_key(COOKIE, new_nonce(), 1),
        stream_key("d" * 64, nonce, 1),
    }
    assert len(keys) == 4
    assert stream_key(COOKIE, nonce, 1) == stream_key(COOKIE, nonce, 1)


# -- batches (gateway/cluster/batches.py) ----------------------------------------------------------

records = st.lists(
    st.tuples(st.sampled_from([ANSWER, END]), st.integers(0, 2**64 - 1), st.binary(max_size=300)),
    min_size=1,
    max_size=40,
)


def opened_records(frames: list[Record]) -> list[Record]:
    """What the dialler reads from `frames`, sealed and opened in order."""
    sealer, opener = Sealer(KEY, BACK), Opener(KEY, BACK)
    got: list[Record] = []
    for frame in frames:
        opened = opener.open(sealer.seal(*frame))
        assert opened is not None
        if opened[0] == BATCH:
            inner = unpack(opened[2])
            assert inner is not None
            got += inner
        else:
            got.append(opened)
    return got


@given(records, st.integers(1, 2000))
def test_records_packed_under_any_limit_open_in_order_each_batch_within_it(
    sent: list[Record], limit: int
) -> None:
    frames = pack(sent, limit)
    assert opened_records(frames) == sent
    for frame in frames:
        if frame[0] == BATCH:
            assert len(frame[2]) <= limit
        else:  # a plain frame: a record alone, which is the only one that may pass the limit
            assert frame in sent
    # Greedy: a frame ends only where its next record would have taken it past the limit.
    groups = [unpack(f[2]) or [] if f[0] == BATCH else [f] for f in frames]
    for group, following in itertools.pairwise(groups):
        size = sum(RECORD.size + len(body) for _, _, body in group)
        assert size + RECORD.size + len(following[0][2]) > limit


@given(st.lists(st.tuples(st.just(ANSWER), st.integers(0, 99), st.binary(max_size=50)), min_size=2))
def test_what_fits_is_one_batch_frame_and_a_lone_record_a_plain_frame(sent: list[Record]) -> None:
    [frame] = pack(sent)
    assert frame[:2] == (BATCH, 0) and unpack(frame[2]) == sent
    assert pack(sent[:1]) == sent[:1]


def test_an_oversize_batch_is_split_at_max_batch_bytes() -> None:
    answer = (ANSWER, 5, b"x" * 1000)
    sent = [answer] * (3 * MAX_BATCH_BYTES // 1000)
    frames = pack(sent)
    assert len(frames) == 4 and all(f[0] == BATCH for f in frames)
    assert all(len(f[2]) <= MAX_BATCH_BYTES for f in frames)
    assert opened_records(frames) == sent
    huge = (ANSWER, 6, b"y" * (MAX_BATCH_BYTES + 1))
    assert pack([answer, huge, answer]) == [answer, huge, answer]


@given(records.filter(lambda r: len(r) > 1), st.data())
def test_any_changed_byte_of_a_batch_frame_is_refused(
    sent: list[Record], data: st.DataObject
) -> None:
    [frame] = pack(sent, 2**20)
    sealed = bytearray(Sealer(KEY, BACK).seal(*frame))
    index = data.draw(st.integers(0, len(sealed) - 1))
    sealed[index] ^= data.draw(st.integers(1, 255))
    assert Opener(KEY, BACK).open(bytes(sealed)) is None


def test_a_batch_body_that_is_not_two_or_more_whole_records_is_malformed() -> None:
    [(_, _, body)] = pack([(ANSWER, 1, b"one"), (END, 2, b"")])
    assert unpack(body) == [(ANSWER, 1, b"one"), (END, 2, b"")]
    for bad in (body[:-1], body + b"\0", body[: RECORD.size + 3], b""):
        assert unpack(bad) is None
