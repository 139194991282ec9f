"""The simulated agent honours a refusal's `grpc-retry-pushback-ms` exactly (gateway/devstack/
behaviour.py), and falls back to its backoff without one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.devstack.behaviour import PUSHBACK_KEY, Backoff, pushback_ms, retry_delay


def test_the_hint_is_read_from_the_trailers() -> None:
    assert pushback_ms(((PUSHBACK_KEY, "1234"),)) == 1234
    assert pushback_ms((("other", "5"), (PUSHBACK_KEY, "0"))) == 0
    assert pushback_ms(()) is None
    assert pushback_ms(None) is None
    assert pushback_ms(((PUSHBACK_KEY, "-5"),)) is None
    assert pushback_ms(((PUSHBACK_KEY, "soon"),)) is None


@given(
    hint=st.integers(0, 600_000),
    attempt=st.integers(0, 40),
    draw=st.floats(0.0, 1.0, exclude_max=True),
)
def test_a_hint_is_waited_exactly_whatever_the_backoff(
    hint: int, attempt: int, draw: float
) -> None:
    assert retry_delay(hint, Backoff(), attempt, draw) == hint / 1000.0


@given(attempt=st.integers(0, 40), draw=st.floats(0.0, 1.0, exclude_max=True))
def test_without_a_hint_the_backoff_governs(attempt: int, draw: float) -> None:
    backoff = Backoff()
    assert retry_delay(None, backoff, attempt, draw) == backoff.delay(attempt, draw)
