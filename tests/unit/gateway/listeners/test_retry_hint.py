"""Retry hints (gateway/listeners/retry_hint.py): the ranges, the jitter, the trailer grpclib
would not send, and which refusal gets which kind (gateway/agent/status.py)."""

from __future__ import annotations

import asyncio
import random
from typing import get_args

import attrs
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from hypothesis import given
from hypothesis import strategies as st

from actors.upstream.api import RefusalReason, UpstreamRefused
from gateway.agent.status import session_refused, upstream_refused
from gateway.listeners.retry_hint import (
    HINT_RANGES_MS,
    PUSHBACK_HEADER,
    HintedRefusal,
    RefusalKind,
    pushback_ms,
    send_refusal,
    trailer,
)

kinds = st.sampled_from(RefusalKind)


def test_every_kind_has_a_range_of_positive_milliseconds():
    assert set(HINT_RANGES_MS) == set(RefusalKind)
    for low, high in HINT_RANGES_MS.values():
        assert 0 < low < high


@given(kinds, st.randoms(use_true_random=False))
def test_a_hint_lies_in_its_kinds_range(kind: RefusalKind, rng: random.Random):
    low, high = HINT_RANGES_MS[kind]
    assert low <= pushback_ms(kind, rng) <= high


@given(kinds, st.integers(0, 2**32))
def test_hints_spread_over_the_whole_range(kind: RefusalKind, seed: int):
    # A fleet refused at once comes back spread: 200 draws reach both ends' tenths.
    rng = random.Random(seed)
    low, high = HINT_RANGES_MS[kind]
    tenth = (high - low) / 10
    hints = [pushback_ms(kind, rng) for _ in range(200)]
    assert min(hints) < low + tenth and max(hints) > high - tenth


@given(kinds, st.randoms(use_true_random=False))
def test_the_trailer_is_the_pushback_key_and_decimal_milliseconds(
    kind: RefusalKind, rng: random.Random
):
    key, value = trailer(kind, rng)
    low, high = HINT_RANGES_MS[kind]
    assert key == PUSHBACK_HEADER == "grpc-retry-pushback-ms"
    assert value.isdigit() and low <= int(value) <= high


def test_a_hinted_refusal_is_an_unavailable_grpc_error():
    refusal = HintedRefusal(RefusalKind.BREAKER, "Upstream Register failed: circuit_open")
    assert isinstance(refusal, GRPCError)
    assert (refusal.status, refusal.message) == (
        Status.UNAVAILABLE,
        "Upstream Register failed: circuit_open",
    )
    assert refusal.trailer[0] == PUSHBACK_HEADER


# -- which refusal gets which kind ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("circuit_open", RefusalKind.BREAKER),
        ("queue_full", RefusalKind.PERMITS),
        ("deadline", RefusalKind.PERMITS),
        ("stopping", RefusalKind.STOPPING),
        ("unavailable", RefusalKind.RESTARTING),
    ],
)
def test_upstream_refusals(reason: RefusalReason, kind: RefusalKind):
    refusal = upstream_refused(UpstreamRefused(reason), "Register")
    assert (refusal.kind, refusal.message) == (kind, f"Upstream Register failed: {reason}")


def test_every_upstream_refusal_reason_has_a_kind():
    for reason in get_args(RefusalReason):
        assert isinstance(upstream_refused(UpstreamRefused(reason), "X").kind, RefusalKind)


def test_session_refusals():
    assert session_refused("Register", "cap").kind is RefusalKind.SESSION_CAP
    closing = session_refused("Subscribe", "connection_down")
    assert (closing.kind, closing.message) == (
        RefusalKind.CONNECTION_CLOSING,
        "Subscribe refused: connection_down",
    )


# -- the trailers on a grpclib server stream ------------------------------------------------------


@attrs.define
class FakeH2Stream:
    closable: bool = True
    sent: list[tuple[list[tuple[str, str]], bool]] = attrs.Factory(list)
    reset: bool = False

    async def send_headers(self, headers: list[tuple[str, str]], end_stream: bool) -> None:
        self.sent.append((headers, end_stream))

    def reset_nowait(self) -> None:
        self.reset = True


@attrs.define
class FakeStream:
    """The grpclib server `Stream` attributes `send_refusal` reads and sets."""

    _stream: FakeH2Stream = attrs.Factory(FakeH2Stream)
    _send_initial_metadata_done: bool = False
    _send_trailing_metadata_done: bool = False
    _content_type: str = "application/grpc+proto"


def send(stream: FakeStream, refusal: HintedRefusal) -> None:
    asyncio.run(send_refusal(stream, refusal))  # type: ignore[arg-type]


def test_a_refusal_before_anything_was_sent_is_trailers_only():
    stream = FakeStream()
    refusal = HintedRefusal(RefusalKind.SESSION_CAP, "Register refused: cap", random.Random(1))
    send(stream, refusal)
    [(headers, end)] = stream._stream.sent
    assert end and stream._send_trailing_metadata_done and stream._stream.reset
    assert headers == [
        (":status", "200"),
        ("content-type", "application/grpc+proto"),
        ("grpc-status", "14"),
        ("grpc-message", "Register refused: cap"),
        refusal.trailer,
    ]
    # Answered once: a second send writes nothing.
    send(stream, refusal)
    assert len(stream._stream.sent) == 1


def test_a_refusal_after_the_headers_sends_only_trailers():
    stream = FakeStream(send_initial_metadata_done=True)
    refusal = HintedRefusal(RefusalKind.STOPPING, "stopping: 100% done")
    send(stream, refusal)
    [(headers, _)] = stream._stream.sent
    assert [k for k, _ in headers] == ["grpc-status", "grpc-message", PUSHBACK_HEADER]
    assert dict(headers)["grpc-message"] == "stopping: 100%25 done"  # grpclib's encoding
