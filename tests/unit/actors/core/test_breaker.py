"""The circuit breaker core against the seed's rules (SPEC_INDEX CB-01..CB-15, section 8 lines).

Example tests pin the numbers and the log lines; the state machine drives arbitrary sequences of
admissions, results and time against a small reference model.
"""

from __future__ import annotations

import logging
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from actors.core import LogLine, range_checked
from actors.core.backoff import TOO_MANY_STREAMS, Doubling
from actors.core.breaker import (
    Breaker,
    BreakerPolicy,
    Lane,
    ProbeReady,
    PublishState,
    ResultKind,
    StaleTicketError,
    State,
    Ticket,
    Transition,
    Verdict,
    classify,
    classify_status,
    policy_from_settings,
)
from gateway.config.keys import SCHEMA
from gateway.config.keys.breaker import (
    CIRCUIT_BREAKER_FAILURE_THRESHOLD,
    CIRCUIT_BREAKER_MAX_RESET_TIMEOUT_MS,
    CIRCUIT_BREAKER_RESET_TIMEOUT_MS,
)
from gateway.config.resolve import resolve_section
from gateway.config.terms import parse_term

S, F, N = Verdict.SUCCESS, Verdict.FAILURE, Verdict.NEUTRAL


def transitions(effects: list) -> list[tuple[State, State]]:
    return [(e.previous, e.current) for e in effects if isinstance(e, Transition)]


def lines(effects: list) -> list[LogLine]:
    return [e.line for e in effects if isinstance(e, Transition)]


def trip(breaker: Breaker, now: float) -> list:
    """Feed `threshold` failures admitted in the current period."""
    effects: list = []
    for _ in range(breaker.policy.threshold):
        admission = breaker.admit(now)
        assert admission.ticket is not None
        effects += breaker.record(admission.ticket, F, now)
    return effects


# --- classification -----------------------------------------------------------------------------

CALL_LANES = [Lane.REGISTER, Lane.INVENTORY, Lane.REPLAY, Lane.NOTIFY, Lane.GUARDIAN]


@pytest.mark.parametrize("lane", CALL_LANES)
@pytest.mark.parametrize("code", range(17))
def test_status_classification(lane: Lane, code: int) -> None:
    verdict = classify(ResultKind.STATUS, lane, code)
    assert verdict is classify_status(code, lane)
    if code == 0:
        assert verdict is S
    elif code == 9 and lane is Lane.REPLAY:
        assert verdict is S  # superseded: the replay path's authoritative answer
    elif code in {3, 5, 6, 9, 11}:
        assert verdict is N
    else:
        assert verdict is F  # 7, 8 and 16 included


@pytest.mark.parametrize("code", [7, 8, 16, 1, 2, 4, 10, 12, 13, 14, 15, 99])
def test_counted_statuses(code: int) -> None:
    assert classify_status(code, Lane.REGISTER) is F


@pytest.mark.parametrize("lane", CALL_LANES)
@pytest.mark.parametrize(
    "kind",
    [
        ResultKind.TRANSPORT,
        ResultKind.TIMEOUT,
        ResultKind.TLS,
        ResultKind.HTTP,
        ResultKind.EXCEPTION,
        ResultKind.PROBE_KILLED,
    ],
)
def test_transport_kinds_are_failures(lane: Lane, kind: ResultKind) -> None:
    assert classify(kind, lane) is F


@pytest.mark.parametrize("lane", CALL_LANES)
def test_encode_and_unacknowledged_are_neutral(lane: Lane) -> None:
    assert classify(ResultKind.ENCODE, lane) is N
    assert classify(ResultKind.UNACKNOWLEDGED, lane) is N
    assert classify(ResultKind.OK, lane) is S


def test_too_many_streams_depends_on_the_lane() -> None:
    for lane in (Lane.REGISTER, Lane.INVENTORY, Lane.REPLAY):
        assert classify(ResultKind.TOO_MANY_STREAMS, lane) is N  # permit holders re-ask
    assert classify(ResultKind.TOO_MANY_STREAMS, Lane.NOTIFY) is F  # that lane does not retry
    assert classify(ResultKind.TOO_MANY_STREAMS, Lane.GUARDIAN) is F


