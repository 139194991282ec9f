"""The held stream-status notification store against the seed's rules (SPEC_INDEX NS-02..NS-23,
CB-04..CB-12, PS-06, PS-07).

Example tests replay the seed's scenarios; the state machine drives arbitrary offers, breaker
states, results, time and the planned stop, and checks the rules after every step against a plain
model of the queue (order, replacement, cap and eviction).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from actors.core import LogLine
from actors.core.breaker import State
from actors.core.notify_store import (
    COALESCED,
    DROPPED,
    INITIAL_SERIES,
    LOST,
    REQUEUED,
    UNACKED_ENDED,
    UNACKNOWLEDGED,
    ArmFullReplay,
    Count,
    Event,
    HighWater,
    Mode,
    Notification,
    NotifyPolicy,
    NotifyStore,
    Send,
    Settled,
    log_text,
    pending_max_for,
    sanitise_peer_addr,
)
from actors.core.resend import ResendPolicy

C, D = Event.CONNECTED, Event.DISCONNECTED
CLOSED, OPEN, HALF = State.CLOSED, State.OPEN, State.HALF_OPEN


def note(n: int, event: Event = D, *, session: str | None = None, payload: object = None):
    return Notification(f"agent-{n}", session or f"s-{n}", f"home-{n}", event, "10.0.0.1", payload)


def store(pending_max: int = 15_000, uniform=None, **policy) -> NotifyStore:
    uniform = uniform or random.Random(3).uniform
    return NotifyStore(NotifyPolicy(pending_max=pending_max, **policy), uniform=uniform)


def sends(effects: list) -> list[Send]:
    return [e for e in effects if isinstance(e, Send)]


def counts(effects: list, family: str) -> list[tuple]:
    return [e.labels for e in effects if isinstance(e, Count) and e.family == family]


def settled(effects: list) -> list[tuple[str, Event, str]]:
    return [(e.note.agent_id, e.note.event, e.outcome) for e in effects if isinstance(e, Settled)]


def lines(effects: list) -> list[str]:
    return [e.text for e in effects if isinstance(e, LogLine)]


# --- numbers and records ------------------------------------------------------------------------


def test_pending_max_for() -> None:
    assert pending_max_for([60_000]) == 180_000  # the shipped prod value
    assert pending_max_for([4_000, 2_000]) == 18_000  # summed over agent listeners
    assert pending_max_for([1_000]) == 15_000  # never below 15,000
    assert pending_max_for([]) == 15_000


def test_policy_defaults() -> None:
    policy = NotifyPolicy()
    assert (policy.max_inflight, policy.resend.slots, policy.flush_batch) == (10, 5, 64)
    assert policy.probe_timeout_s == 15.0 and policy.hwm_window_s == 60.0
    with pytest.raises(ValueError, match="resend slots"):
        NotifyPolicy(max_inflight=5)


def test_peer_address_is_sanitised_on_admission() -> None:
    assert sanitise_peer_addr(b"\xff\xfe") == "invalid"
    assert sanitise_peer_addr("a\udcff") == "invalid"  # a surrogate-escaped byte
    cut = sanitise_peer_addr("é" * 200)  # 400 bytes: cut to 254 (a character is 2 bytes)
    assert cut == "é" * 127 and len(cut.encode()) == 254
    assert sanitise_peer_addr("x" * 300) == "x" * 255
    assert Notification("a", "s", "h", C, b"\x80").peer_addr == "invalid"


def test_log_text() -> None:
    assert log_text("bad\nid\x7f") == "bad?id?"
    assert len(log_text("é" * 100).encode()) == 128


def test_initial_series_include_the_seeds() -> None:
    assert (DROPPED, (("reason", "at_capacity"),)) in INITIAL_SERIES
    assert (DROPPED, (("reason", "unknown"),)) in INITIAL_SERIES
    assert (LOST, (("event", "connected"), ("reason", "evicted"))) in INITIAL_SERIES
    assert (UNACKED_ENDED, (("outcome", "superseded"),)) in INITIAL_SERIES


# --- keys and replacement -----------------------------------------------------------------------


def test_connected_then_disconnected_while_open_sends_only_the_disconnected_after_the_probe():
    s = store()
    c, d = note(1, C), note(1, D)
    assert s.offer(c, 0.0) == []
    assert s.drain(0.0, OPEN, 1) == []
    effects = s.offer(d, 5.0)
    assert counts(effects, COALESCED) == [()]
    assert settled(effects) == [("agent-1", C, "superseded")]
    assert s.drain(5.0, OPEN, 1) == [] and s.pending == 1
    probe = sends(s.drain(60.0, HALF, 2))
    assert [(p.note, p.probe, p.deadline) for p in probe] == [(d, True, 75.0)]
    assert s.drain(60.0, HALF, 2) == []  # nothing else while the probe is out
    assert settled(s.sent_ok(probe[0].token, 60.1)) == [("agent-1", D, "delivered")]
    assert s.drain(60.1, CLOSED, 3) == [] and s.pending == 0


def test_an_identical_repeated_connected_is_sent_once() -> None:
    s = store()
    s.offer(note(1, C), 0.0)
    s.offer(note(1, C), 0.0)
    assert len(sends(s.drain(0.0, CLOSED))) == 1
    assert s.counts[(COALESCED, ())] == 1


def test_two_sessions_of_one_agent_are_two_keys() -> None:
    s = store()
    s.offer(note(1, D, session="old"), 0.0)
    s.offer(note(1, C, session="new"), 0.0)
    assert s.pending == 2
    assert [x.note.session_id for x in sends(s.drain(0.0, CLOSED))] == ["old", "new"]


def test_replacement_keeps_the_place_in_the_queue() -> None:
    s = store()
    for n in (1, 2, 3):
        s.offer(note(n, C), 0.0)
    s.offer(note(1, D), 1.0)  # key 1 is replaced where it stands, at the head
    assert [(x.agent_id, x.event) for x in s.held()] == [
        ("agent-1", D),
        ("agent-2", C),
        ("agent-3", C),
    ]


# --- the drain ----------------------------------------------------------------------------------


def test_fifo_at_most_ten_in_flight() -> None:
    s = store()
    for n in range(25):
        s.offer(note(n), 0.0)
    first = sends(s.drain(0.0, CLOSED))
    assert [x.note.agent_id for x in first] == [f"agent-{n}" for n in range(10)]
    assert s.drain(0.0, CLOSED) == [] and s.inflight == 10 and s.pending == 15
    s.sent_ok(first[3].token, 1.0)
    assert [x.note.agent_id for x in sends(s.drain(1.0, CLOSED))] == ["agent-10"]


def test_slots_free_says_whether_a_drain_can_start_anything() -> None:
    s = store()
    for n in range(11):
        s.offer(note(n), 0.0)
    assert s.slots_free
    first = sends(s.drain(0.0, CLOSED))
    assert not s.slots_free and s.drain(0.0, CLOSED) == []  # the skipped drain starts nothing
    s.sent_ok(first[0].token, 1.0)
    assert s.slots_free and len(sends(s.drain(1.0, CLOSED))) == 1


def test_replay_active_keeps_one_slot_free() -> None:
    s = store()
    for n in range(12):
        s.offer(note(n), 0.0)
    assert len(sends(s.drain(0.0, CLOSED, replay_active=True))) == 9


def test_a_key_with_a_send_in_flight_waits() -> None:
    s = store()
    s.offer(note(1, C), 0.0)
    (out,) = sends(s.drain(0.0, CLOSED))
    s.offer(note(1, D), 0.1)
    s.offer(note(2, C), 0.1)
    # The DISCONNECTED is held behind its in-flight CONNECTED; the other key goes.
    assert [x.note.agent_id for x in sends(s.drain(0.1, CLOSED))] == ["agent-2"]
    s.sent_ok(out.token, 0.2)
    later = sends(s.drain(0.2, CLOSED))
    assert [(x.note.agent_id, x.note.event) for x in later] == [("agent-1", D)]


def test_held_while_open_and_one_probe_while_half_open() -> None:
    # The seed's outage: 10 held DISCONNECTEDs, exactly one probe, then the other 9 in order.
    s = store()
    for n in range(10):
        s.offer(note(n), float(n))
    assert s.drain(30.0, OPEN, 1) == []
    (probe,) = sends(s.drain(60.0, HALF, 2))
    assert probe.probe and probe.note.agent_id == "agent-0"
    assert s.gauges(60.0).pending == 9  # "the pending gauge dipped to 9 while the probe was out"
    assert s.drain(60.0, HALF, 2) == []
    s.sent_ok(probe.token, 60.002)
    rest = sends(s.drain(60.002, CLOSED, 3))
    assert [x.note.agent_id for x in rest] == [f"agent-{n}" for n in range(1, 10)]
    assert not any(x.probe for x in rest)


def test_failed_probes_go_back_to_the_head_and_order_survives() -> None:
    # The seed's frozen server: two probes time out, the third closes the breaker, and all 10
    # are delivered in their original order.
    s = store()
    for n in range(10):
        s.offer(note(n), 0.0)
    now, epoch = 60.0, 2
    for _ in range(2):
        (probe,) = sends(s.drain(now, HALF, epoch))
        assert probe.deadline == now + 15.0
        effects = s.probe_timed_out(probe.token, probe.deadline)
        assert lines(effects)[0].startswith("Stream status probe for agent-0 did not answer")
        assert counts(effects, REQUEUED) == [()] and s.pending == 10
        now, epoch = now + 135.0, epoch + 2  # reopened, then half open again
    (probe,) = sends(s.drain(now, HALF, epoch))
    s.sent_ok(probe.token, now)
    rest = sends(s.drain(now, CLOSED, epoch + 1))
    assert [probe.note.agent_id] + [x.note.agent_id for x in rest] == [
        f"agent-{n}" for n in range(10)
    ]


def test_breaker_closing_while_the_probe_is_out_resumes_the_drain() -> None:
    s = store()
    for n in range(5):
        s.offer(note(n), 0.0)
    (probe,) = sends(s.drain(0.0, HALF, 2))
    # A ProxyRegister closed the breaker; the probe is still out.
    rest = sends(s.drain(0.1, CLOSED, 3))
    assert len(rest) == 4 and s.inflight == 5
    # Its late result changes nothing here either.
    assert settled(s.sent_ok(probe.token, 0.2)) == [("agent-0", D, "delivered")]


def test_a_new_half_open_period_gets_its_own_probe() -> None:
    s = store()
    for n in range(3):
        s.offer(note(n), 0.0)
    (old,) = sends(s.drain(0.0, HALF, 2))
    # The breaker reopened and came back half open while the old probe is still out.
    (new,) = sends(s.drain(11.0, HALF, 4))
    assert new.probe and new.note.agent_id == "agent-1" and old.token != new.token


def test_failed_send_is_requeued_at_the_head_in_any_breaker_state() -> None:
    s = store()
    for n in range(3):
        s.offer(note(n), 0.0)
    out = sends(s.drain(0.0, CLOSED))
    s.offer(note(7), 0.1)
    for state in (OPEN, CLOSED):
        effects = s.sent_failed(out.pop().token, 0.2)
        assert counts(effects, REQUEUED) == [()], state
    assert [x.agent_id for x in s.held()] == ["agent-1", "agent-2", "agent-7"]


def test_a_newer_notification_supersedes_a_failed_send() -> None:
    s = store()
    s.offer(note(1, C), 0.0)
    s.offer(note(2, C), 0.0)
    first, _ = sends(s.drain(0.0, CLOSED))
    s.offer(note(3, C), 0.0)
    s.offer(note(1, D), 0.1)  # held behind the in-flight CONNECTED, at the tail
    effects = s.sent_failed(first.token, 0.2)
    assert counts(effects, COALESCED) == [()] and counts(effects, REQUEUED) == []
    assert settled(effects) == [("agent-1", C, "superseded")]
    # The newer one takes the head the failed one would have gone back to.
    assert [(x.agent_id, x.event) for x in s.held()] == [("agent-1", D), ("agent-3", C)]


def test_an_adopted_store_holds_its_predecessors_sends_again_in_order() -> None:
    s = store()
    for n in range(12):
        s.offer(note(n), 0.0)
    out = sends(s.drain(0.0, CLOSED))
    assert len(out) == 10
    effects = s.adopt(1.0)
    assert s.in_flight() == {} and counts(effects, REQUEUED) == [()] * 10
    assert [n.agent_id for n in s.held()] == [f"agent-{n}" for n in range(12)]
    again = sends(s.drain(1.0, CLOSED))
    assert [x.note.agent_id for x in again] == [f"agent-{n}" for n in range(10)]


def test_rejected_and_crashed_are_lost() -> None:
    s = store()
    s.offer(note(1, C), 0.0)
    s.offer(note(2, D), 0.0)
    a, b = sends(s.drain(0.0, CLOSED))
    effects = s.rejected(a.token, 0.1)
    assert counts(effects, LOST) == [(("event", "connected"), ("reason", "rejected"))]
    assert not any(isinstance(e, ArmFullReplay) for e in effects)
    effects = s.crashed(b.token, 0.1)
    assert counts(effects, LOST) == [(("event", "disconnected"), ("reason", "crashed"))]
    assert s.pending == 0 and s.inflight == 0
    assert s.sent_ok(a.token, 0.2) == []  # a token already answered is ignored


def test_an_unencodable_probe_is_evicted_with_the_seeds_warning() -> None:
    s = store()
    s.offer(note(1), 0.0)
    s.offer(note(2), 0.0)
    (probe,) = sends(s.drain(0.0, HALF, 2))
    effects = s.rejected(probe.token, 0.0, encode_error="error:badarg")
    assert lines(effects) == [
        "Evicted held stream status notification for agent-1: it cannot be encoded "
        "(error:badarg); the circuit breaker is not affected"
    ]
    # The breaker stays half open (neutral): the next held entry is probed at once.
    (nxt,) = sends(s.drain(0.0, HALF, 2))
    assert nxt.probe and nxt.note.agent_id == "agent-2"


# --- the cap ------------------------------------------------------------------------------------


def test_disconnected_at_the_cap_evicts_the_oldest_connected() -> None:
    s = store(pending_max=3)
    s.offer(note(1, D), 0.0)
    s.offer(note(2, C), 0.0)
    s.offer(note(3, C), 0.0)
    effects = s.offer(note(4, D), 1.0)
    assert counts(effects, LOST) == [(("event", "connected"), ("reason", "evicted"))]
    assert settled(effects) == [("agent-2", C, "lost")]
    assert ArmFullReplay("notify_loss") in effects
    assert [x.agent_id for x in s.held()] == ["agent-1", "agent-3", "agent-4"]


def test_connected_at_the_cap_is_refused() -> None:
    s = store(pending_max=2)
    s.offer(note(1, C), 0.0)
    s.offer(note(2, C), 0.0)
    effects = s.offer(note(3, C), 0.0)
    assert counts(effects, DROPPED) == [(("reason", "at_capacity"),)]
    assert counts(effects, LOST) == [(("event", "connected"), ("reason", "at_capacity"))]
    assert ArmFullReplay() in effects and s.pending == 2


def test_disconnected_at_the_cap_with_no_connected_held_is_refused() -> None:
    s = store(pending_max=2)
    s.offer(note(1, D), 0.0)
    s.offer(note(2, D), 0.0)
    effects = s.offer(note(3, D), 0.0)
    assert counts(effects, LOST) == [(("event", "disconnected"), ("reason", "at_capacity"))]
    assert counts(effects, DROPPED) == [(("reason", "at_capacity"),)]
    assert not any(isinstance(e, ArmFullReplay) for e in effects)


def test_sends_in_flight_count_toward_the_cap_and_their_key_is_never_refused() -> None:
    s = store(pending_max=2)
    s.offer(note(1, C), 0.0)
    s.offer(note(2, D), 0.0)
    sends(s.drain(0.0, CLOSED))
    assert s.pending == 0 and s.occupancy == 2
    assert counts(s.offer(note(3, C), 0.0), DROPPED)  # a new key: refused
    assert s.offer(note(1, D), 0.0) == []  # the key in flight: taken
    assert s.pending == 1 and s.occupancy == 2


def test_eviction_skips_a_connected_whose_key_is_in_flight() -> None:
    s = store(pending_max=2)
    s.offer(note(1, C), 0.0)
    (out,) = sends(s.drain(0.0, CLOSED))
    s.offer(note(1, C, payload="again"), 0.0)  # held behind its own send
    s.offer(note(2, C), 0.0)
    assert s.occupancy == 2
    effects = s.offer(note(3, D), 0.0)
    # Evicting key 1's held CONNECTED would free nothing (its send is out): agent-2 goes.
    assert settled(effects) == [("agent-2", C, "lost")]
    assert s.occupancy == 2 and out.token in s.in_flight()


def test_set_cap_raises_the_cap_for_the_planned_stop() -> None:
    s = store(pending_max=1)
    s.offer(note(1), 0.0)
    s.set_cap(3)
    assert s.offer(note(2), 0.0) == [] and s.gauges(0.0).pending_max == 3


# --- the high-water mark ------------------------------------------------------------------------


def test_high_water_mark_covers_one_to_two_minutes() -> None:
    s = store()
    for n in range(5):
        s.offer(note(n), 10.0)
    sends(s.drain(10.0, CLOSED))
    assert s.gauges(10.0).pending == 0 and s.gauges(10.0).pending_hwm == 5
    assert s.gauges(119.0).pending_hwm == 5  # the previous window still holds the spike
    assert s.gauges(120.0).pending_hwm == 0  # two windows on


def test_high_water_level_persists_into_quiet_windows() -> None:
    hwm = HighWater(60.0)
    hwm.observe(7, 0.0)
    assert hwm.value(500.0) == 7  # still held, nothing changed
    hwm.observe(2, 500.0)
    assert hwm.value(500.0) == 7 and hwm.value(600.0) == 2


# --- acknowledged=false -------------------------------------------------------------------------


def refused(s: NotifyStore, n: int, event: Event, now: float) -> list:
    s.offer(note(n, event), now)
    (out,) = [x for x in sends(s.drain(now, CLOSED)) if x.note.agent_id == f"agent-{n}"]
    return s.unacknowledged(out.token, now)


def test_refusal_warns_with_the_seeds_line_and_is_resent_after_one_to_three_seconds() -> None:
    s = store(uniform=lambda a, b: b)
    effects = refused(s, 1, C, 100.0)
    assert counts(effects, UNACKNOWLEDGED) == [(("event", "connected"),)]
    assert settled(effects) == [("agent-1", C, "refused")]
    assert lines(effects) == [
        "Server did not record the CONNECTED stream status notice for agent-1 "
        "(acknowledged=false; refused 1 time(s) over 0 ms); sending it again in 3000 ms"
    ]
    assert s.next_deadline() == 103.0 and s.gauges(100.0).unacked_keys == 1
    assert s.drain(102.9, CLOSED) == []
    (again,) = sends(s.drain(103.0, CLOSED))
    assert again.resend and s.resent == 1
    effects = s.unacknowledged(again.token, 105.0)
    assert lines(effects) == [
        "Server did not record the CONNECTED stream status notice for agent-1 "
        "(acknowledged=false; refused 2 time(s) over 5000 ms); sending it again in 9000 ms"
    ]
    (third,) = sends(s.drain(114.0, CLOSED))
    assert counts(s.sent_ok(third.token, 114.1), UNACKED_ENDED) == [(("outcome", "acknowledged"),)]
    assert s.gauges(114.1).unacked_keys == 0


def test_refusal_warning_at_most_once_a_second() -> None:
    s = store()
    assert lines(refused(s, 1, C, 0.0))
    assert not lines(refused(s, 2, C, 0.5))
    assert lines(refused(s, 3, C, 1.0))


def test_a_refused_half_open_probe_leaves_the_next_to_be_probed() -> None:
    s = store()
    s.offer(note(1), 0.0)
    s.offer(note(2), 0.0)
    (probe,) = sends(s.drain(0.0, HALF, 2))
    s.unacknowledged(probe.token, 0.1)
    (nxt,) = sends(s.drain(0.1, HALF, 2))
    assert nxt.probe and nxt.note.agent_id == "agent-2"


def test_resends_take_at_most_five_slots_and_fresh_notifications_go_first() -> None:
    # The seed's unit test, scaled down: many refused sessions, fresh ones still get through.
    s = store(uniform=lambda a, b: a)
    for n in range(200):
        refused(s, n, C, 0.0)
    assert s.gauges(0.0).unacked_keys == 200
    s.offer(note(900, C), 2.0)
    s.offer(note(901, D), 2.0)
    effects = sends(s.drain(2.0, CLOSED))
    assert [x.note.agent_id for x in effects[:2]] == ["agent-900", "agent-901"]
    assert not effects[0].resend and not effects[1].resend
    assert sum(x.resend for x in effects) == 5 and s.resends_out == 5
    for x in effects[2:]:
        s.unacknowledged(x.token, 2.1)
    assert sum(x.resend for x in sends(s.drain(2.1, CLOSED))) == 5


def test_resends_wait_while_the_breaker_is_open() -> None:
    s = store()
    refused(s, 1, D, 0.0)
    assert s.drain(10.0, OPEN) == []
    assert len(sends(s.drain(10.0, CLOSED))) == 1


def test_disconnected_cancels_a_waiting_connected_resend() -> None:
    s = store()
    refused(s, 1, C, 0.0)
    effects = s.offer(note(1, D), 0.5)
    assert counts(effects, UNACKED_ENDED) == [(("outcome", "superseded"),)]
    later = sends(s.drain(100.0, CLOSED))
    assert [(x.note.event, x.resend) for x in later] == [(D, False)]  # never the CONNECTED


def test_a_resend_on_its_way_is_waited_for() -> None:
    s = store(uniform=lambda a, b: a)
    refused(s, 1, C, 0.0)
    (resend,) = sends(s.drain(1.0, CLOSED))
    s.offer(note(1, D), 1.1)
    assert sends(s.drain(1.1, CLOSED)) == []  # waits behind the resend
    effects = s.unacknowledged(resend.token, 1.2)
    assert counts(effects, UNACKED_ENDED) == [(("outcome", "superseded"),)]
    assert s.gauges(1.2).unacked_keys == 0
    assert [(x.note.event, x.resend) for x in sends(s.drain(1.2, CLOSED))] == [(D, False)]


def test_cancel_resends_of_a_recovered_session() -> None:
    s = store()
    refused(s, 1, D, 0.0)
    effects = s.cancel_resends("agent-1", "s-1")
    assert counts(effects, UNACKED_ENDED) == [(("outcome", "superseded"),)]
    assert s.drain(100.0, CLOSED) == []


def test_connected_is_resent_only_while_the_session_is_held() -> None:
    s = store()
    refused(s, 1, C, 0.0)
    effects = s.drain(5.0, CLOSED, holds_session=lambda n: False)
    assert sends(effects) == []
    assert counts(effects, UNACKED_ENDED) == [(("outcome", "session_ended"),)]


def test_connected_refused_for_fifteen_minutes_is_slowed() -> None:
    s = store(uniform=lambda a, b: b)
    refused(s, 1, C, 0.0)
    now = 0.0
    while True:
        deadline = s.next_deadline()
        assert deadline is not None
        now = deadline
        (resend,) = sends(s.drain(now, CLOSED))
        s.unacknowledged(resend.token, now)
        if s.gauges(now).unacked_slow_keys:
            break
    assert now >= 900.0
    assert s.next_deadline() == now + 600.0  # 0.8-1 x 600 s; this source draws the top
    assert s.retry_entries()[0].refusals.slow


def test_disconnected_refused_is_lost_after_its_window() -> None:
    s = store(uniform=lambda a, b: b)
    refused(s, 1, D, 0.0)
    lost = []
    while s.next_deadline() is not None:
        now = s.next_deadline()
        effects = s.drain(now, CLOSED)
        for resend in sends(effects):
            effects += s.unacknowledged(resend.token, now)
        lost += counts(effects, LOST)
        assert now <= 120.0
    assert lost == [(("event", "disconnected"), ("reason", "unacknowledged"))]
    assert s.gauges(200.0).unacked_keys == 0


def test_a_waiting_disconnected_expires_at_its_window_while_the_breaker_is_open() -> None:
    s = store()
    refused(s, 1, D, 0.0)
    assert s.drain(119.0, OPEN) == []
    effects = s.drain(120.0, OPEN)
    assert counts(effects, UNACKED_ENDED) == [(("outcome", "expired"),)]
    assert counts(effects, LOST) == [(("event", "disconnected"), ("reason", "unacknowledged"))]


def test_the_retry_set_holds_at_most_the_cap() -> None:
    s = store(pending_max=2)
    refused(s, 1, C, 0.0)
    refused(s, 2, C, 0.0)
    effects = refused(s, 3, C, 0.0)
    assert counts(effects, LOST) == [(("event", "connected"), ("reason", "unacknowledged"))]
    assert settled(effects) == [("agent-3", C, "lost")]


def test_a_failed_resend_goes_back_to_the_head_of_the_retry_set() -> None:
    s = store(uniform=lambda a, b: a)
    refused(s, 1, C, 0.0)
    (resend,) = sends(s.drain(1.0, CLOSED))
    assert counts(s.sent_failed(resend.token, 1.1), REQUEUED) == [()]
    assert s.drain(1.1, OPEN) == []
    (again,) = sends(s.drain(1.1, CLOSED))
    assert again.resend and again.note == resend.note


# --- the planned stop ---------------------------------------------------------------------------


def test_planned_stop_flushes_everything_64_at_a_time_whatever_the_breaker() -> None:
    s = store(uniform=lambda a, b: a)
    refused(s, 900, C, 0.0)  # a waiting refused CONNECTED: dropped
    refused(s, 901, D, 0.0)  # a waiting refused DISCONNECTED: sent
    for n in range(100):
        s.offer(note(n), 0.5)
    effects = s.begin_flush(0.6)
    assert counts(effects, LOST) == [(("event", "connected"), ("reason", "shutdown"))]
    assert s.drain(0.6, CLOSED) == []  # the ordinary drain stops
    first = sends(s.flush(0.6))
    assert len(first) == 64 and s.inflight == 64
    for x in first:
        s.sent_ok(x.token, 0.7)
    rest = sends(s.flush(0.7))
    assert len(rest) == 37  # the other 36 held, then the refused DISCONNECTED
    assert rest[-1].resend and rest[-1].note.agent_id == "agent-901"
    # A failed send is not retried; a refusal is not resent.
    effects = s.sent_failed(rest[0].token, 0.8)
    assert counts(effects, LOST) == [(("event", "disconnected"), ("reason", "shutdown"))]
    effects = s.unacknowledged(rest[1].token, 0.8)
    assert counts(effects, LOST) == [(("event", "disconnected"), ("reason", "unacknowledged"))]
    for x in rest[2:]:
        s.sent_ok(x.token, 0.9)
    assert s.flush(0.9) == [] and s.flush_done
    report = s.finish_flush(1.0)
    assert (report.sent, report.left) == (101, 0)
    assert [(e.level, e.text) for e in report.effects if isinstance(e, LogLine)] == [
        (
            "info",  # nothing left: no WARN
            "Planned stop: 101 stream-status notification(s) sent, 0 not sent by the flush"
            " deadline",
        )
    ]
    # Later notifications are counted, not sent.
    effects = s.offer(note(5), 2.0)
    assert counts(effects, LOST) == [(("event", "disconnected"), ("reason", "shutdown"))]
    assert s.mode is Mode.STOPPED and s.pending == 0


def test_what_is_left_at_the_flush_deadline_is_lost() -> None:
    s = store()
    for n in range(70):
        s.offer(note(n), 0.0)
    s.begin_flush(0.0)
    assert len(sends(s.flush(0.0))) == 64
    report = s.finish_flush(20.0)
    assert (report.sent, report.left) == (64, 6)
    assert (
        counts(list(report.effects), LOST)
        == [(("event", "disconnected"), ("reason", "shutdown"))] * 6
    )
    assert not any(isinstance(e, ArmFullReplay) for e in report.effects)


# --- the state machines -------------------------------------------------------------------------


def check_resend_timing(s: NotifyStore, send: Send, now: float, live: set) -> None:
    """A resend goes only once its backoff has ended, a DISCONNECTED only inside its window, a
    CONNECTED only while its session is held."""
    (entry,) = [e for e in s.retry_entries() if e.key == send.note.key]
    assert entry.out and entry.due <= now
    if entry.connected:
        assert send.note.session in live
    else:
        assert now <= entry.window_end


AGENTS, SESSIONS, HOMES = 3, 2, 2


class Model:
    """The queue, written plainly: a list of keys head first, their notes, and the sends out."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.queue: list[tuple] = []
        self.notes: dict[tuple, Notification] = {}
        self.out: dict[int, tuple[Notification, bool]] = {}
        self.running = True

    def out_keys(self) -> set:
        return {n.key for n, _ in self.out.values()}

    def fresh_out_keys(self) -> set:
        return {n.key for n, resend in self.out.values() if not resend}

    def occupancy(self) -> int:
        return len(self.queue) + len(self.fresh_out_keys() - set(self.queue))

    def offer(self, n: Notification) -> str:
        key = n.key
        if key in self.notes:
            self.notes[key] = n
            return "replaced"
        if key in self.fresh_out_keys() or self.occupancy() < self.cap:
            self.queue.append(key)
            self.notes[key] = n
            return "held"
        if n.event is D:
            busy = self.out_keys()
            for victim in self.queue:
                if self.notes[victim].event is C and victim not in busy:
                    self.queue.remove(victim)
                    del self.notes[victim]
                    self.queue.append(key)
                    self.notes[key] = n
                    return "evicted"
        return "dropped"

    def sendable(self) -> list[tuple]:
        busy = self.out_keys()
        return [k for k in self.queue if k not in busy]

    def take(self, key: tuple) -> Notification:
        self.queue.remove(key)
        return self.notes.pop(key)

    def failed(self, n: Notification) -> None:
        key = n.key
        if key in self.notes:
            if self.running:
                self.queue.remove(key)
                self.queue.insert(0, key)
        elif self.running:
            self.queue.insert(0, key)
            self.notes[key] = n


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.breaker = CLOSED
        self.epoch = 0
        self.seq = 0
        self.steps = 0
        self.live: set[tuple[str, str]] = set()
        self.last_sent: dict[tuple, int] = {}
        self.settled: set[int] = set()
        self.refused: set[int] = set()
        self.probes: dict[int, int] = {}  # token -> the half-open period it probes

    @initialize(cap=st.integers(2, 6), seed=st.integers(0, 2**16))
    def start(self, cap: int, seed: int) -> None:
        # Short backoffs, window and slow phase, so the time steps below reach all three.
        resend = ResendPolicy(
            base_s=0.5, max_s=2.0, slow_after_s=6.0, slow_max_s=5.0, disconnected_window_s=12.0
        )
        policy = NotifyPolicy(pending_max=cap, resend=resend)
        self.store = NotifyStore(policy, uniform=random.Random(seed).uniform)
        self.model = Model(cap)

    # -- checking effects --

    def check(self, effects: list) -> None:
        self.steps += 1
        for e in effects:
            if isinstance(e, Settled):
                seq = e.note.payload
                assert seq not in self.settled, f"{seq} settled twice"
                self.settled.add(seq)
                if e.outcome == "refused":
                    self.refused.add(seq)
            if isinstance(e, Send):
                key, seq = e.note.key, e.note.payload
                # The server never sees an older notification for a key after a newer one.
                assert seq >= self.last_sent.get(key, -1)
                self.last_sent[key] = seq
                if e.resend:
                    assert seq in self.refused
            if isinstance(e, ArmFullReplay):
                assert self.store.mode is Mode.RUNNING

    # -- rules --

    @rule(
        agent=st.integers(0, AGENTS - 1),
        session=st.integers(0, SESSIONS - 1),
        home=st.integers(0, HOMES - 1),
        event=st.sampled_from([C, D]),
    )
    def offer(self, agent: int, session: int, home: int, event: Event) -> None:
        self.seq += 1
        n = Notification(f"a{agent}", f"s{session}", f"h{home}", event, "::1", self.seq)
        if event is C:
            self.live.add(n.session)
        held_before = [x.key for x in self.store.held()]
        effects = self.store.offer(n, self.now)
        self.check(effects)
        if self.store.mode is Mode.STOPPED:
            assert settled(effects) == [(n.agent_id, event, "lost")]
            return
        want = self.model.offer(n)
        lost = counts(effects, LOST)
        if want == "replaced":
            assert counts(effects, COALESCED) == [()]
        elif want == "evicted":
            assert lost == [(("event", "connected"), ("reason", "evicted"))]
            assert ArmFullReplay() in effects or self.store.mode is not Mode.RUNNING
        elif want == "dropped":
            assert counts(effects, DROPPED) == [(("reason", "at_capacity"),)]
            assert lost == [(("event", event.value), ("reason", "at_capacity"))]
        else:
            assert lost == [] and n.key not in held_before

    @rule(agent=st.integers(0, AGENTS - 1), session=st.integers(0, SESSIONS - 1))
    def session_ends(self, agent: int, session: int) -> None:
        self.live.discard((f"a{agent}", f"s{session}"))

    # Weighted towards closed, where most of the lane's rules apply.
    @rule(state=st.sampled_from([CLOSED, CLOSED, CLOSED, OPEN, HALF]))
    def breaker_moves(self, state: State) -> None:
        if state is not self.breaker:
            self.breaker = state
            self.epoch += 1

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 2.0, 5.0, 15.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(replay_active=st.booleans())
    def drain(self, replay_active: bool) -> None:
        out_before = len(self.store.in_flight())
        resends_before = self.store.resends_out
        expected = self.model.sendable()
        effects = self.store.drain(
            self.now,
            self.breaker,
            self.epoch,
            replay_active=replay_active,
            holds_session=lambda n: n.session in self.live,
        )
        self.check(effects)
        out = sends(effects)
        if self.store.mode is not Mode.RUNNING or self.breaker is OPEN:
            assert out == []
            return
        limit = 10 - replay_active
        fresh = [x for x in out if not x.resend]
        resent = [x for x in out if x.resend]
        assert out == fresh + resent  # fresh notifications first
        if self.breaker is HALF:
            assert len(out) <= 1
            if out:
                assert out[0].probe and out[0].deadline == self.now + 15.0
                # One probe out per half-open period.
                assert self.epoch not in self.probes.values()
                self.probes[out[0].token] = self.epoch
                if resent:
                    assert expected == []
            n_fresh = len(fresh)
        else:
            assert not any(x.probe for x in out)
            n_fresh = min(limit - out_before, len(expected)) if out_before < limit else 0
            assert len(resent) <= max(0, min(5 - resends_before, limit - out_before - n_fresh))
        # FIFO among keys, skipping keys with a send out.
        assert [x.note.key for x in fresh] == expected[:n_fresh]
        for x in fresh:
            assert self.model.take(x.note.key) == x.note
            self.model.out[x.token] = (x.note, False)
        for x in resent:
            check_resend_timing(self.store, x, self.now, self.live)
            self.model.out[x.token] = (x.note, True)

    @rule(flush=st.booleans())
    def flush(self, flush: bool) -> None:
        if self.store.mode is not Mode.FLUSHING:
            return
        expected = self.model.sendable()
        out_before = len(self.store.in_flight())
        effects = self.store.flush(self.now)
        self.check(effects)
        out = sends(effects)
        assert len(self.store.in_flight()) <= 64
        fresh = [x for x in out if not x.resend]
        assert [x.note.key for x in fresh] == expected[: min(len(expected), 64 - out_before)]
        for x in out:
            if not x.resend:
                self.model.take(x.note.key)
            else:
                assert x.note.event is D  # a waiting refused CONNECTED is never flushed
            self.model.out[x.token] = (x.note, x.resend)

    @rule(
        data=st.data(),
        # Weighted towards refusals, so the retry set fills, backs off, slows and expires.
        kind=st.sampled_from(
            ["ok", "failed", "unacked", "unacked", "unacked", "rejected", "crashed", "timeout"]
        ),
    )
    def result(self, data: st.DataObject, kind: str) -> None:
        tokens = sorted(self.store.in_flight())
        if not tokens:
            return
        token = data.draw(st.sampled_from(tokens))
        n, resend = self.model.out.pop(token)
        held_newer = n.key in self.model.notes
        if kind == "ok":
            effects = self.store.sent_ok(token, self.now)
        elif kind == "failed":
            effects = self.store.sent_failed(token, self.now)
            if not resend:
                self.model.failed(n)
                if held_newer:
                    assert counts(effects, COALESCED) == [()]
                elif self.store.mode is Mode.RUNNING:
                    assert counts(effects, REQUEUED) == [()]
        elif kind == "unacked":
            effects = self.store.unacknowledged(token, self.now)
            assert counts(effects, UNACKNOWLEDGED) == [(("event", n.event.value),)]
            if held_newer:
                assert n.key not in {e.key for e in self.store.retry_entries()}
        elif kind == "rejected":
            effects = self.store.rejected(token, self.now)
            assert (("event", n.event.value), ("reason", "rejected")) in counts(effects, LOST)
        elif kind == "crashed":
            effects = self.store.crashed(token, self.now)
        else:
            effects = self.store.probe_timed_out(token, self.now)
            if not effects:  # not a probe: report it as an ordinary failure instead
                effects = self.store.sent_failed(token, self.now)
            if not resend:
                self.model.failed(n)
        self.check(effects)
        assert token not in self.store.in_flight()
        self.breaker_sees_probe_result(token, kind)

    def breaker_sees_probe_result(self, token: int, kind: str) -> None:
        """What the real breaker does with a probe result of its current period: a success
        closes it, a failure (a killed or crashed worker included) reopens it, a neutral result
        (acknowledged=false, a request fault) leaves it half open for the next probe."""
        epoch = self.probes.pop(token, None)
        if epoch is None or epoch != self.epoch or self.breaker is not HALF:
            return
        if kind == "ok":
            self.breaker_moves(CLOSED)
        elif kind in ("failed", "timeout", "crashed"):
            self.breaker_moves(OPEN)

    @rule()
    def adopt(self) -> None:
        """The upstream actor restarts: the new one adopts the store, every send out failed."""
        held_before = {n.key for n in self.store.held()}
        out = sorted(self.model.out, reverse=True)
        effects = self.store.adopt(self.now)
        self.check(effects)
        assert sends(effects) == [] and self.store.in_flight() == {}
        for token in out:
            n, resend = self.model.out.pop(token)
            if not resend:
                self.model.failed(n)
            self.probes.pop(token, None)
        if self.store.mode is Mode.RUNNING:
            # Nothing is lost: every fresh send out is held again, every resend waits again.
            assert counts(effects, LOST) == []
            assert held_before <= {n.key for n in self.store.held()}

    @precondition(lambda self: self.steps >= 20)
    @rule()
    def begin_flush(self) -> None:
        if self.store.mode is not Mode.RUNNING:
            return
        waiting_c = [e for e in self.store.retry_entries() if e.connected and not e.out]
        effects = self.store.begin_flush(self.now)
        self.check(effects)
        self.model.running = False
        assert len(counts(effects, LOST)) == len(waiting_c)

    @precondition(lambda self: self.steps >= 30)
    @rule()
    def finish_flush(self) -> None:
        if self.store.mode is not Mode.FLUSHING:
            return
        held = len(self.model.queue)
        waiting = len([e for e in self.store.retry_entries() if not e.out])
        report = self.store.finish_flush(self.now)
        self.check(list(report.effects))
        assert report.left == held + waiting
        self.model.queue.clear()
        self.model.notes.clear()

    # -- invariants --

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "store"):
            return
        assert [n.key for n in self.store.held()] == self.model.queue
        assert [self.model.notes[k] for k in self.model.queue] == self.store.held()
        assert set(self.store.in_flight()) == set(self.model.out)

    @invariant()
    def bounds(self) -> None:
        if not hasattr(self, "store"):
            return
        s = self.store
        assert s.occupancy <= s.cap  # keys never exceed the cap
        flight = s.in_flight()
        keys = [n.key for n in flight.values()]
        assert len(keys) == len(set(keys))  # a key never has two sends in flight
        if s.mode is Mode.RUNNING:
            assert len(flight) <= 10
            assert s.resends_out <= 5
        else:
            assert len(flight) <= 64
        g = s.gauges(self.now)
        assert g.pending == len(s.held()) <= g.pending_hwm
        assert g.unacked_keys == len(s.retry_entries()) <= s.cap

    @invariant()
    def retry_set_is_apart_from_the_queue(self) -> None:
        if not hasattr(self, "store"):
            return
        held = {n.key for n in self.store.held()}
        out_keys = {n.key for n in self.store.in_flight().values()}
        for entry in self.store.retry_entries():
            if entry.out:
                assert entry.key in out_keys
            else:
                # A waiting resend's key is neither held nor in flight: a newer one ended it.
                assert entry.key not in held and entry.key not in out_keys
                assert entry.note.payload in self.refused
            if self.store.mode is not Mode.RUNNING and not entry.out:
                assert not entry.connected

    @invariant()
    def every_notification_settles_once(self) -> None:
        if not hasattr(self, "store"):
            return
        alive = {n.payload for n in self.store.held()}
        alive |= {n.payload for n, resend in self.model.out.values() if not resend}
        assert not alive & self.settled
        assert alive | self.settled == set(range(1, self.seq + 1))


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=120, stateful_step_count=60, deadline=None)


