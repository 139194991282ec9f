"""The registration replay core against the seed's rules (SPEC_INDEX RP-03..RP-12, RP-17, RP-19,
C49, C51, C52, C54, K27..K29, M31, M34; seed "What happens when the server restarts").

Examples pin each rule with the seed's numbers. Two state machines drive arbitrary event
sequences: the targeted drip against a plain model (the queue in order, the in-flight set, the
guard stamps, every count of the verdict line), and full replays against their promises (at most
one a minute, never more than 24 in flight, each held agent once per walk, a walk that starts
only after its jitter).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from actors.core import Count, LogLine
from actors.core.replay_queue import (
    CIRCUIT_OPEN_LINE,
    FULL_DONE_LINE,
    NOTIFY_LOSS_LINE,
    REGISTRY_UNAVAILABLE_LINE,
    SERVER_LOST_STATE_LINE,
    TRIGGERED,
    Phase,
    ReplayEffect,
    ReplayPolicy,
    ReplayQueue,
    full_threshold,
)
from actors.core.verdicts import VERDICT_DROPPED, HeartbeatVerdict


def sid(n: int) -> str:
    return f"gw-session-{n:032x}"


def count(effects: list[ReplayEffect], family: str, **labels: str) -> int:
    pairs = tuple(labels.items())
    return sum(
        e.n for e in effects if isinstance(e, Count) and (e.family, e.labels) == (family, pairs)
    )


def dropped(effects: list[ReplayEffect], reason: str) -> int:
    return count(effects, VERDICT_DROPPED, reason=reason)


def triggered(effects: list[ReplayEffect], trigger: str) -> int:
    return count(effects, TRIGGERED, trigger=trigger)


def lines(effects: list[ReplayEffect], level: str | None = None) -> list[str]:
    return [e.text for e in effects if isinstance(e, LogLine) and level in (None, e.level)]


class Node:
    """What the lane would read from the tables: the held sessions."""

    def __init__(self, held: set[str] | None = None) -> None:
        self.held = held if held is not None else set()

    def is_held(self, session_id: str) -> bool:
        return session_id in self.held

    def sessions(self) -> list[str]:
        return sorted(self.held)


def queue(policy: ReplayPolicy | None = None, jitter: float = 0.5) -> ReplayQueue:
    return ReplayQueue(policy or ReplayPolicy(), uniform=lambda lo, hi: lo + (hi - lo) * jitter)


def offer(
    q: ReplayQueue,
    node: Node,
    ids: list[str],
    now: float,
    *,
    batch: int | None = None,
    truncated: bool = False,
    breaker_open: bool = False,
) -> list[ReplayEffect]:
    verdict = HeartbeatVerdict(tuple(ids), len(ids) * 10 if batch is None else batch, truncated)
    return q.offer(
        verdict, now, breaker_open=breaker_open, held=len(node.held), is_held=node.is_held
    )


def poll(q: ReplayQueue, node: Node, now: float, **kw: bool) -> list[ReplayEffect]:
    return q.poll(
        now,
        breaker_closed=kw.get("breaker_closed", True),
        notify_below_half=kw.get("notify_below_half", True),
        held_sessions=node.sessions,
    )


def drain(q: ReplayQueue, node: Node, now: float) -> tuple[list[str], list[ReplayEffect]]:
    """Launch and answer everything at once (a server answering instantly) until idle."""
    launched: list[str] = []
    effects: list[ReplayEffect] = []
    while True:
        batch, more = q.launch(now, node.is_held)
        effects += more
        if not batch:
            return launched, effects
        launched += batch
        for session_id in batch:
            effects += q.finished(session_id, now)


# --- the targeted drip --------------------------------------------------------------------------


def test_a_verdict_queues_the_held_sessions_and_counts_the_rest() -> None:
    node = Node({sid(n) for n in range(6)})
    q = queue(ReplayPolicy(queue_max=4))
    first = offer(q, node, [sid(0), sid(1)], 0.0)
    assert triggered(first, "heartbeat") == 1
    assert q.launch(0.0, node.is_held)[0] == [sid(0), sid(1)]
    q.finished(sid(0), 0.0)
    # 0 was replayed (guard), 1 is in flight (already queued), 9 is not held, 2..5 fill the cap.
    effects = offer(q, node, [sid(0), sid(1), sid(2), sid(3), sid(4), sid(5), sid(9)], 1.0)
    assert q.depth == 4
    assert dropped(effects, "not_local") == 1
    assert lines(effects, "info") == [
        "Registration replay: heartbeat verdict named 7 session(s); queued 4, not local 1,"
        " already queued 1, within guard 1, queue full 0"
    ]
    more = offer(q, node, [sid(5), sid(0)], 2.0)
    assert q.depth == 4  # sid(5) is queued already, sid(0) inside the guard
    assert triggered(more, "heartbeat") == 0  # nothing queued: no trigger
    assert lines(more, "info") == [] and lines(more, "debug")  # a repeat is routine


def test_the_queue_cap_counts_queue_full_per_id() -> None:
    node = Node({sid(n) for n in range(30)})
    q = queue(ReplayPolicy(queue_max=5))
    effects = offer(q, node, [sid(n) for n in range(30)], 0.0)  # E6: 5 queued, queue_full +25
    assert q.depth == 5
    assert dropped(effects, "queue_full") == 25


def test_the_guard_window_starts_when_the_replay_is_sent() -> None:
    node = Node({sid(1)})
    q = queue(ReplayPolicy(guard_s=10.0))
    offer(q, node, [sid(1)], 0.0)
    assert q.launch(3.0, node.is_held)[0] == [sid(1)]
    q.finished(sid(1), 3.5)
    assert "within guard 1" in lines(offer(q, node, [sid(1)], 12.9))[0]
    assert "queued 1," in lines(offer(q, node, [sid(1)], 13.0))[0]


def test_a_verdict_while_the_breaker_is_open_is_dropped_whole() -> None:
    node = Node({sid(n) for n in range(3)})
    q = queue()
    effects = offer(q, node, [sid(0), sid(1), sid(9)], 0.0, truncated=True, breaker_open=True)
    assert dropped(effects, "circuit_open") == 3
    assert lines(effects) == [CIRCUIT_OPEN_LINE.format(named=3)]
    assert q.depth == 0 and q.phase is Phase.IDLE  # not even the truncated flag starts anything


def test_a_session_gone_before_its_turn_is_skipped_without_a_stamp() -> None:
    node = Node({sid(1), sid(2)})
    q = queue()
    offer(q, node, [sid(1), sid(2)], 0.0)
    node.held.discard(sid(1))
    assert q.launch(0.0, node.is_held)[0] == [sid(2)]
    assert not q.within_guard(sid(1), 0.0)


def test_a_refused_replay_is_first_again_and_not_guarded() -> None:
    node = Node({sid(n) for n in range(3)})
    q = queue(ReplayPolicy(concurrency=1))
    offer(q, node, [sid(0), sid(1), sid(2)], 0.0)
    assert q.launch(0.0, node.is_held)[0] == [sid(0)]
    q.unsent(sid(0))
    assert not q.within_guard(sid(0), 0.0)
    assert q.launch(0.0, node.is_held)[0] == [sid(0)]


def test_never_more_in_flight_than_the_replay_permits() -> None:
    node = Node({sid(n) for n in range(100)})
    q = queue()
    offer(q, node, sorted(node.held), 0.0)
    started, _ = q.launch(0.0, node.is_held)
    assert len(started) == 24 == q.inflight
    assert q.launch(0.0, node.is_held)[0] == []
    q.finished(started[0], 0.1)
    assert len(q.launch(0.1, node.is_held)[0]) == 1


# --- what starts a full replay ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("held", "needed"),
    [(1, 1), (63, 1), (64, 1), (127, 1), (128, 2), (640, 10), (1024, 16), (10_000, 16)],
)
def test_the_full_threshold_is_one_per_64_held_clamped(held: int, needed: int) -> None:
    assert full_threshold(held) == needed


def test_half_the_batch_and_the_threshold_start_a_full_replay() -> None:
    node = Node({sid(n) for n in range(640)})  # threshold 10
    q = queue()
    # 9 of 18: half the batch but under the threshold.
    assert (
        triggered(offer(q, node, [sid(n) for n in range(9)], 0.0, batch=18), "server_lost_state")
        == 0
    )
    # 10 of 21: the threshold but under half.
    assert (
        triggered(
            offer(q, node, [sid(n) for n in range(10, 20)], 0.0, batch=21), "server_lost_state"
        )
        == 0
    )
    effects = offer(q, node, [sid(n) for n in range(20, 30)], 0.0, batch=20)
    assert triggered(effects, "server_lost_state") == 1
    assert SERVER_LOST_STATE_LINE.format(named=10, batch=20) in lines(effects, "info")
    assert q.phase is Phase.WAITING


def test_a_truncated_verdict_starts_a_full_replay_whatever_it_names() -> None:
    node = Node({sid(n) for n in range(5000)})
    q = queue()
    effects = offer(q, node, [], 0.0, batch=4096, truncated=True)
    assert triggered(effects, "server_lost_state") == 1


def test_the_walk_waits_for_its_jitter_then_replays_every_held_agent_once() -> None:
    node = Node({sid(n) for n in range(1234)})
    q = queue(jitter=0.25)  # 0.25 of the 1 s jitter
    offer(q, node, [sid(5), sid(7)], 0.0, truncated=True)
    early, _ = drain(q, node, 0.0)
    assert early == [sid(5), sid(7)]  # the named sessions go at once
    assert poll(q, node, 0.24) == [] and q.phase is Phase.WAITING
    assert q.next_deadline() == 0.25
    poll(q, node, 0.25)
    assert q.phase is Phase.WALKING
    peak = 0
    launched: list[str] = []
    effects: list[ReplayEffect] = []
    while q.active:
        batch, more = q.launch(0.3, node.is_held)
        effects += more
        peak = max(peak, q.depth)
        launched += batch
        for session_id in batch:
            effects += q.finished(session_id, 0.3)
    assert sorted(launched + early) == sorted(node.held)  # each agent once
    assert peak <= 500  # a chunk at a time
    assert FULL_DONE_LINE.format(walked=1234) in lines(effects, "info")


def test_no_second_full_replay_within_60_s_of_the_end_of_the_first() -> None:
    node = Node({sid(n) for n in range(10)})
    q = queue(ReplayPolicy(guard_s=0.0))
    offer(q, node, [], 0.0, truncated=True)
    poll(q, node, 1.0)
    drain(q, node, 5.0)  # ends at 5.0
    assert q.phase is Phase.IDLE
    again = offer(q, node, [sid(1)], 64.9, truncated=True)
    assert triggered(again, "server_lost_state") == 0
    assert triggered(again, "heartbeat") == 1  # the named session is still replayed
    assert q.phase is Phase.IDLE
    assert triggered(offer(q, node, [], 65.0, truncated=True), "server_lost_state") == 1


def test_a_full_replay_while_one_runs_is_not_started_twice() -> None:
    node = Node({sid(n) for n in range(10)})
    q = queue()
    offer(q, node, [], 0.0, truncated=True)
    assert triggered(offer(q, node, [], 0.1, truncated=True), "server_lost_state") == 0
    assert q.full_replays == 1


def test_a_lost_connected_waits_for_a_closed_breaker_and_a_store_below_half() -> None:
    node = Node({sid(n) for n in range(10)})
    q = queue()
    q.arm_notify_loss()
    assert poll(q, node, 0.0, breaker_closed=False) == []
    assert poll(q, node, 0.0, notify_below_half=False) == []
    effects = poll(q, node, 0.0)
    assert triggered(effects, "notify_loss") == 1
    assert NOTIFY_LOSS_LINE in lines(effects, "info")
    assert not q.armed and q.phase is Phase.WAITING


def test_a_lost_connected_during_the_spacing_runs_when_it_ends() -> None:
    node = Node({sid(1)})
    q = queue(ReplayPolicy(guard_s=0.0))
    offer(q, node, [], 0.0, truncated=True)
    poll(q, node, 1.0)
    drain(q, node, 2.0)
    q.arm_notify_loss()
    assert poll(q, node, 30.0) == []
    assert q.next_deadline() == 62.0
    assert triggered(poll(q, node, 62.0), "notify_loss") == 1


def test_a_walk_with_the_registry_unavailable_is_aborted() -> None:
    q = queue()
    node = Node({sid(1)})
    offer(q, node, [], 0.0, truncated=True)
    effects = q.poll(1.0, breaker_closed=True, notify_below_half=True, held_sessions=lambda: None)
    assert lines(effects, "warning") == [REGISTRY_UNAVAILABLE_LINE]
    assert q.phase is Phase.IDLE and not q.active


def test_nothing_held_starts_no_full_replay() -> None:
    q = queue()
    effects = offer(q, Node(), [sid(1)], 0.0, truncated=True)
    assert dropped(effects, "not_local") == 1
    assert q.phase is Phase.IDLE


# --- the targeted drip against a model ----------------------------------------------------------

UNIVERSE = [sid(n) for n in range(12)]
LINE = re.compile(
    r"named (\d+) session\(s\); queued (\d+), not local (\d+), already queued (\d+),"
    r" within guard (\d+), queue full (\d+)"
)


class TargetedDrip(RuleBasedStateMachine):
    """Verdicts that never amount to a full replay, launches, answers, refusals, time and a held
    set that changes, against a model: an ordered queue, an in-flight set, guard stamps."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = ReplayPolicy(guard_s=10.0, queue_max=5, concurrency=3)
        self.q = queue(self.policy)
        self.node = Node(set(UNIVERSE[:8]))
        self.now = 0.0
        self.queue: list[str] = []
        self.inflight: set[str] = set()
        self.stamps: dict[str, float] = {}

    def guarded(self, s: str) -> bool:
        return s in self.stamps and self.now - self.stamps[s] < self.policy.guard_s

    @rule(ids=st.lists(st.sampled_from(UNIVERSE), unique=True, max_size=8), open_=st.booleans())
    def verdict(self, ids: list[str], open_: bool) -> None:
        ids.sort()
        # A batch of 10**6 heartbeats: never half of it, so never a full replay.
        effects = offer(self.q, self.node, ids, self.now, batch=10**6, breaker_open=open_)
        assert self.q.phase is Phase.IDLE
        if open_:
            assert dropped(effects, "circuit_open") == len(ids)
            return
        expect = {"queued": 0, "not_local": 0, "already": 0, "guard": 0, "full": 0}
        for s in ids:
            if s not in self.node.held:
                expect["not_local"] += 1
            elif s in self.queue or s in self.inflight:
                expect["already"] += 1
            elif self.guarded(s):
                expect["guard"] += 1
            elif len(self.queue) >= self.policy.queue_max:
                expect["full"] += 1
            else:
                self.queue.append(s)
                expect["queued"] += 1
        assert dropped(effects, "not_local") == expect["not_local"]
        assert dropped(effects, "queue_full") == expect["full"]
        assert triggered(effects, "heartbeat") == (1 if expect["queued"] else 0)
        if ids:
            [text] = lines(effects)
            match = LINE.search(text)
            assert match is not None
            assert [int(g) for g in match.groups()] == [len(ids), *expect.values()]

    @rule()
    def launch(self) -> None:
        started, _ = self.q.launch(self.now, self.node.is_held)
        expected = []
        while len(self.inflight) < self.policy.concurrency and self.queue:
            s = self.queue.pop(0)
            if s not in self.node.held:
                continue
            expected.append(s)
            self.inflight.add(s)
            self.stamps[s] = self.now
        assert started == expected

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def answer(self, data: st.DataObject) -> None:
        s = data.draw(st.sampled_from(sorted(self.inflight)))
        self.q.finished(s, self.now)
        self.inflight.discard(s)

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def refused_before_sending(self, data: st.DataObject) -> None:
        s = data.draw(st.sampled_from(sorted(self.inflight)))
        self.q.unsent(s)
        self.inflight.discard(s)
        del self.stamps[s]
        self.queue.insert(0, s)

    @rule(dt=st.sampled_from([0.0, 0.5, 3.0, 9.99, 10.0, 25.0]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(s=st.sampled_from(UNIVERSE), held=st.booleans())
    def agent_comes_or_goes(self, s: str, held: bool) -> None:
        if held:
            self.node.held.add(s)
        else:
            self.node.held.discard(s)

    @invariant()
    def matches_the_model(self) -> None:
        assert list(self.q._queue) == self.queue
        assert self.q.inflight == len(self.inflight) <= self.policy.concurrency
        # The cap bounds verdict appends; a refused replay goes back whatever the depth.
        assert self.q.depth <= self.policy.queue_max + self.policy.concurrency
        for s in UNIVERSE:
            assert self.q.within_guard(s, self.now) == self.guarded(s)


TestTargetedDrip = TargetedDrip.TestCase
TestTargetedDrip.settings = settings(max_examples=150, stateful_step_count=40)


# --- full replays against their promises --------------------------------------------------------


class FullReplays(RuleBasedStateMachine):
    """Truncated verdicts, lost CONNECTEDs, polls, launches and answers, and time. Promises: a
    full replay starts only after its jitter, never within 60 s of the end of the previous one,
    and replays each agent at most once (the guard is longer than the run). That a walk reaches
    every held agent is the property test below."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = ReplayPolicy(guard_s=1e9, concurrency=4, walk_chunk=7, queue_max=50)
        self.jitters: list[float] = []
        self.q = ReplayQueue(self.policy, uniform=self.uniform)
        self.node = Node({sid(n) for n in range(30)})
        self.now = 0.0
        self.requested_at: float | None = None
        self.walk_started: float | None = None
        self.last_end: float | None = None
        self.launched: list[str] = []
        self.inflight: set[str] = set()

    def uniform(self, lo: float, hi: float) -> float:
        value = (lo + hi) / 2
        self.jitters.append(value)
        return value

    def record(self, effects: list[ReplayEffect]) -> None:
        started = triggered(effects, "server_lost_state") + triggered(effects, "notify_loss")
        if started:
            assert started == 1
            assert self.last_end is None or self.now - self.last_end >= 60.0
            self.requested_at = self.now
        for text in lines(effects, "info"):
            if text.startswith("Registration replay: every agent replayed"):
                assert self.walk_started is not None
                self.last_end = self.now
                self.walk_started = None

    @rule(named=st.integers(0, 5))
    def truncated_verdict(self, named: int) -> None:
        ids = sorted(self.node.held)[:named]
        self.record(offer(self.q, self.node, ids, self.now, batch=named or 1, truncated=True))

    @rule()
    def lost_connected(self) -> None:
        self.q.arm_notify_loss()

    @rule(closed=st.booleans(), below=st.booleans())
    def poll(self, closed: bool, below: bool) -> None:
        before = self.q.phase
        self.record(
            poll(self.q, self.node, self.now, breaker_closed=closed, notify_below_half=below)
        )
        if before is Phase.WAITING and self.q.phase is not Phase.WAITING:
            assert self.requested_at is not None
            assert self.now >= self.requested_at + self.jitters[-1]  # after its jitter
            self.walk_started = self.now
            self.launched = []

    @rule()
    def launch(self) -> None:
        started, effects = self.q.launch(self.now, self.node.is_held)
        self.record(effects)
        for s in started:
            assert s not in self.launched  # once per walk (and the guard outlasts the run)
            self.launched.append(s)
            self.inflight.add(s)

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def answer(self, data: st.DataObject) -> None:
        s = data.draw(st.sampled_from(sorted(self.inflight)))
        self.inflight.discard(s)
        self.record(self.q.finished(s, self.now))

    @rule(dt=st.sampled_from([0.1, 0.6, 20.0, 61.0]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @invariant()
    def bounded(self) -> None:
        assert self.q.inflight <= self.policy.concurrency
        assert self.q.depth <= self.policy.queue_max + self.policy.walk_chunk


TestFullReplays = FullReplays.TestCase
TestFullReplays.settings = settings(max_examples=100, stateful_step_count=60)


@given(
    held=st.integers(1, 1500),
    named=st.lists(st.integers(0, 1499), max_size=40, unique=True),
    answered_first=st.integers(0, 40),
)
@settings(max_examples=60, deadline=None)
def test_a_full_replay_during_a_targeted_drip_walks_the_rest(
    held: int, named: list[int], answered_first: int
) -> None:
    """Seed: breaker_replay_during_targeted_drip_walks_the_rest: the walk follows the queued
    entries and skips the sessions inside the guard window, so each agent is replayed once."""
    node = Node({sid(n) for n in range(held)})
    q = queue()
    offer(q, node, sorted(sid(n) for n in named), 0.0, batch=10**6)
    early, _ = q.launch(0.0, node.is_held)
    for s in early[:answered_first]:
        q.finished(s, 0.0)
    offer(q, node, [], 0.0, truncated=True)
    poll(q, node, 1.0)
    rest, _ = drain(q, node, 1.0)
    for s in early[answered_first:]:
        q.finished(s, 1.0)
    # With every permit held by the early replays (24 named, none answered yet), the walk can
    # only go on once they are answered.
    last, _ = drain(q, node, 1.0)
    everything = early + rest + last
    assert len(everything) == len(set(everything)) == held
    assert not q.active