@pytest.mark.parametrize("kind", list(ResultKind))
def test_heartbeat_flush_never_feeds_the_breaker(kind: ResultKind) -> None:
    assert classify(kind, Lane.HEARTBEAT_FLUSH, 14) is N


def test_status_kind_needs_a_code() -> None:
    with pytest.raises(ValueError, match="status code"):
        classify(ResultKind.STATUS, Lane.REGISTER)


# --- transitions and log lines ------------------------------------------------------------------


def test_five_consecutive_failures_open_it_with_the_seed_line() -> None:
    breaker = Breaker()
    effects = trip(breaker, 0.0)
    assert transitions(effects) == [(State.CLOSED, State.OPEN)]
    assert lines(effects) == [LogLine("warning", "Circuit breaker: OPEN (will probe in 10000ms)")]
    assert PublishState(State.OPEN, breaker.epoch, 10.0) in effects
    assert breaker.is_open
    assert breaker.next_deadline() == 10.0
    refused = breaker.admit(9.999)
    assert not refused.allowed and refused.refusal == "circuit_open"


def test_a_success_resets_the_run_and_a_neutral_does_not() -> None:
    breaker = Breaker()
    for verdict in (F, F, F, F, S, F, F, F, F, N, N):
        ticket = breaker.admit(0.0).ticket
        assert ticket is not None
        breaker.record(ticket, verdict, 0.0)
    assert breaker.state is State.CLOSED and breaker.failures == 4
    ticket = breaker.admit(0.0).ticket
    assert ticket is not None
    assert transitions(breaker.record(ticket, F, 0.0)) == [(State.CLOSED, State.OPEN)]


def test_half_open_after_the_reset_timeout_then_probe_success_closes() -> None:
    breaker = Breaker()
    trip(breaker, 0.0)
    assert breaker.poll(9.0) == []
    effects = breaker.poll(10.0)
    assert transitions(effects) == [(State.OPEN, State.HALF_OPEN)]
    assert ProbeReady(breaker.epoch) in effects
    assert not breaker.is_open  # /readyz fails only while OPEN
    probe = breaker.admit_notification(10.0)
    assert probe.allowed and probe.ticket == Ticket(breaker.epoch, probe=True)
    second = breaker.admit_notification(10.5)
    assert not second.allowed and second.refusal == "probe_out"
    effects = breaker.record(probe.ticket, S, 11.0)
    assert lines(effects) == [
        LogLine("info", "Circuit breaker: half_open -> closed (probe succeeded)")
    ]
    assert breaker.state is State.CLOSED and breaker.reset_s == 10.0


def test_failed_probes_double_up_to_the_cap_and_success_resets() -> None:
    breaker = Breaker()
    trip(breaker, 0.0)
    now, periods = 0.0, []
    for _ in range(4):
        now = breaker.next_deadline() or now
        breaker.poll(now)
        probe = breaker.admit_notification(now)
        assert probe.ticket is not None
        effects = breaker.record(probe.ticket, F, now, reason="econnrefused")
        periods.append(breaker.reset_s)
        ms = round(breaker.reset_s * 1000)
        assert lines(effects) == [
            LogLine(
                "warning",
                f"Circuit breaker: half_open -> open (probe failed: econnrefused; "
                f"will probe in {ms}ms)",
            )
        ]
    assert periods == [20.0, 30.0, 30.0, 30.0]
    now = breaker.next_deadline() or now
    probe = breaker.admit_notification(now)
    assert probe.ticket is not None
    breaker.record(probe.ticket, S, now)
    assert breaker.reset_s == 10.0
    trip(breaker, now)
    assert breaker.next_deadline() == now + 10.0  # no growth after a success (CB-15)