class RetryLaneMachine(RuleBasedStateMachine):
    """The acknowledged=false lane on its own: the breaker stays closed and the server mostly
    refuses, so entries back off, slow down, expire, get superseded and are acknowledged."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.seq = 0
        self.live: set[tuple[str, str]] = set()
        self.last_sent: dict[tuple, int] = {}
        self.resend_of: dict[int, tuple] = {}  # token -> key, for resends out
        self.refusals: dict[tuple, list[float]] = {}  # key -> refusal times since first

    @initialize(seed=st.integers(0, 2**16))
    def start(self, seed: int) -> None:
        self.policy = ResendPolicy(
            base_s=0.5, max_s=2.0, slow_after_s=6.0, slow_max_s=5.0, disconnected_window_s=12.0
        )
        self.store = NotifyStore(
            NotifyPolicy(pending_max=50, resend=self.policy), uniform=random.Random(seed).uniform
        )

    @rule(agent=st.integers(0, 7), event=st.sampled_from([C, D]))
    def offer(self, agent: int, event: Event) -> None:
        self.seq += 1
        n = Notification(f"a{agent}", "s", "h", event, "::1", self.seq)
        if event is C:
            self.live.add(n.session)
        else:
            self.live.discard(n.session)
        self.store.offer(n, self.now)

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule()
    def drain(self) -> None:
        before = self.store.resends_out
        out = sends(
            self.store.drain(self.now, CLOSED, holds_session=lambda n: n.session in self.live)
        )
        assert out == [x for x in out if not x.resend] + [x for x in out if x.resend]
        assert sum(x.resend for x in out) <= 5 - before
        for x in out:
            assert x.note.payload >= self.last_sent.get(x.note.key, -1)
            self.last_sent[x.note.key] = x.note.payload
            if x.resend:
                check_resend_timing(self.store, x, self.now, self.live)

    # Every send out is answered at once, mostly with a refusal, so entries live long enough to
    # back off, slow down and expire.
    @rule(
        kinds=st.lists(
            st.sampled_from(["ok", "unacked", "unacked", "unacked", "unacked", "failed"]),
            min_size=10,
            max_size=10,
        )
    )
    def answer(self, kinds: list[str]) -> None:
        for token, kind in zip(sorted(self.store.in_flight()), kinds, strict=False):
            self.answer_one(token, kind)

    def answer_one(self, token: int, kind: str) -> None:
        n = self.store.in_flight()[token]
        entry_before = [e for e in self.store.retry_entries() if e.key == n.key]
        if kind == "ok":
            effects = self.store.sent_ok(token, self.now)
            if entry_before:
                assert counts(effects, UNACKED_ENDED) == [(("outcome", "acknowledged"),)]
                assert n.key not in {e.key for e in self.store.retry_entries()}
        elif kind == "failed":
            self.store.sent_failed(token, self.now)
        else:
            self.store.unacknowledged(token, self.now)
            after = [e for e in self.store.retry_entries() if e.key == n.key]
            if after:
                refusals = after[0].refusals
                if refusals.slow:
                    assert n.event is C and self.now - refusals.first_at >= 6.0
                    assert 4.0 <= refusals.delay_s <= 5.0
                else:
                    assert self.policy.base_s <= refusals.delay_s <= self.policy.max_s
                    assert n.event is D or self.now - refusals.first_at < 6.0

    @invariant()
    def gauges_agree(self) -> None:
        if not hasattr(self, "store"):
            return
        entries = self.store.retry_entries()
        g = self.store.gauges(self.now)
        assert g.unacked_keys == len(entries)
        assert g.unacked_slow_keys == sum(e.refusals.slow for e in entries)
        assert self.store.resends_out <= 5 and self.store.inflight <= 10
        for e in entries:
            if not e.connected:
                assert not e.refusals.slow


TestRetryLaneMachine = RetryLaneMachine.TestCase
TestRetryLaneMachine.settings = settings(max_examples=50, stateful_step_count=80, deadline=None)
