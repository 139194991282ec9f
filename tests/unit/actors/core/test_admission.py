"""The admission core (actors/core/admission.py): the bound follows the measured drain rate
within its floor and hard bound, only a window with refusals lowers that rate, and a refused
herd is told slots spread at it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.admission import (
    FLOOR,
    HINT_MIN_MS,
    MIN_RATE_PER_S,
    RATE_WINDOW_S,
    Admission,
    AdmissionLimits,
    Admitted,
    Refused,
)

# A target short enough that a cold node's bound is the floor (MIN_RATE_PER_S x 0.2 s < FLOOR).
LIMITS = AdmissionLimits(pending_max=1000, drain_target_s=0.2, hint_max_ms=60_000)


def fill(admission: Admission, now: float) -> None:
    """Admit up to the bound, refusing nothing (a refusal would take a slot)."""
    while admission.pending < admission.bound(now):
        assert isinstance(admission.admit(now, 0.5), Admitted)


def test_a_cold_node_admits_the_floor_then_refuses_with_a_hint() -> None:
    admission = Admission(LIMITS)
    results = [admission.admit(0.0, 0.5) for _ in range(FLOOR + 1)]
    assert all(isinstance(r, Admitted) for r in results[:FLOOR])
    refused = results[FLOOR]
    assert isinstance(refused, Refused)
    assert refused.bound == FLOOR and refused.pending == FLOOR
    # Behind FLOOR pending calls at the slowest rate assumed.
    assert refused.hint_ms >= 1000 * FLOOR / MIN_RATE_PER_S


def test_the_bound_follows_the_measured_rate() -> None:
    admission = Admission(LIMITS)
    fill(admission, 0.0)
    # 800 completions a second for the whole window, each freeing a place taken at once.
    for step in range(int(800 * RATE_WINDOW_S)):
        now = step / 800.0
        admission.finish(now)
        admission.admit(now, 0.5)
    assert admission.rate(RATE_WINDOW_S) == pytest.approx(800.0, rel=0.02)
    assert admission.bound(RATE_WINDOW_S) == pytest.approx(160, rel=0.02)


def completions(admission: Admission, count: int, now: float) -> None:
    for _ in range(count):
        admission.admit(now, 0.0)
        admission.finish(now)


def test_a_window_without_refusals_never_lowers_the_rate() -> None:
    """What an unrefused window finished is what arrived: a herd told slots at 500 a second
    that comes back at 100 a second must not teach the node that it drains 100."""
    admission = Admission(LIMITS)
    completions(admission, 2500, 0.0)
    assert admission.rate(0.5) == 2500.0
    for second in range(1, 12):
        completions(admission, 100, float(second))
        assert admission.rate(second + 0.5) >= 2500.0


def test_a_window_with_refusals_lowers_the_rate_to_what_it_finished() -> None:
    admission = Admission(LIMITS)
    completions(admission, 2500, 0.0)
    assert admission.rate(0.5) == 2500.0
    for second in range(1, 7):
        completions(admission, 400, float(second))
    fill(admission, 6.5)
    assert isinstance(admission.admit(6.5, 0.5), Refused)  # at its bound: the node is busy
    assert admission.rate(6.5) == pytest.approx(400.0, rel=0.01)
    # A node that has finished nothing for a window, at its bound, is believed the slowest.
    assert isinstance(admission.admit(20.0, 0.5), Refused)
    assert admission.rate(20.0) == MIN_RATE_PER_S


def test_the_hard_bound_caps_a_fast_node() -> None:
    limits = AdmissionLimits(pending_max=100, drain_target_s=10.0, hint_max_ms=60_000)
    admission = Admission(limits)
    for _ in range(FLOOR):
        admission.admit(0.0, 0.0)
    for _ in range(FLOOR):
        admission.finish(0.5)
    assert admission.bound(1.0) == 100


def test_finish_without_admit_is_refused() -> None:
    with pytest.raises(ValueError, match="finish without"):
        Admission(LIMITS).finish(0.0)


@pytest.mark.parametrize(
    ("pending_max", "target", "hint_max"), [(0, 1.0, 1000), (1, 0.0, 1000), (1, 1.0, 100)]
)
def test_bad_limits_are_refused(pending_max: int, target: float, hint_max: int) -> None:
    with pytest.raises(ValueError):
        AdmissionLimits(pending_max, target, hint_max)


@given(
    refusals=st.integers(1, 60),
    draws=st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=60, max_size=60),
)
def test_a_refused_herd_is_spread_at_the_drain_rate(refusals: int, draws: list[float]) -> None:
    """Refused at one instant, the k-th refusal is told a time inside its own slot: the hints
    rise with k, none below the floor hint, and the herd comes back no faster than the rate."""
    admission = Admission(LIMITS)
    fill(admission, 0.0)
    hints = []
    for k in range(refusals):
        result = admission.admit(0.0, draws[k])
        assert isinstance(result, Refused)
        hints.append(result.hint_ms)
    slot_ms = 1000.0 / MIN_RATE_PER_S
    assert all(HINT_MIN_MS <= h <= LIMITS.hint_max_ms for h in hints)
    assert hints == sorted(hints)
    for k, hint in enumerate(hints):
        if hint < LIMITS.hint_max_ms * 0.75:
            # Behind the FLOOR pending calls, then one slot per earlier refusal (never below
            # the shortest hint).
            start = (FLOOR + k) * slot_ms
            assert max(HINT_MIN_MS, start) - 1 <= hint <= max(HINT_MIN_MS, start + slot_ms) + 1


@given(
    events=st.lists(
        st.tuples(st.sampled_from(["admit", "finish"]), st.floats(0.0, 2.0)), max_size=100
    ),
    pending_max=st.integers(1, 500),
    target=st.floats(0.1, 10.0),
    hint_max=st.integers(HINT_MIN_MS, 120_000),
    draw=st.floats(0.0, 1.0, exclude_max=True),
)
def test_pending_never_passes_the_bound_and_hints_stay_in_range(
    events: list[tuple[str, float]], pending_max: int, target: float, hint_max: int, draw: float
) -> None:
    admission = Admission(AdmissionLimits(pending_max, target, hint_max))
    now = 0.0
    for event, step in events:
        now += step
        if event == "finish":
            if admission.pending:
                admission.finish(now)
            continue
        before = admission.pending
        bound = admission.bound(now)
        result = admission.admit(now, draw)
        assert admission.pending <= min(pending_max, max(FLOOR, bound))
        if isinstance(result, Admitted):
            assert before < bound and result.pending == before + 1
        else:
            assert before >= bound and admission.pending == before
            assert HINT_MIN_MS <= result.hint_ms <= hint_max


@given(draws=st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=2, max_size=50))
def test_past_the_cap_hints_are_spread_over_its_last_quarter(draws: list[float]) -> None:
    limits = AdmissionLimits(pending_max=1000, drain_target_s=1.0, hint_max_ms=400)
    admission = Admission(limits)
    fill(admission, 0.0)  # MIN_RATE_PER_S pending at that rate: 1 s, past the 400 ms cap
    for draw in draws:
        result = admission.admit(0.0, draw)
        assert isinstance(result, Refused)
        assert 300 <= result.hint_ms <= 400
        assert result.hint_ms == round(400 * (1 - 0.25 * draw))
