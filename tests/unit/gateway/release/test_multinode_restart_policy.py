"""The release supervisor's restart policy (gateway/release/restart_policy.py): which ended
node is started again, after what backoff, and when restarting is given up."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.release.restart_policy import (
    BACKOFF_CAP_S,
    BACKOFF_FIRST_S,
    INTENSITY,
    PERIOD_S,
    STABLE_AFTER_S,
    GiveUp,
    Leave,
    Restart,
    RestartPolicy,
)

CRASHES = st.sampled_from([2, -9, -11, -6, 70])


def test_a_planned_stop_or_a_refused_boot_is_not_restarted_and_does_not_count() -> None:
    policy = RestartPolicy(intensity=1)
    policy.started(1, 0.0)
    assert policy.exited(1, 0, 1.0) == Leave(1, "stopped")
    policy.started(2, 0.0)
    assert policy.exited(2, 1, 1.0) == Leave(2, "boot refused")
    # Neither used the intensity: the one restart allowed is still there.
    policy.started(3, 0.0)
    assert isinstance(policy.exited(3, -9, 2.0), Restart)


def test_quick_failures_back_off_doubling_to_the_cap_and_a_stable_run_resets() -> None:
    policy = RestartPolicy(intensity=100, period_s=1.0)
    now, delays = 0.0, []
    for _ in range(9):
        policy.started(1, now)
        now += 2.0  # well under STABLE_AFTER_S, and past the (short) period
        decision = policy.exited(1, -9, now)
        assert isinstance(decision, Restart)
        delays.append(decision.delay_s)
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    policy.started(1, now)
    now += STABLE_AFTER_S
    assert policy.exited(1, 2, now) == Restart(1, BACKOFF_FIRST_S, 1)


def test_backoff_is_per_node() -> None:
    policy = RestartPolicy()
    for index in (1, 1, 2):
        policy.started(index, 0.0)
        decision = policy.exited(index, -9, 0.1)
        assert isinstance(decision, Restart)
    assert decision == Restart(2, BACKOFF_FIRST_S, 1)


def test_the_restart_past_the_intensity_gives_up() -> None:
    policy = RestartPolicy()
    for k in range(INTENSITY):
        policy.started(1 + k % 3, float(k))
        assert isinstance(policy.exited(1 + k % 3, -9, float(k) + 0.5), Restart)
    policy.started(1, 20.0)
    assert isinstance(policy.exited(1, -9, 20.5), GiveUp)


@given(
    st.lists(
        st.tuples(st.integers(1, 3), CRASHES, st.floats(0.0, 90.0), st.floats(0.0, 30.0)),
        max_size=60,
    )
)
def test_never_more_than_intensity_restarts_within_a_period(
    events: list[tuple[int, int, float, float]],
) -> None:
    policy = RestartPolicy()
    now = 0.0
    granted: list[float] = []
    for index, status, ran_for, gap in events:
        policy.started(index, now)
        started, now = now, now + ran_for
        decision = policy.exited(index, status, now)
        in_window = [t for t in granted if now - t < PERIOD_S]
        if isinstance(decision, GiveUp):
            # Given up exactly when the period already holds `intensity` restarts.
            assert len(in_window) == INTENSITY
            return
        assert isinstance(decision, Restart)
        assert len(in_window) < INTENSITY
        assert BACKOFF_FIRST_S <= decision.delay_s <= BACKOFF_CAP_S
        expected = min(BACKOFF_FIRST_S * 2 ** (decision.attempt - 1), BACKOFF_CAP_S)
        assert decision.delay_s == pytest.approx(expected)
        if now - started >= STABLE_AFTER_S:
            assert decision.attempt == 1
        granted.append(now)
        now += gap