def test_observed_sequence_with_a_20_s_cap() -> None:
    # Seed: "the open duration doubled and then held at the configured cap (5, 10, 20, 20 s with
    # a 20 s cap, six half open periods, one probe each)".
    breaker = Breaker(BreakerPolicy(base_s=5.0, cap_s=20.0))
    trip(breaker, 0.0)
    seen = [breaker.reset_s]
    for _ in range(3):
        now = breaker.next_deadline()
        assert now is not None
        probe = breaker.admit_notification(now)
        assert probe.ticket is not None
        breaker.record(probe.ticket, F, now)
        seen.append(breaker.reset_s)
    assert seen == [5.0, 10.0, 20.0, 20.0]


def test_neutral_probe_frees_the_slot_and_leaves_it_half_open() -> None:
    breaker = Breaker()
    trip(breaker, 0.0)
    probe = breaker.admit_notification(10.0)
    assert probe.ticket is not None
    effects = breaker.record(probe.ticket, N, 10.1)
    assert effects == [ProbeReady(breaker.epoch)]
    assert breaker.state is State.HALF_OPEN and not breaker.probe_out
    again = breaker.admit_notification(10.1)
    assert again.allowed and again.ticket is not None and again.ticket.probe


def test_call_path_closes_while_probe_out_and_the_late_probe_is_ignored() -> None:
    breaker = Breaker()
    trip(breaker, 0.0)
    probe = breaker.admit_notification(10.0)
    call = breaker.admit(10.0)  # seed: a ProxyRegister retry is sent while the probe is out
    assert call.allowed and call.ticket is not None and not call.ticket.probe
    assert probe.ticket is not None
    assert transitions(breaker.record(call.ticket, S, 10.2)) == [(State.HALF_OPEN, State.CLOSED)]
    assert breaker.admit_notification(10.2).allowed  # the drain resumes at once (CB-09)
    assert breaker.record(probe.ticket, F, 10.3) == []  # late probe: left alone
    assert breaker.state is State.CLOSED and breaker.failures == 0


def test_probe_result_from_an_earlier_half_open_period_is_ignored() -> None:
    breaker = Breaker()
    trip(breaker, 0.0)
    old = breaker.admit_notification(10.0).ticket
    assert old is not None
    call = breaker.admit(10.0).ticket
    assert call is not None
    breaker.record(call, F, 10.0)  # reopened by the call path, 20 s
    breaker.poll(30.0)  # the next half-open period
    assert breaker.state is State.HALF_OPEN
    assert breaker.record(old, S, 30.1) == []
    assert breaker.state is State.HALF_OPEN


def test_strict_half_open_admits_one_call_only() -> None:
    breaker = Breaker(BreakerPolicy(half_open_admits_calls=False))
    trip(breaker, 0.0)
    first = breaker.admit(10.0)
    assert first.allowed and first.ticket is not None and first.ticket.probe
    assert breaker.admit(10.0).refusal == "circuit_open"
    assert breaker.admit_notification(10.0).refusal == "probe_out"


def test_lazy_half_open_reports_its_effects_on_admission() -> None:
    breaker = Breaker()
    trip(breaker, 0.0)
    admission = breaker.admit(12.0)
    assert admission.allowed
    assert transitions(list(admission.effects)) == [(State.OPEN, State.HALF_OPEN)]


def test_a_ticket_from_the_future_is_an_error() -> None:
    with pytest.raises(StaleTicketError):
        Breaker().record(Ticket(epoch=3, probe=False), F, 0.0)


def test_results_admitted_before_the_breaker_opened_are_ignored() -> None:
    breaker = Breaker()
    late = [breaker.admit(0.0).ticket for _ in range(20)]
    trip(breaker, 0.0)
    breaker.poll(10.0)
    for ticket in late:
        assert ticket is not None
        assert breaker.record(ticket, F, 10.0) == []
    assert breaker.state is State.HALF_OPEN


# --- configuration ------------------------------------------------------------------------------


