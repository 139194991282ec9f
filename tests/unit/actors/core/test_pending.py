"""Pending registrations against the seed's rules (SPEC_INDEX PEND-04, PEND-05, PEND-06,
PEND-08, K30, C66).

Example tests pin the seed's cases (40 Registers of one agent leave one row, the superseded
commit leaves nothing, TTL 120 s, grace 15 s); the state machine drives commits with arbitrary
stamps, takes, connections going down and time against a plain model, and checks the
same-agent rule (newest stamp wins, equal stamps: the last commit handled), the per-connection
index and both sweeps after every step.
"""

from __future__ import annotations

import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from actors.core.pending import (
    PendingPolicy,
    PendingRow,
    PendingStore,
    Removed,
    Stored,
    Superseded,
)


def row(session: str, agent: str = "agent", conn: str = "c", stamp: float = 0.0) -> PendingRow:
    return PendingRow(session, agent, conn, stamp)


# --- the seed's examples --------------------------------------------------------------------------


def test_the_same_agent_registering_forty_times_leaves_one_row() -> None:
    store = PendingStore()
    for i in range(40):
        outcome = store.commit(row(f"s{i}", stamp=float(i)), now=float(i))
        assert isinstance(outcome, Stored)
        assert outcome.replaced == (None if i == 0 else store_row(f"s{i - 1}", i - 1))
    assert len(store) == 1 and store.count("c") == 1
    assert store.of_agent("agent").session_id == "s39"


def store_row(session: str, t: int) -> PendingRow:
    return PendingRow(session, "agent", "c", float(t), committed_at=float(t))


def test_the_newest_stamp_wins_whatever_order_the_server_answers_in() -> None:
    store = PendingStore()
    stamps = list(range(40))
    random.Random(7).shuffle(stamps)
    superseded = 0
    best = -1
    for stamp in stamps:
        outcome = store.commit(row(f"s{stamp}", stamp=float(stamp)), now=100.0)
        if stamp < best:
            assert outcome == Superseded(row(f"s{stamp}", stamp=float(stamp)), "newer_row")
            superseded += 1
        else:
            assert isinstance(outcome, Stored)
            best = stamp
    assert len(store) == 1 and store.of_agent("agent").stamp == 39.0
    assert superseded > 0


def test_of_equal_stamps_the_last_commit_handled_wins() -> None:
    store = PendingStore()
    store.commit(row("first", stamp=5.0), now=6.0)
    outcome = store.commit(row("second", stamp=5.0), now=7.0)
    assert isinstance(outcome, Stored) and outcome.replaced.session_id == "first"
    assert store.get("first") is None and store.get("second") is not None


def test_a_superseded_commit_leaves_no_row_of_its_own() -> None:
    store = PendingStore()
    store.commit(row("new", stamp=2.0), now=3.0)
    outcome = store.commit(row("old", stamp=1.0), now=4.0)
    assert isinstance(outcome, Superseded) and outcome.reason == "newer_row"
    assert store.get("old") is None and len(store) == 1


def test_the_rule_is_per_agent_across_connections() -> None:
    store = PendingStore()
    store.commit(row("boot", conn="bootstrap", stamp=1.0), now=1.0)
    outcome = store.commit(row("again", conn="second", stamp=2.0), now=2.0)
    assert isinstance(outcome, Stored) and outcome.replaced.session_id == "boot"
    assert store.count("bootstrap") == 0 and store.count("second") == 1


def test_another_agents_session_id_is_refused() -> None:
    store = PendingStore()
    store.commit(row("s", agent="a"), now=0.0)
    outcome = store.commit(row("s", agent="b", stamp=1.0), now=1.0)
    assert isinstance(outcome, Superseded) and outcome.reason == "session_conflict"
    assert store.get("s").agent_id == "a"


def test_the_same_session_committed_again_replaces_itself() -> None:
    store = PendingStore()
    store.commit(row("s", conn="c1"), now=0.0)
    outcome = store.commit(row("s", conn="c2", stamp=1.0), now=1.0)
    assert isinstance(outcome, Stored) and outcome.replaced.conn_key == "c1"
    assert store.count("c1") == 0 and store.count("c2") == 1 and len(store) == 1


def test_rows_live_120_s_from_their_commit() -> None:
    store = PendingStore()
    store.commit(row("s1", agent="a"), now=0.0)
    store.commit(row("s2", agent="b"), now=30.0)
    assert store.next_deadline() == 120.0
    assert store.sweep(119.999) == []
    [gone] = store.sweep(120.0)
    assert gone == Removed(PendingRow("s1", "a", "c", 0.0), "ttl")
    assert store.next_deadline() == 150.0 and store.get("s2") is not None


def test_rows_of_a_connection_that_went_down_go_after_a_15_s_grace() -> None:
    store = PendingStore()
    store.commit(row("s1", agent="a", conn="boot"), now=0.0)
    store.commit(row("s2", agent="b", conn="boot"), now=0.0)
    store.commit(row("s3", agent="c", conn="other"), now=0.0)
    store.connection_down("boot", now=4.0)
    store.connection_down("boot", now=10.0)  # a second report does not extend the grace
    assert store.in_grace("boot") and store.next_deadline() == 19.0
    # While in its grace: the rows can still be taken (the agent subscribes on a new
    # connection), and a commit for that connection is refused (its answer cannot arrive).
    assert store.take("s2").session_id == "s2"
    late = store.commit(row("s4", agent="d", conn="boot", stamp=5.0), now=5.0)
    assert isinstance(late, Superseded) and late.reason == "connection_down"
    assert store.sweep(18.9) == []
    assert [(r.row.session_id, r.reason) for r in store.sweep(19.0)] == [("s1", "grace")]
    assert store.count("boot") == 0 and not store.in_grace("boot")
    assert store.get("s3") is not None


