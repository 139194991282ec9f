"""The per-connection session cap against the seed's rules (SPEC_INDEX PEND-01..03, PEND-06,
PEND-09, PEND-10, K30, K31).

Example tests pin the seed's numbers (9 distinct ids, 20 same-id calls at cap 8, no leaked slot);
the state machine drives arbitrary reservations, commits, claims, releases, connections going
down and time, and checks after every step that no connection ever holds more than the cap,
in-flight reservations included, against a plain model of who holds what where.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from actors.core.reservations import (
    DuplicateReservationError,
    Granted,
    Refused,
    SessionSlots,
    SlotPolicy,
)

CAP = 8


def slots(cap: int = CAP, ttl: float = 120.0) -> SessionSlots:
    return SessionSlots(SlotPolicy(max_sessions_per_connection=cap, reservation_ttl_s=ttl))


# --- the seed's examples --------------------------------------------------------------------------


def test_nine_distinct_ids_in_sequence_eight_accepted_the_ninth_refused() -> None:
    book = slots()
    answers = []
    for i in range(9):
        answer = book.reserve(i, "conn", f"agent-{i}", float(i))
        if isinstance(answer, Granted):
            assert book.commit(i, ("pending", f"s{i}")) == "conn"
        answers.append(answer)
    assert [type(a) for a in answers] == [Granted] * 8 + [Refused]
    assert answers[-1] == Refused("cap")
    assert book.used("conn") == 8


def test_twenty_concurrent_same_id_registers_at_cap_eight() -> None:
    """The adversarial review: the agent's own in-flight reservations must count."""
    book = slots()
    answers = [book.reserve(i, "conn", "same-agent", 0.0) for i in range(20)]
    assert sum(isinstance(a, Granted) for a in answers) == 8
    assert answers[8:] == [Refused("cap")] * 12
    assert book.usage("conn")["reservation"] == 8


def test_two_hundred_concurrent_distinct_ids() -> None:
    book = slots()
    answers = [book.reserve(i, "conn", f"agent-{i}", 0.0) for i in range(200)]
    assert sum(isinstance(a, Granted) for a in answers) == 8


def test_no_leaked_slot_after_eight_sessions_close() -> None:
    book = slots()
    for round_ in range(3):
        for i in range(8):
            rid = (round_, i)
            assert isinstance(book.reserve(rid, "conn", f"a{i}", 0.0), Granted)
            book.commit(rid, ("pending", f"s{round_}-{i}"))
            # Subscribe takes the row (the slot moves), the owner registers, then ends.
            assert (
                book.claim(
                    ("subscribing", f"s{round_}-{i}"),
                    "conn",
                    0.0,
                    replacing=("pending", f"s{round_}-{i}"),
                    expires_at=120.0,
                )
                is None
            )
            assert (
                book.claim(
                    ("live", f"s{round_}-{i}"),
                    "conn",
                    0.0,
                    replacing=("subscribing", f"s{round_}-{i}"),
                )
                is None
            )
        assert book.reserve(("extra", round_), "conn", "x", 0.0) == Refused("cap")
        for i in range(8):
            assert book.release(("live", f"s{round_}-{i}")) == "conn"
        assert book.used("conn") == 0
    assert book.holders == 0 and list(book.connections()) == []


# --- each operation -------------------------------------------------------------------------------


def test_release_frees_the_slot_and_ignores_unknown_holders() -> None:
    book = slots(cap=1)
    assert book.reserve(1, "c", "a", 0.0) == Granted(1, 0.0)
    assert book.reserve(2, "c", "a", 0.0) == Refused("cap")
    assert book.cancel(1) == "c"
    assert book.cancel(1) is None
    assert book.release(("live", "nobody")) is None
    assert isinstance(book.reserve(2, "c", "a", 0.0), Granted)


def test_a_duplicate_request_id_is_an_error() -> None:
    book = slots()
    book.reserve(1, "c", "a", 0.0)
    with pytest.raises(DuplicateReservationError):
        book.reserve(1, "other", "a", 0.0)


def test_commit_keeps_the_slot_and_needs_no_second_cap_check() -> None:
    book = slots(cap=1)
    book.reserve(1, "c", "a", 5.0)
    assert book.reservation(1) is not None and book.reservation(1).stamp == 5.0
    assert book.commit(1, ("pending", "s1")) == "c"
    assert book.reservation(1) is None
    assert book.usage("c") == {"reservation": 0, "pending": 1, "subscribing": 0, "live": 0}
    assert book.expires_at(("pending", "s1")) == math.inf
    assert book.commit(1, ("pending", "s1")) is None  # the reservation is gone


def test_commit_of_a_session_held_elsewhere_moves_it() -> None:
    book = slots()
    book.reserve(1, "c1", "a", 0.0)
    book.commit(1, ("pending", "s"))
    book.reserve(2, "c2", "a", 1.0)
    assert book.commit(2, ("pending", "s")) == "c2"
    assert book.used("c1") == 0 and book.used("c2") == 1