def resolved(env: dict[str, str] | None = None, **app: int) -> BreakerPolicy:
    """The policy from a resolved configuration, as the upstream actor builds it."""
    # {allow_no_listeners, true}: a partial config with no agent listener (lab-rig key).
    terms = ["{allow_no_listeners, true}"] + [f"{{{k}, {v}}}" for k, v in app.items()]
    text = "[" + ", ".join(terms) + "]."
    config = resolve_section(SCHEMA, parse_term(text), env or {}, "test.config")
    return policy_from_settings(
        threshold=config[CIRCUIT_BREAKER_FAILURE_THRESHOLD],
        reset_timeout_ms=config[CIRCUIT_BREAKER_RESET_TIMEOUT_MS],
        max_reset_timeout_ms=config[CIRCUIT_BREAKER_MAX_RESET_TIMEOUT_MS],
    )


def test_defaults() -> None:
    assert resolved() == BreakerPolicy(threshold=5, base_s=10.0, cap_s=30.0)


def test_keys_and_env_overrides() -> None:
    app = {
        "circuit_breaker_failure_threshold": 7,
        "circuit_breaker_reset_timeout_ms": 2000,
        "circuit_breaker_max_reset_timeout_ms": 60_000,
    }
    policy = resolved(**app)
    assert (policy.threshold, policy.base_s, policy.cap_s) == (7, 2.0, 60.0)
    env = {
        "YUZU_GW_CIRCUIT_BREAKER_FAILURE_THRESHOLD": "9",
        "YUZU_GW_CIRCUIT_BREAKER_RESET_TIMEOUT_MS": "500",
    }
    policy = resolved(env, **app)
    assert (policy.threshold, policy.base_s, policy.cap_s) == (9, 0.5, 60.0)


@pytest.mark.parametrize(
    ("app", "env", "expected_warning"),
    [
        (
            {"circuit_breaker_failure_threshold": 0},
            {},
            "circuit_breaker_failure_threshold is 0, not an integer from 1 to 1000",
        ),
        (
            {},
            {"YUZU_GW_CIRCUIT_BREAKER_FAILURE_THRESHOLD": "1001"},
            "YUZU_GW_CIRCUIT_BREAKER_FAILURE_THRESHOLD is 1001, not an integer from 1 to 1000",
        ),
        (
            {"circuit_breaker_reset_timeout_ms": 99},
            {},
            "circuit_breaker_reset_timeout_ms is 99, not an integer from 100 to 3600000",
        ),
    ],
)
def test_bad_values_warn_naming_the_key_and_take_the_default(
    caplog: pytest.LogCaptureFixture,
    app: dict[str, int],
    env: dict[str, str],
    expected_warning: str,
) -> None:
    """The configuration checks each value once (gateway/config/keys/breaker.py)."""
    caplog.set_level(logging.WARNING, logger="yuzu_gw.config")
    assert resolved(env, **app) == BreakerPolicy()
    [warning] = [r.getMessage() for r in caplog.records if r.name == "yuzu_gw.config"]
    assert expected_warning in warning


def test_a_bad_env_value_takes_the_default_not_the_key() -> None:
    env = {"YUZU_GW_CIRCUIT_BREAKER_FAILURE_THRESHOLD": "1001"}
    assert resolved(env, circuit_breaker_failure_threshold=7).threshold == 5


def test_the_maximum_is_never_below_the_base() -> None:
    policy = policy_from_settings(threshold=5, reset_timeout_ms=60_000, max_reset_timeout_ms=100)
    assert policy.base_s == 60.0 and policy.cap_s == 60.0


@pytest.mark.parametrize("raw", [True, 1.5, "", " ", "1e3", "²", None, [], "-"])
def test_range_checked_rejects_non_integers(raw: object) -> None:
    value, warning = range_checked("k", raw, 5, 1, 10)
    assert value == 5
    assert (warning is None) == (raw is None)


def test_range_checked_echo_is_bounded() -> None:
    _, warning = range_checked("k", "x" * 1000, 5, 1, 10)
    assert warning is not None and len(warning.text) < 200


@given(st.integers(-10, 2000))
def test_threshold_range(value: int) -> None:
    got, warning = range_checked("circuit_breaker_failure_threshold", value, 5, 1, 1000)
    assert (got, warning is None) == ((value, True) if 1 <= value <= 1000 else (5, False))


# --- backoff ------------------------------------------------------------------------------------


