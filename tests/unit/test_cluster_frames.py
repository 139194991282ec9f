"""The sealed frames of a link's command stream (gateway/cluster/auth.py: Sealer, Opener)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.cluster.auth import Opener, Sealer, new_nonce, stream_key

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
