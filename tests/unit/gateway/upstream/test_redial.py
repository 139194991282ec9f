"""The redial core: 100 ms doubling to 5 s, up to 20 % jitter on top, reset after 5 s up."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.upstream.redial import REDIAL, Redial

BASE, CAP, JITTER, STABLE = 0.1, 5.0, 0.2, 5.0
STEPS = [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]


def fixed(value: float) -> Redial:
    return Redial(random=lambda: value)


def test_the_numbers_are_the_seeds() -> None:
    assert REDIAL.doubling.base_s == BASE
    assert REDIAL.doubling.cap_s == CAP
    assert REDIAL.jitter == JITTER
    assert REDIAL.stable_s == STABLE
    assert REDIAL.max_delay_s == pytest.approx(6.0)


def test_failed_dials_double_to_the_cap_without_jitter() -> None:
    redial = fixed(0.0)
    assert [redial.failed() for _ in STEPS] == pytest.approx(STEPS)


def test_jitter_is_added_on_top_never_taken_off() -> None:
    redial = fixed(0.999999)
    delays = [redial.failed() for _ in STEPS]
    assert delays == pytest.approx([s * 1.2 for s in STEPS], rel=1e-5)


def test_a_short_lived_connection_does_not_reset_the_delay() -> None:
    redial = fixed(0.0)
    assert redial.failed() == pytest.approx(0.1)
    assert redial.failed() == pytest.approx(0.2)
    redial.connected(now=100.0)
    # Up for 4.9 s: the server is accepting and dropping, keep backing off.
    assert redial.lost(now=104.9) == pytest.approx(0.4)
    redial.connected(now=200.0)
    assert redial.lost(now=200.1) == pytest.approx(0.8)


def test_five_seconds_up_resets_to_100_ms() -> None:
    redial = fixed(0.0)
    for _ in range(8):
        redial.failed()
    redial.connected(now=10.0)
    assert redial.lost(now=15.0) == pytest.approx(0.1)
    assert redial.failed() == pytest.approx(0.2)


def test_the_first_loss_of_a_fresh_slot_waits_100_ms() -> None:
    redial = fixed(0.5)
    redial.connected(now=0.0)
    assert redial.lost(now=60.0) == pytest.approx(0.1 * 1.1)


# -- properties ---------------------------------------------------------------------------------

events = st.lists(
    st.one_of(
        st.tuples(st.just("failed"), st.just(0.0)),
        st.tuples(st.just("up"), st.floats(min_value=0.0, max_value=20.0)),
    ),
    max_size=60,
)


@given(events=events, seed=st.integers(0, 2**32 - 1))
def test_every_delay_is_a_doubling_step_plus_at_most_20_percent(
    events: list[tuple[str, float]], seed: int
) -> None:
    """Model: the step doubles per delay handed out, capped at 5 s, and goes back to 100 ms
    exactly when a connection stayed up for at least 5 s before it was lost."""
    rng = random.Random(seed)
    redial = Redial(random=rng.random)
    now = 0.0
    expected_step = BASE
    for kind, up_for in events:
        if kind == "failed":
            delay = redial.failed()
        else:
            started = now
            redial.connected(started)
            now += up_for
            if now - started >= STABLE:  # the same float arithmetic as the core
                expected_step = BASE
            delay = redial.lost(now)
        assert expected_step <= delay <= expected_step * (1 + JITTER) + 1e-12
        assert BASE <= delay <= CAP * (1 + JITTER) + 1e-12
        expected_step = min(expected_step * 2, CAP)
        now += delay


@given(draws=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=30))
def test_jitter_follows_the_random_source(draws: list[float]) -> None:
    feed = iter(draws)
    redial = Redial(random=lambda: next(feed))
    step = BASE
    for draw in draws:
        assert redial.failed() == pytest.approx(step * (1 + JITTER * draw))
        step = min(step * 2, CAP)


def test_a_random_source_out_of_range_is_clamped() -> None:
    assert fixed(7.0).failed() == pytest.approx(0.12)
    assert fixed(-1.0).failed() == pytest.approx(0.1)