def test_too_many_streams_backoff() -> None:
    delays = [TOO_MANY_STREAMS.delay(n) for n in range(7)]
    assert delays == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.1, 0.1, 0.1])
    assert TOO_MANY_STREAMS.delay(10**6) == 0.1


@given(
    base=st.floats(0.1, 3600.0),
    cap=st.floats(0.1, 3600.0),
    failed_probes=st.integers(0, 40),
)
@settings(max_examples=150)
def test_open_period_after_k_failed_probes(base: float, cap: float, failed_probes: int) -> None:
    breaker = Breaker(BreakerPolicy(base_s=base, cap_s=max(base, cap)))
    trip(breaker, 0.0)
    for _ in range(failed_probes):
        now = breaker.next_deadline()
        assert now is not None
        probe = breaker.admit_notification(now)
        assert probe.ticket is not None
        breaker.record(probe.ticket, F, now)
    expected = Doubling(base, max(base, cap)).delay(failed_probes)
    assert breaker.reset_s == pytest.approx(expected)
    assert base <= breaker.reset_s <= max(base, cap)


# --- the state machine --------------------------------------------------------------------------


class Model:
    """The rules, written plainly: no epochs in the breaker sense, just "which period"."""

    def __init__(self, policy: BreakerPolicy) -> None:
        self.p = policy
        self.state = "closed"
        self.run = 0
        self.period = 0
        self.wait = policy.base_s
        self.open_until = math.inf
        self.probe_out = False

    def _enter(self, state: str) -> None:
        self.state = state
        self.period += 1
        self.probe_out = False

    def tick(self, now: float) -> None:
        if self.state == "open" and now >= self.open_until:
            self._enter("half_open")

    def admit_call(self, now: float) -> tuple[bool, bool]:
        self.tick(now)
        if self.state == "closed":
            return True, False
        if self.state == "half_open":
            if self.p.half_open_admits_calls:
                return True, False
            if not self.probe_out:
                self.probe_out = True
                return True, True
        return False, False

    def admit_note(self, now: float) -> tuple[bool, bool]:
        self.tick(now)
        if self.state == "closed":
            return True, False
        if self.state == "half_open" and not self.probe_out:
            self.probe_out = True
            return True, True
        return False, False

    def result(self, period: int, probe: bool, verdict: Verdict, now: float) -> None:
        self.tick(now)
        if period != self.period:
            return
        if self.state == "closed":
            if verdict is S:
                self.run = 0
            elif verdict is F:
                self.run += 1
                if self.run >= self.p.threshold:
                    self.run = 0
                    self.wait = self.p.base_s
                    self.open_until = now + self.wait
                    self._enter("open")
        elif self.state == "half_open":
            if verdict is S:
                self.wait = self.p.base_s
                self._enter("closed")
            elif verdict is F:
                self.wait = min(self.wait * 2, max(self.p.cap_s, self.p.base_s))
                self.open_until = now + self.wait
                self._enter("open")
            elif probe:
                self.probe_out = False


