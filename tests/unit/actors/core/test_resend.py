"""The acknowledged=false backoff and retry set against the seed's rules (SPEC_INDEX NS-15,
NS-18, NS-19, NS-21): decorrelated jitter from 1 s up to 3x the previous delay capped at 60 s,
the 15-minute slow phase at 0.8-1 x 600 s, and the 120 s DISCONNECTED window.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.resend import (
    BASE_KEY,
    DISCONNECTED_WINDOW_KEY,
    MAX_KEY,
    SLOW_AFTER_KEY,
    SLOW_MAX_KEY,
    Refusals,
    ResendPolicy,
    RetrySet,
    after_refusal,
    next_delay,
    slow_delay,
)

POLICY = ResendPolicy()


def lowest(a: float, _b: float) -> float:
    return a


def highest(_a: float, b: float) -> float:
    return b


def fraction_source(fractions: list[float]):
    """A uniform() that walks through `fractions` of each range: hypothesis picks the draws."""
    it = iter(fractions * 1000)

    def uniform(a: float, b: float) -> float:
        return a + (b - a) * next(it)

    return uniform


fractions = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20)


# --- the backoff ------------------------------------------------------------------------------


def test_defaults_are_the_seeds() -> None:
    assert (POLICY.base_s, POLICY.max_s) == (1.0, 60.0)
    assert (POLICY.slow_after_s, POLICY.slow_max_s, POLICY.slow_floor) == (900.0, 600.0, 0.8)
    assert POLICY.disconnected_window_s == 120.0
    assert POLICY.slots == 5


def test_from_config_converts_milliseconds() -> None:
    policy = ResendPolicy.from_config(
        {
            BASE_KEY: 500,
            MAX_KEY: 30_000,
            SLOW_AFTER_KEY: 60_000,
            SLOW_MAX_KEY: 120_000,
            DISCONNECTED_WINDOW_KEY: 10_000,
        }
    )
    assert (policy.base_s, policy.max_s, policy.slow_after_s) == (0.5, 30.0, 60.0)
    assert (policy.slow_max_s, policy.disconnected_window_s) == (120.0, 10.0)
    assert ResendPolicy.from_config({}) == POLICY


def test_first_resend_comes_one_to_three_seconds_after_the_refusal() -> None:
    assert next_delay(POLICY, None, lowest) == 1.0
    assert next_delay(POLICY, None, highest) == 3.0


@given(previous=st.floats(0.0, 10_000.0), fraction=st.floats(0.0, 1.0))
def test_next_delay_bounds(previous: float, fraction: float) -> None:
    delay = next_delay(POLICY, previous, fraction_source([fraction]))
    assert POLICY.base_s <= delay <= POLICY.max_s
    assert delay <= max(POLICY.base_s, 3 * max(previous, POLICY.base_s))


@given(draws=fractions)
def test_a_run_of_refusals_stays_within_base_and_cap(draws: list[float]) -> None:
    uniform = fraction_source(draws)
    previous = None
    for _ in range(50):
        delay = next_delay(POLICY, previous, uniform)
        assert 1.0 <= delay <= 60.0
        if previous is not None:
            assert delay <= 3 * previous
        previous = delay


def test_a_stray_random_source_cannot_leave_the_bounds() -> None:
    assert next_delay(POLICY, 50.0, lambda _a, _b: -7.0) == 1.0
    assert next_delay(POLICY, 50.0, lambda _a, _b: 1e9) == 60.0
    assert slow_delay(POLICY, lambda _a, _b: 0.0) == 480.0
    assert slow_delay(POLICY, lambda _a, _b: 1e9) == 600.0


def test_the_delay_averages_about_34_seconds() -> None:
    # The seed's simulated figure: 5,000 refused sessions cost about 150 resends a second.
    uniform = random.Random(7).uniform
    delay, total, n = None, 0.0, 20_000
    for _ in range(n):
        delay = next_delay(POLICY, delay, uniform)
        total += delay
    assert 31.0 < total / n < 37.0
    assert 135 < 5_000 / (total / n) < 165


@given(fraction=st.floats(0.0, 1.0))
def test_slow_delay_is_point_eight_to_one_times_600_s(fraction: float) -> None:
    assert 480.0 <= slow_delay(POLICY, fraction_source([fraction])) <= 600.0


@given(draws=fractions, gap=st.floats(0.0, 2_000.0))
def test_connected_slows_after_fifteen_minutes_and_never_expires(
    draws: list[float], gap: float
) -> None:
    uniform = fraction_source(draws)
    history = after_refusal(POLICY, None, True, 0.0, uniform)
    assert history is not None and history.count == 1 and not history.slow
    now = 0.0
    for _ in range(40):
        now += history.delay_s + gap
        history = after_refusal(POLICY, history, True, now, uniform)
        assert history is not None  # a CONNECTED has no time limit
        assert history.first_at == 0.0
        if now >= 900.0:
            assert history.slow and 480.0 <= history.delay_s <= 600.0
        else:
            assert not history.slow and 1.0 <= history.delay_s <= 60.0


def test_slow_threshold_is_time_not_refusals() -> None:
    # Ten refusals at the shortest backoff take seconds, not fifteen minutes: not slowed.
    history: Refusals | None = None
    now = 0.0
    for _ in range(10):
        history = after_refusal(POLICY, history, True, now, lowest)
        assert history is not None
        now += history.delay_s
    assert history is not None and history.count == 10 and not history.slow
    slowed = after_refusal(POLICY, history, True, 900.0, lowest)
    assert slowed is not None and slowed.slow and slowed.delay_s == 480.0


@given(draws=fractions)
def test_disconnected_is_resent_only_inside_its_window(draws: list[float]) -> None:
    uniform = fraction_source(draws)
    history = after_refusal(POLICY, None, False, 5.0, uniform)
    assert history is not None
    now = 5.0
    resends = 0
    while history is not None:
        assert not history.slow  # never slowed
        now += history.delay_s
        assert now <= 5.0 + 120.0  # every resend falls inside the window
        resends += 1
        history = after_refusal(POLICY, history, False, now, uniform)
    assert resends >= 2  # the window holds at least a few resends


def test_window_boundary() -> None:
    history = Refusals(first_at=0.0, count=3, delay_s=30.0, slow=False)
    assert after_refusal(POLICY, history, False, 119.0, lowest) is not None  # 120.0: inside
    assert after_refusal(POLICY, history, False, 119.5, lowest) is None  # 120.5: outside


# --- the retry set ----------------------------------------------------------------------------


def retry_set(capacity: int = 100, uniform=lowest) -> RetrySet[str]:
    return RetrySet(POLICY, uniform, capacity)


def test_refuse_schedules_and_pop_due_follows_due_order() -> None:
    rs = retry_set(uniform=highest)
    assert rs.refuse("k1", "s1", "n1", True, 0.0)[0] == "scheduled"  # due at 3.0
    assert rs.refuse("k2", "s2", "n2", True, 1.0)[0] == "scheduled"  # due at 4.0
    assert rs.next_deadline() == 3.0
    assert rs.pop_due(2.9) is None
    first = rs.pop_due(10.0)
    assert first is not None and first.key == "k1" and first.out
    second = rs.pop_due(10.0)
    assert second is not None and second.key == "k2"
    assert rs.pop_due(10.0) is None and rs.out == 2 and len(rs) == 2


def test_refusal_history_carries_over_and_ack_forgets_it() -> None:
    rs = retry_set(uniform=highest)
    rs.refuse("k", "s", "n", True, 0.0)
    entry = rs.pop_due(3.0)
    assert entry is not None
    verdict, history = rs.refuse("k", "s", "n", True, 3.0)
    assert verdict == "scheduled" and history is not None
    assert (history.count, history.first_at, history.delay_s) == (2, 0.0, 9.0)  # 3 x 3 s
    rs.remove("k")  # acknowledged
    _, fresh = rs.refuse("k", "s", "n", True, 20.0)
    assert fresh is not None and (fresh.count, fresh.first_at, fresh.delay_s) == (1, 20.0, 3.0)


def test_capacity() -> None:
    rs = retry_set(capacity=2)
    rs.refuse("a", "s", "n", True, 0.0)
    rs.refuse("b", "s", "n", True, 0.0)
    assert rs.refuse("c", "s", "n", True, 0.0) == ("full", None)
    # An entry already in the set (its resend refused again) is never "full".
    assert rs.pop_due(5.0) is not None
    assert rs.refuse("a", "s", "n", True, 5.0)[0] == "scheduled"


def test_requeue_puts_a_failed_resend_at_the_head() -> None:
    rs = retry_set()
    for key in ("a", "b", "c"):
        rs.refuse(key, key, key, True, 0.0)
    taken = [rs.pop_due(10.0) for _ in range(2)]
    assert [e.key for e in taken if e] == ["a", "b"]
    rs.requeue("b")
    rs.requeue("a")
    order = []
    while (entry := rs.pop_due(10.0)) is not None:
        order.append(entry.key)
    assert order == ["a", "b", "c"]


def test_expire_removes_waiting_disconnected_after_the_window() -> None:
    rs = retry_set()
    rs.refuse("d", "s", "n", False, 0.0)
    rs.refuse("c", "s2", "n", True, 0.0)
    assert rs.expire(119.9) == []
    expired = rs.expire(120.0)
    assert [e.key for e in expired] == ["d"] and "d" not in rs and "c" in rs
    # An out entry is not expired under its resend; its result decides.
    rs.remove("c")
    rs.refuse("d2", "s3", "n", False, 0.0)
    entry = rs.pop_due(1.0)
    assert entry is not None and entry.key == "d2"
    assert rs.expire(500.0) == []


def test_cancel_waiting_and_out() -> None:
    rs = retry_set()
    rs.refuse("a", "s", "n", True, 0.0)
    rs.refuse("b", "s", "n", True, 0.0)
    assert rs.cancel("a") == "removed" and "a" not in rs
    entry = rs.pop_due(5.0)
    assert entry is not None and entry.key == "b"
    assert rs.cancel("b") == "marked" and rs.get("b") is not None and entry.superseded
    assert rs.cancel("zz") == "absent"


def test_cancel_session_covers_every_stream_home() -> None:
    rs = retry_set()
    rs.refuse(("a", "s", "h1"), ("a", "s"), "n", False, 0.0)
    rs.refuse(("a", "s", "h2"), ("a", "s"), "n", True, 0.0)
    rs.refuse(("a", "t", "h3"), ("a", "t"), "n", True, 0.0)
    out = rs.pop_due(5.0)
    assert out is not None and out.key == ("a", "s", "h1")
    removed, marked = rs.cancel_session(("a", "s"))
    assert [e.key for e in removed] == [("a", "s", "h2")] and marked == 1
    assert out.superseded and ("a", "t", "h3") in rs


def test_slow_keys_are_counted() -> None:
    rs = retry_set()
    rs.refuse("k", "s", "n", True, 0.0)
    assert rs.slow_keys == 0
    rs.pop_due(1.0)
    rs.refuse("k", "s", "n", True, 900.0)
    assert rs.slow_keys == 1
    rs.remove("k")
    assert rs.slow_keys == 0


def test_take_waiting_keeps_what_it_is_told() -> None:
    rs = retry_set()
    rs.refuse("c", "s1", "n", True, 0.0)
    rs.refuse("d", "s2", "n", False, 0.0)
    gone = rs.take_waiting(keep=lambda e: not e.connected)
    assert [e.key for e in gone] == ["c"] and "d" in rs
    entry = rs.pop_due(0.0, ignore_due=True)  # the flush sends it whatever its backoff
    assert entry is not None and entry.key == "d"


@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["refuse", "pop", "cancel", "requeue", "expire"]), st.integers(0, 5)
        ),
        max_size=60,
    ),
    draws=fractions,
)
@settings(max_examples=200)
def test_retry_set_bookkeeping(ops: list[tuple[str, int]], draws: list[float]) -> None:
    rs: RetrySet[str] = RetrySet(POLICY, fraction_source(draws), 4)
    now = 0.0
    out: set[int] = set()
    for op, i in ops:
        now += 7.0
        connected = i % 2 == 0
        if op == "refuse" and (i not in rs or i in out):
            verdict, history = rs.refuse(i, i, str(i), connected, now)
            out.discard(i)
            if verdict == "scheduled":
                assert history is not None and rs.get(i) is not None
        elif op == "pop":
            entry = rs.pop_due(now)
            if entry is not None:
                assert entry.due <= now and entry.key not in out
                out.add(entry.key)
        elif op == "cancel":
            if rs.cancel(i) == "removed":
                assert i not in rs
        elif op == "requeue" and i in out:
            rs.requeue(i)
            out.discard(i)
        elif op == "expire":
            for entry in rs.expire(now):
                assert not entry.connected and entry.window_end <= now
        assert len(rs) <= 4
        assert rs.out == len([k for k in out if k in rs])
        entries = rs.entries()
        assert rs.slow_keys == sum(e.refusals.slow for e in entries)
        deadline = rs.next_deadline()
        waiting = [e for e in entries if not e.out]
        if deadline is not None:
            assert any(math.isclose(deadline, e.due) or deadline == e.window_end for e in waiting)


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="base_s"):
        ResendPolicy(base_s=0.0)
    with pytest.raises(ValueError, match="slow_floor"):
        ResendPolicy(slow_floor=1.5)
    assert ResendPolicy(base_s=5.0, max_s=2.0).effective_max_s == 5.0