def test_claim_moves_a_slot_without_a_gap_and_respects_the_cap_elsewhere() -> None:
    book = slots(cap=2)
    for i in range(2):
        book.reserve(i, "c1", "a", 0.0)
        book.commit(i, ("pending", f"s{i}"))
    # Same connection, full: the subscribing holder takes the pending row's place.
    assert book.claim(("subscribing", "s0"), "c1", 0.0, replacing=("pending", "s0")) is None
    assert book.usage("c1")["subscribing"] == 1 and book.used("c1") == 2
    # Another connection, full: refused, and nothing moved.
    book.reserve(10, "c2", "b", 0.0)
    book.reserve(11, "c2", "b", 0.0)
    assert book.claim(("subscribing", "s1"), "c2", 0.0, replacing=("pending", "s1")) == Refused(
        "cap"
    )
    assert book.conn_of(("pending", "s1")) == "c1"
    # Room there: it moves, and frees its place on the first connection.
    book.cancel(10)
    assert book.claim(("subscribing", "s1"), "c2", 0.0, replacing=("pending", "s1")) is None
    assert book.used("c1") == 1 and book.used("c2") == 2


def test_claim_by_a_holder_already_there_changes_only_its_expiry() -> None:
    book = slots(cap=1)
    assert book.claim(("live", "s"), "c", 0.0, expires_at=10.0) is None
    assert book.next_deadline() == 10.0
    assert book.claim(("live", "s"), "c", 0.0) is None
    assert book.next_deadline() is None and book.used("c") == 1


def test_a_connection_going_down() -> None:
    book = slots()
    assert book.connection_down("idle") is False  # holds nothing: nothing to mark
    book.reserve(1, "c", "a", 0.0)
    book.reserve(2, "c", "a", 0.0)
    assert book.connection_down("c") is True
    assert book.reserve(3, "c", "a", 0.0) == Refused("connection_down")
    assert book.claim(("live", "s"), "c", 0.0) == Refused("connection_down")
    assert book.commit(1, ("pending", "s1")) is None  # its Register cannot be answered
    assert book.used("c") == 1 and book.connections_down == 1
    book.cancel(2)
    # Forgotten with its last holder.
    assert list(book.connections()) == [] and book.connections_down == 0


def test_reservations_and_abandoned_takes_expire_at_the_ttl() -> None:
    book = slots(ttl=120.0)
    book.reserve(1, "c", "a", 0.0)
    book.reserve(2, "c", "a", 10.0)
    book.claim(("subscribing", "s"), "c", 10.0, expires_at=130.0)
    book.reserve(3, "c", "a", 20.0)
    book.commit(3, ("pending", "t"))  # committed: no expiry here (the pending store's TTL)
    assert book.next_deadline() == 120.0
    assert book.expire(119.9) == []
    assert book.expire(120.0) == [(("reservation", 1), "c")]
    assert book.expire(1000.0) == [(("reservation", 2), "c"), (("subscribing", "s"), "c")]
    assert book.used("c") == 1 and book.next_deadline() is None


def test_the_policy_refuses_a_cap_below_one() -> None:
    with pytest.raises(ValueError, match="max_sessions_per_connection"):
        SlotPolicy(max_sessions_per_connection=0)


# --- the state machine ----------------------------------------------------------------------------

CONNS = ["c1", "c2", "c3"]
SESSIONS = ["s1", "s2", "s3", "s4", "s5"]
KINDS = ["pending", "subscribing", "live"]
MACHINE_CAP = 3
MACHINE_TTL = 5.0