class BreakerMachine(RuleBasedStateMachine):
    tickets = Bundle("tickets")

    def __init__(self) -> None:
        super().__init__()
        self.breaker: Breaker | None = None
        self.model: Model | None = None
        self.now = 0.0
        self.out: list[Ticket] = []

    @precondition(lambda self: self.breaker is None)
    @rule(
        threshold=st.integers(1, 4),
        base=st.sampled_from([0.5, 1.0, 10.0]),
        cap_factor=st.sampled_from([1, 2, 3, 8]),
        admits=st.booleans(),
    )
    def start(self, threshold: int, base: float, cap_factor: int, admits: bool) -> None:
        policy = BreakerPolicy(
            threshold=threshold,
            base_s=base,
            cap_s=min(base * cap_factor, 3600.0),
            half_open_admits_calls=admits,
        )
        self.breaker = Breaker(policy)
        self.model = Model(policy)

    def _check_effects(self, effects: list | tuple) -> None:
        assert self.breaker is not None
        for effect in effects:
            if isinstance(effect, Transition):
                text = effect.line.text
                assert text.startswith("Circuit breaker: ")
                if effect.current is State.OPEN:
                    assert effect.line.level == "warning"
                    assert text.endswith(f"will probe in {round(effect.reset_s * 1000)}ms)")
                    if effect.previous is State.CLOSED:
                        assert text.startswith("Circuit breaker: OPEN (will probe in ")
                    else:
                        assert "half_open -> open (probe failed" in text
                elif effect.current is State.CLOSED:
                    assert text == "Circuit breaker: half_open -> closed (probe succeeded)"
        published = [e for e in effects if isinstance(e, PublishState)]
        assert len(published) == len([e for e in effects if isinstance(e, Transition)])

    @precondition(lambda self: self.breaker is not None)
    @rule(dt=st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 10.0, 40.0]))
    def advance(self, dt: float) -> None:
        assert self.breaker is not None and self.model is not None
        self.now += dt
        self._check_effects(self.breaker.poll(self.now))
        self.model.tick(self.now)

    @precondition(lambda self: self.breaker is not None)
    @rule(target=tickets, notification=st.booleans())
    def admit(self, notification: bool) -> Ticket | None:
        assert self.breaker is not None and self.model is not None
        if notification:
            got = self.breaker.admit_notification(self.now)
            want = self.model.admit_note(self.now)
        else:
            got = self.breaker.admit(self.now)
            want = self.model.admit_call(self.now)
        self._check_effects(got.effects)
        assert (got.allowed, got.ticket is not None and got.ticket.probe) == want
        if got.ticket is not None:
            self.out.append(got.ticket)
        return got.ticket

    @precondition(lambda self: self.breaker is not None)
    @rule(
        ticket=consumes(tickets), verdict=st.sampled_from(list(Verdict)), reason=st.text(max_size=5)
    )
    def finish(self, ticket: Ticket | None, verdict: Verdict, reason: str) -> None:
        assert self.breaker is not None and self.model is not None
        if ticket is None:
            return
        self.out.remove(ticket)
        self._check_effects(self.breaker.poll(self.now))  # isolate the result's own effects
        self.model.tick(self.now)
        before = (self.breaker.state, self.breaker.failures, self.breaker.reset_s)
        epoch_before = self.breaker.epoch
        effects = self.breaker.record(ticket, verdict, self.now, reason)
        self.model.result(self.period_of(ticket, epoch_before), ticket.probe, verdict, self.now)
        self._check_effects(effects)
        if verdict is N:
            # Neutral never moves it: same state, same run, same backoff.
            assert (self.breaker.state, self.breaker.failures, self.breaker.reset_s) == before
            assert transitions(effects) == []

    def period_of(self, ticket: Ticket, epoch_now: int) -> int:
        # Epochs and model periods both start at 0 and move on every transition.
        assert self.model is not None
        return self.model.period - (epoch_now - ticket.epoch)

    @invariant()
    def agrees_with_the_model(self) -> None:
        if self.breaker is None or self.model is None:
            return
        assert self.breaker.state.value == self.model.state
        assert self.breaker.epoch == self.model.period
        assert self.breaker.reset_s == pytest.approx(self.model.wait)
        assert self.breaker.probe_out == self.model.probe_out
        if self.breaker.state is State.CLOSED:
            assert self.breaker.failures == self.model.run < self.breaker.policy.threshold

    @invariant()
    def backoff_is_bounded(self) -> None:
        if self.breaker is None:
            return
        policy = self.breaker.policy
        assert policy.base_s <= self.breaker.reset_s <= max(policy.base_s, policy.cap_s)
        if self.breaker.state is State.CLOSED:
            assert self.breaker.reset_s == policy.base_s

    @invariant()
    def exactly_one_probe(self) -> None:
        if self.breaker is None:
            return
        live_probes = [t for t in self.out if t.probe and t.epoch == self.breaker.epoch]
        assert len(live_probes) <= 1
        assert self.breaker.probe_out == (len(live_probes) == 1)
        if self.breaker.probe_out:
            assert self.breaker.state is State.HALF_OPEN


TestBreakerMachine = BreakerMachine.TestCase
TestBreakerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
