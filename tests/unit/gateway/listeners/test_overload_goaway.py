"""The overload go-away core (actors/core/overload_goaway.py; seed 001's OVERLOADED go-away): the
watermarks and their refusal, how many are sent away and whom, the 5 s cadence, the hysteresis
and the grace; then the `overload_goaway` key of a listener entry
(gateway/config/listener_spec.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from actors.core.overload_goaway import (
    GRACE_S,
    TICK_S,
    Close,
    Effect,
    OverloadGoAway,
    SendAway,
    Watermarks,
    WatermarksRefused,
)
from gateway.config.listener_spec import LOW_NOT_BELOW_HIGH, OVERLOAD_ON_MGMT, parse_listeners
from gateway.config.refusal import BootRefused
from gateway.config.terms import parse_term

AGENT = (
    "name => agent, service_protos => [agent_pb],"
    " services => #{'yuzu.agent.v1.AgentService' => yuzu_gw_agent_service}"
)


def sent(effects: list[Effect]) -> tuple[object, ...]:
    return tuple(key for e in effects if isinstance(e, SendAway) for key in e.connections)


def closed(effects: list[Effect]) -> tuple[object, ...]:
    return tuple(key for e in effects if isinstance(e, Close) for key in e.connections)


# -- the watermarks -------------------------------------------------------------------------------


def test_the_low_watermark_defaults_to_15_percent_below_the_high_one() -> None:
    assert Watermarks.of(4000) == Watermarks(4000, 3400)  # seed 001's example
    assert Watermarks.of(60_000) == Watermarks(60_000, 51_000)
    assert Watermarks.of(10) == Watermarks(10, 8)  # rounded down
    assert Watermarks.of(1) == Watermarks(1, 0)


@given(st.integers(1, 10**6), st.integers(0, 10**6))
def test_a_low_watermark_at_or_above_the_high_one_is_refused(high: int, low: int) -> None:
    if low >= high:
        with pytest.raises(WatermarksRefused, match="not below the high watermark"):
            Watermarks.of(high, low)
    else:
        assert Watermarks.of(high, low) == Watermarks(high, low)


def test_marks_out_of_range_are_refused() -> None:
    with pytest.raises(WatermarksRefused):
        Watermarks.of(0)
    with pytest.raises(WatermarksRefused):
        Watermarks.of(10, -1)


# -- one tick -------------------------------------------------------------------------------------


def test_at_the_high_watermark_exactly_count_minus_low_are_sent_away_then_closed() -> None:
    policy = OverloadGoAway(Watermarks(10, 6))
    live = set(range(10))
    effects = policy.tick(0.0, live, random.Random(1))
    [away] = effects
    assert isinstance(away, SendAway) and away.counted == 10
    assert len(set(away.connections)) == 4 and set(away.connections) <= live
    # Before the grace ends nothing is closed.
    assert policy.tick(GRACE_S / 2, live, random.Random(1)) == []
    assert policy.wakeup_in(GRACE_S / 2) == GRACE_S / 2
    # One left by itself; the other three are closed once their grace has passed, once. At the
    # same check the ones leaving do not count: 6 are left, below the high mark.
    live.discard(away.connections[0])
    assert policy.tick(max(GRACE_S, TICK_S), live, random.Random(1)) == [
        Close(away.connections[1:])
    ]
    assert policy.tick(max(GRACE_S, TICK_S) + 1, live, random.Random(1)) == []
    for key in away.connections[1:]:
        live.discard(key)
    assert policy.tick(3 * TICK_S, live, random.Random(1)) == []
    assert policy.leaving == 0


def test_below_the_high_watermark_nothing_is_sent() -> None:
    policy = OverloadGoAway(Watermarks(10, 6))
    assert policy.tick(0.0, set(range(9)), random.Random(1)) == []
    assert policy.wakeup_in(0.0) == TICK_S


def test_the_check_runs_at_most_once_every_tick() -> None:
    policy = OverloadGoAway(Watermarks(10, 6))
    assert policy.tick(0.0, set(range(5)), random.Random(1)) == []
    # The count reached the high mark a moment later: it is seen at the next check, not before.
    assert policy.tick(1.0, set(range(10)), random.Random(1)) == []
    assert policy.wakeup_in(1.0) == TICK_S - 1.0
    assert len(sent(policy.tick(TICK_S, set(range(10)), random.Random(1)))) == 4


def test_the_choice_is_spread_over_the_connections() -> None:
    chosen: set[object] = set()
    for seed in range(50):
        policy = OverloadGoAway(Watermarks(10, 9))
        chosen.update(sent(policy.tick(0.0, set(range(10)), random.Random(seed))))
    assert chosen == set(range(10))


# -- the rules, under any sequence ----------------------------------------------------------------


class OverloadMachine(RuleBasedStateMachine):
    """Connections come and go, time passes, and the policy ticks; the rules hold throughout."""

    @initialize(
        high=st.integers(1, 40),
        share=st.floats(0.0, 0.99),
        seed=st.integers(0, 2**32),
    )
    def start(self, high: int, share: float, seed: int) -> None:
        self.marks = Watermarks.of(high, int(high * share))
        self.policy = OverloadGoAway(self.marks)
        self.rng = random.Random(seed)
        self.now = 0.0
        self.live: set[int] = set()
        self.next_key = 0
        self.sent_at: dict[int, float] = {}  # every connection sent away, and when
        self.closed: set[int] = set()
        self.last_send: float | None = None
        self.last_check: float | None = None

    @rule(n=st.integers(1, 30))
    def connect(self, n: int) -> None:
        for _ in range(n):
            self.live.add(self.next_key)
            self.next_key += 1

    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        if self.live:
            gone = data.draw(st.sets(st.sampled_from(sorted(self.live)), max_size=10))
            self.live -= gone

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 2.5, TICK_S, GRACE_S + 0.5, 12.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        leaving = {k for k in self.sent_at if k in self.live}
        counted = len(self.live) - len(leaving)
        check_due = self.last_check is None or self.now >= self.last_check + TICK_S
        effects = self.policy.tick(self.now, self.live, self.rng)
        away, shut = sent(effects), closed(effects)
        if check_due:
            self.last_check = self.now
        if away:
            assert check_due, "a check runs at most once every 5 s"
            assert counted >= self.marks.high, "never sends below the high watermark"
            assert len(away) == len(set(away)), "distinct connections"
            assert set(away) <= self.live - leaving, "live ones not already leaving"
            assert counted - len(away) == self.marks.low, "exactly down to the low watermark"
            for key in away:
                self.sent_at[key] = self.now
        else:
            assert not (check_due and counted >= self.marks.high), "at the high mark, it sends"
        for key in shut:
            assert key in self.live and key not in self.closed, "closes a live one, once"
            assert self.now - self.sent_at[key] >= GRACE_S, "only after the grace"
            self.closed.add(key)
        for key, at in self.sent_at.items():
            if key in self.live and self.now - at >= GRACE_S:
                assert key in self.closed, "every grace that passed is acted on"

    @invariant()
    def the_next_wakeup_is_never_in_the_past(self) -> None:
        assert self.policy.wakeup_in(self.now) >= 0.0


TestOverloadMachine = OverloadMachine.TestCase
TestOverloadMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


@settings(max_examples=200, deadline=None)
@given(
    high=st.integers(1, 200),
    low_share=st.floats(0.0, 0.99),
    count=st.integers(0, 400),
    seed=st.integers(0, 2**32),
)
def test_one_check_leaves_exactly_the_low_watermark_or_sends_nothing(
    high: int, low_share: float, count: int, seed: int
) -> None:
    marks = Watermarks.of(high, int(high * low_share))
    away = sent(OverloadGoAway(marks).tick(0.0, set(range(count)), random.Random(seed)))
    if count < high:
        assert away == ()
    else:
        assert len(set(away)) == len(away) == count - marks.low
        assert set(away) <= set(range(count))


# -- the listener entry ---------------------------------------------------------------------------


def entry(extra: str, head: str = AGENT) -> str:
    return f"[#{{{head}, listen => #{{port => 0}}, {extra}}}]."


def test_overload_goaway_is_off_by_default() -> None:
    [spec] = parse_listeners(parse_term(entry("limits => #{max_connections => 100}")))
    assert spec.overload_goaway is None


def test_the_high_watermark_defaults_to_max_connections() -> None:
    text = entry("limits => #{max_connections => 100}, overload_goaway => #{}")
    [spec] = parse_listeners(parse_term(text))
    assert spec.overload_goaway == Watermarks(100, 85)
    text = entry("overload_goaway => #{high_watermark => 50000, low_watermark => 40000}")
    [spec] = parse_listeners(parse_term(text))
    assert spec.overload_goaway == Watermarks(50_000, 40_000)


def refusal(text: str) -> BootRefused:
    with pytest.raises(BootRefused) as refused:
        parse_listeners(parse_term(text))
    return refused.value


def test_a_low_watermark_at_or_above_the_high_one_refuses_boot() -> None:
    refused = refusal(entry("overload_goaway => #{high_watermark => 100, low_watermark => 100}"))
    assert refused.term == LOW_NOT_BELOW_HIGH
    assert "grpc_listeners entry agent overload_goaway" in refused.detail


@pytest.mark.parametrize(
    ("extra", "term"),
    [
        ("overload_goaway => #{high => 10}", "unknown_keys"),
        ("overload_goaway => [high_watermark]", "config_shape"),
        ("limits => #{max_connections => 10}, overload_goaway => #{high_watermark => 11}", None),
        ("overload_goaway => #{high_watermark => 0}", None),
        ("overload_goaway => #{low_watermark => -1}", None),
        ("overload_goaway => #{low_watermark => ten}", None),
    ],
)
def test_a_bad_overload_map_refuses_boot(extra: str, term: str | None) -> None:
    assert refusal(entry(extra)).term == (term or "bad_listener")


def test_overload_goaway_never_applies_to_a_management_listener() -> None:
    mgmt = (
        "name => mgmt, service_protos => [management_pb],"
        " services => #{'yuzu.server.v1.ManagementService' => yuzu_gw_mgmt_service}"
    )
    assert refusal(entry("overload_goaway => #{}", mgmt)).term == OVERLOAD_ON_MGMT
    combined = (
        "name => both, service_protos => [agent_pb, management_pb],"
        " services => #{'yuzu.agent.v1.AgentService' => yuzu_gw_agent_service}"
    )
    assert refusal(entry("overload_goaway => #{}", combined)).term == OVERLOAD_ON_MGMT