class SlotMachine(RuleBasedStateMachine):
    """A model of holders (holder -> connection, expiry) and down connections; after every step
    the core agrees with it and no connection holds more than the cap."""

    def __init__(self) -> None:
        super().__init__()
        self.book = slots(cap=MACHINE_CAP, ttl=MACHINE_TTL)
        self.now = 0.0
        self.next_id = 0
        self.where: dict[tuple, str] = {}
        self.expiry: dict[tuple, float] = {}
        self.down: set[str] = set()
        self.reserved_agent: dict[int, str] = {}

    # -- the model --

    def count(self, conn: str) -> int:
        return sum(1 for c in self.where.values() if c == conn)

    def remove(self, holder: tuple) -> None:
        conn = self.where.pop(holder)
        self.expiry.pop(holder, None)
        if holder[0] == "reservation":
            del self.reserved_agent[holder[1]]
        if self.count(conn) == 0:
            self.down.discard(conn)

    def add(self, holder: tuple, conn: str, expires_at: float) -> None:
        self.where[holder] = conn
        if math.isfinite(expires_at):
            self.expiry[holder] = expires_at

    # -- rules --

    @rule(conn=st.sampled_from(CONNS), agent=st.sampled_from(["a", "b"]))
    def reserve(self, conn: str, agent: str) -> None:
        rid = self.next_id
        self.next_id += 1
        answer = self.book.reserve(rid, conn, agent, self.now)
        if conn in self.down:
            assert answer == Refused("connection_down")
        elif self.count(conn) >= MACHINE_CAP:
            assert answer == Refused("cap")
        else:
            assert answer == Granted(rid, self.now)
            self.add(("reservation", rid), conn, self.now + MACHINE_TTL)
            self.reserved_agent[rid] = agent

    @rule(data=st.data(), session=st.sampled_from(SESSIONS))
    def commit(self, data: st.DataObject, session: str) -> None:
        rids = [*sorted(self.reserved_agent), -1]  # -1: a reservation that is gone
        rid = data.draw(st.sampled_from(rids))
        holder = ("pending", session)
        got = self.book.commit(rid, holder)
        if rid not in self.reserved_agent:
            assert got is None
            return
        conn = self.where[("reservation", rid)]
        if conn in self.down:
            assert got is None
            self.remove(("reservation", rid))
            return
        assert got == conn
        if holder in self.where:
            self.remove(holder)
        self.remove(("reservation", rid))
        self.add(holder, conn, math.inf)

    @rule(
        kind=st.sampled_from(KINDS),
        session=st.sampled_from(SESSIONS),
        conn=st.sampled_from(CONNS),
        replace=st.sampled_from([None, "pending", "subscribing"]),
        ttl=st.booleans(),
    )
    def claim(self, kind: str, session: str, conn: str, replace: str | None, ttl: bool) -> None:
        holder = (kind, session)
        replacing = None if replace is None else (replace, session)
        expires_at = self.now + MACHINE_TTL if ttl else math.inf
        got = self.book.claim(holder, conn, self.now, replacing=replacing, expires_at=expires_at)
        if conn in self.down:
            assert got == Refused("connection_down")
            return
        if self.where.get(holder) == conn:
            assert got is None
            self.expiry.pop(holder, None)
            if math.isfinite(expires_at):
                self.expiry[holder] = expires_at
            if replacing is not None and replacing != holder and replacing in self.where:
                self.remove(replacing)
            return
        takes_place = replacing is not None and self.where.get(replacing) == conn
        if not takes_place and self.count(conn) >= MACHINE_CAP:
            assert got == Refused("cap")
            return
        assert got is None
        if replacing is not None and replacing in self.where:
            self.remove(replacing)
        if holder in self.where:
            self.remove(holder)
        self.add(holder, conn, expires_at)

    @precondition(lambda self: bool(self.where))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        holder = data.draw(st.sampled_from(sorted(self.where, key=repr)))
        assert self.book.release(holder) == self.where[holder]
        self.remove(holder)

    @rule(conn=st.sampled_from(CONNS))
    def connection_down(self, conn: str) -> None:
        held = self.count(conn) > 0
        assert self.book.connection_down(conn) is held
        if held:
            self.down.add(conn)

    @rule(dt=st.sampled_from([0.0, 1.0, 2.5, 5.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        due = sorted(
            ((at, h) for h, at in self.expiry.items() if at <= self.now), key=lambda x: x[0]
        )
        expired = self.book.expire(self.now)
        assert sorted(expired, key=repr) == sorted(((h, self.where[h]) for _, h in due), key=repr)
        for _, holder in due:
            self.remove(holder)

    # -- invariants --

    @invariant()
    def the_cap_is_never_exceeded_counting_in_flight_reservations(self) -> None:
        for conn in CONNS:
            assert self.book.used(conn) <= MACHINE_CAP

    @invariant()
    def the_book_agrees_with_the_model(self) -> None:
        assert self.book.holders == len(self.where)
        assert self.book.reservations == len(self.reserved_agent)
        for conn in CONNS:
            assert self.book.used(conn) == self.count(conn)
            assert self.book.is_down(conn) is (conn in self.down)
            usage = self.book.usage(conn)
            for kind in ("reservation", *KINDS):
                want = sum(1 for h, c in self.where.items() if c == conn and h[0] == kind)
                assert usage[kind] == want
        for kind in ("reservation", *KINDS):
            assert self.book.count(kind) == sum(1 for h in self.where if h[0] == kind)
        for holder, conn in self.where.items():
            assert self.book.conn_of(holder) == conn
            assert self.book.expires_at(holder) == self.expiry.get(holder, math.inf)
        future = [at for at in self.expiry.values()]
        assert self.book.next_deadline() == (min(future) if future else None)

    @invariant()
    def down_marks_only_on_connections_that_hold_something(self) -> None:
        assert set(self.book.connections()) == set(self.where.values())


TestSlotMachine = SlotMachine.TestCase
TestSlotMachine.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