def test_take_removes_the_row_and_its_index_entries() -> None:
    store = PendingStore()
    store.commit(row("s"), now=0.0)
    taken = store.take("s")
    assert taken == PendingRow("s", "agent", "c", 0.0)
    assert store.take("s") is None
    assert store.of_agent("agent") is None and store.count("c") == 0
    assert store.next_deadline() is None


def test_the_register_payload_is_neither_compared_nor_shown() -> None:
    secret = object()
    stored = PendingRow("s", "a", "c", 0.0, register=secret)
    assert stored == PendingRow("s", "a", "c", 0.0, register=None)
    assert "register" not in repr(stored)


# --- the state machine ----------------------------------------------------------------------------

AGENTS = ["a", "b", "c"]
SESSIONS = ["s1", "s2", "s3", "s4", "s5", "s6"]
CONNS = ["k1", "k2"]
TTL = 10.0
GRACE = 3.0


class PendingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = PendingStore(PendingPolicy(ttl_s=TTL, grace_s=GRACE))
        self.now = 0.0
        # The model: session -> (agent, conn, stamp, committed_at); conn -> grace end.
        self.rows: dict[str, tuple[str, str, float, float]] = {}
        self.grace: dict[str, float] = {}

    def agent_row(self, agent: str) -> str | None:
        found = [s for s, r in self.rows.items() if r[0] == agent]
        assert len(found) <= 1
        return found[0] if found else None

    @rule(
        agent=st.sampled_from(AGENTS),
        session=st.sampled_from(SESSIONS),
        conn=st.sampled_from(CONNS),
        stamp=st.integers(0, 6),
    )
    def commit(self, agent: str, session: str, conn: str, stamp: int) -> None:
        outcome = self.store.commit(PendingRow(session, agent, conn, float(stamp)), self.now)
        current = self.agent_row(agent)
        if conn in self.grace:
            assert isinstance(outcome, Superseded) and outcome.reason == "connection_down"
        elif session in self.rows and self.rows[session][0] != agent:
            assert isinstance(outcome, Superseded) and outcome.reason == "session_conflict"
        elif current is not None and stamp < self.rows[current][2]:
            # Newest stamp wins: an older Register is refused and leaves nothing.
            assert isinstance(outcome, Superseded) and outcome.reason == "newer_row"
        else:
            assert isinstance(outcome, Stored)
            assert outcome.row.committed_at == self.now
            if current is None:
                assert outcome.replaced is None
            else:
                assert outcome.replaced.session_id == current
                assert outcome.replaced.stamp <= stamp  # equal stamps: the last commit wins
                del self.rows[current]
            self.rows[session] = (agent, conn, float(stamp), self.now)

    @rule(session=st.sampled_from(SESSIONS))
    def take(self, session: str) -> None:
        taken = self.store.take(session)
        if session in self.rows:
            assert taken is not None and taken.session_id == session
            del self.rows[session]
        else:
            assert taken is None

    @rule(conn=st.sampled_from(CONNS))
    def connection_down(self, conn: str) -> None:
        self.store.connection_down(conn, self.now)
        self.grace.setdefault(conn, self.now + GRACE)

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 3.0, 10.0]))
    def advance_and_sweep(self, dt: float) -> None:
        self.now += dt
        removed = self.store.sweep(self.now)
        ended = {c for c, end in self.grace.items() if end <= self.now}
        want: dict[str, str] = {}
        for session, (_, conn, _, _) in self.rows.items():
            if conn in ended:
                want[session] = "grace"
        for session, (_, _, _, at) in self.rows.items():
            if session not in want and at + TTL <= self.now:
                want[session] = "ttl"
        assert {r.row.session_id: r.reason for r in removed} == want
        assert len(removed) == len(want)
        for session in want:
            del self.rows[session]
        for conn in ended:
            del self.grace[conn]

    @invariant()
    def one_row_per_agent_and_the_model_agrees(self) -> None:
        assert len(self.store) == len(self.rows)
        for agent in AGENTS:
            session = self.agent_row(agent)
            found = self.store.of_agent(agent)
            assert (found.session_id if found else None) == session
        for session, (agent, conn, stamp, at) in self.rows.items():
            got = self.store.get(session)
            assert got is not None
            assert (got.agent_id, got.conn_key, got.stamp, got.committed_at) == (
                agent,
                conn,
                stamp,
                at,
            )

    @invariant()
    def the_per_connection_index_agrees(self) -> None:
        for conn in CONNS:
            assert self.store.count(conn) == sum(1 for r in self.rows.values() if r[1] == conn)
            assert self.store.in_grace(conn) is (conn in self.grace)

    @invariant()
    def nothing_is_due_that_the_sweep_left(self) -> None:
        dues = [at + TTL for *_, at in self.rows.values()] + list(self.grace.values())
        assert self.store.next_deadline() == (min(dues) if dues else None)


TestPendingMachine = PendingMachine.TestCase
TestPendingMachine.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
