"""Owner-crash recovery in the pure cores (actors/core/owner_recovery.py and the recovery phases
of actors/core/owner_lifecycle.py) against the seed's steps ("When an agent's owner process
crashes"): the restarted owner takes the dead predecessor's stream home id and row, sends its
DISCONNECTED only if it was owed, waits for it to settle, registers, presents the session and
announces CONNECTED with the same stream home id; every failure ends the session with exactly
one DISCONNECTED per CONNECTED; the 4th restart in 60 s gives up; each restart counts one outcome.
"""

from __future__ import annotations

import pytest
from grpclib.const import Status
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from actors.core.notify_store import Event
from actors.core.owner_lifecycle import (
    OWNER_GAVE_UP_DETAILS,
    RECOVERY_FAILED_DETAILS,
    REFUSED_DETAILS,
    TRANSITIONS,
    Announce,
    CloseStream,
    DeleteRow,
    FailCommands,
    LifecycleError,
    OwnerLifecycle,
    Phase,
    Predecessor,
    PresentSession,
    RegisterSession,
    ReportRestart,
    SettleDisconnected,
    Stop,
    Unregister,
    WriteRow,
)
from actors.core.owner_recovery import (
    MAX_RESTARTS,
    RESTART_WINDOW_S,
    record_restart,
    superseded,
)

MINE = "a" * 32
OLD = "b" * 32
UNAVAILABLE = Status.UNAVAILABLE.value


def dead(state: str = "live", give_up: bool = False) -> Predecessor:
    return Predecessor(OLD, alive=False, state=state, give_up=give_up)


def recovering() -> OwnerLifecycle:
    life = OwnerLifecycle(MINE)
    assert life.begin(stream_open=True, predecessor=dead()) == [
        WriteRow("recovering"),
        SettleDisconnected(OLD),
    ]
    assert (life.phase, life.stream_home_id, life.restarted) == (Phase.SETTLING, OLD, True)
    return life


# --- the restart budget -------------------------------------------------------------------------


def test_the_fourth_restart_within_60_s_gives_up() -> None:
    history: tuple[float, ...] = ()
    verdicts = []
    for now in (0.0, 10.0, 20.0, 30.0):
        history, give_up = record_restart(history, now)
        verdicts.append(give_up)
    assert verdicts == [False, False, False, True]


def test_restarts_older_than_the_window_are_forgotten() -> None:
    history = (0.0, 1.0, 2.0)
    history, give_up = record_restart(history, 61.5)
    assert (history, give_up) == ((2.0, 61.5), False)


@given(st.lists(st.floats(0, 1000), max_size=20).map(sorted))
def test_gives_up_exactly_when_three_restarts_precede_within_the_window(times: list[float]) -> None:
    history: tuple[float, ...] = ()
    for i, now in enumerate(times):
        history, give_up = record_restart(history, now)
        earlier = [t for t in times[:i] if now - t < RESTART_WINDOW_S]
        assert give_up == (len(earlier) >= MAX_RESTARTS)
        assert all(now - t < RESTART_WINDOW_S for t in history)


@given(
    since=st.floats(0, 1000),
    others=st.lists(st.floats(0, 1000), max_size=5),
    registering=st.booleans(),
)
def test_superseded_exactly_when_the_agent_has_a_newer_session(
    since: float, others: list[float], registering: bool
) -> None:
    # A Register not yet taken, or a live session first registered later, is newer; a live
    # session registered earlier (or at the same time) is not.
    expected = registering or any(t > since for t in others)
    assert superseded(since, others, registering) == expected
    assert not superseded(since, [t for t in others if t <= since], registering=False)


# --- examples -----------------------------------------------------------------------------------


def test_recovery_settles_registers_presents_then_announces_the_same_home() -> None:
    life = recovering()
    assert not life.accepts_commands  # not registered: the router cannot find it anyway
    assert life.settled() == [RegisterSession()]
    assert life.accepts_commands
    assert life.registered() == [PresentSession()]
    assert life.presented() == [
        WriteRow("live"),
        Announce(Event.CONNECTED, OLD),
        ReportRestart("recovered"),
    ]
    assert life.phase is Phase.STREAMING
    # From here it is an owner like any other: the agent leaving ends it with its DISCONNECTED.
    life.agent_gone()
    assert life.finish("normal") == [
        Announce(Event.DISCONNECTED, OLD),
        DeleteRow(),
        Unregister(),
        FailCommands(),
    ]


def test_a_recovering_predecessor_already_sent_the_disconnected() -> None:
    life = OwnerLifecycle(MINE)
    # Killed while recovering: no second DISCONNECTED, straight to the registry.
    assert life.begin(stream_open=True, predecessor=dead("recovering")) == [
        WriteRow("recovering"),
        RegisterSession(),
    ]
    assert life.phase is Phase.READOPTING


def test_a_refused_presentation_ends_the_stream_and_counts_disconnected_only() -> None:
    life = recovering()
    life.settled()
    life.registered()
    assert life.not_presented("superseded; register again") == [Stop()]
    assert life.finish("normal") == [
        ReportRestart("disconnected_only"),
        DeleteRow(),
        Unregister(),
        FailCommands(),
        CloseStream(UNAVAILABLE, "superseded; register again"),
    ]


def test_a_superseded_session_is_marked_and_ends_without_being_presented() -> None:
    # The registry refused the re-registration: the agent registered a newer session meanwhile.
    life = recovering()
    assert life.settled() == [RegisterSession()]
    assert life.refused("superseded") == [WriteRow("superseded"), Stop()]
    assert not life.accepts_commands
    assert life.registered() == []  # a late answer changes nothing: nothing is presented
    details = REFUSED_DETAILS["superseded"]
    # The DISCONNECTED went with the settle: none again; the registry holds nothing to drop.
    assert life.finish("normal") == [
        ReportRestart("disconnected_only"),
        DeleteRow(),
        FailCommands(),
        CloseStream(UNAVAILABLE, details),
    ]


def test_the_recovery_deadline_ends_the_session() -> None:
    life = recovering()
    assert life.timed_out() == [Stop()]
    assert life.finish("normal")[-1] == CloseStream(UNAVAILABLE, RECOVERY_FAILED_DETAILS)
    # A deadline that fires after the recovery is absorbed.
    done = recovering()
    done.settled()
    done.registered()
    done.presented()
    assert done.timed_out() == []
    assert done.phase is Phase.STREAMING


def test_giving_up_sends_what_is_owed_closes_the_stream_and_warns_once() -> None:
    life = OwnerLifecycle(MINE)
    assert life.begin(stream_open=True, predecessor=dead(give_up=True)) == [
        ReportRestart("gave_up"),
        Stop(),
    ]
    assert life.finish("normal") == [
        Announce(Event.DISCONNECTED, OLD),
        DeleteRow(),
        FailCommands(),
        CloseStream(UNAVAILABLE, OWNER_GAVE_UP_DETAILS),
    ]


def test_giving_up_after_a_recovering_predecessor_sends_no_second_disconnected() -> None:
    life = OwnerLifecycle(MINE)
    life.begin(stream_open=True, predecessor=dead("recovering", give_up=True))
    assert Announce(Event.DISCONNECTED, OLD) not in life.finish("normal")


def test_a_crash_while_recovering_leaves_the_row_to_the_next_restart() -> None:
    life = recovering()
    life.settled()
    assert life.finish("crash") == [Unregister(), FailCommands()]


def test_a_planned_stop_while_recovering_ends_the_session() -> None:
    life = recovering()
    assert life.finish("shutdown") == [
        ReportRestart("disconnected_only"),
        DeleteRow(),
        FailCommands(),
        CloseStream(UNAVAILABLE, "session owner stopped"),
    ]


def test_recovery_events_are_refused_outside_recovery() -> None:
    life = OwnerLifecycle(MINE)
    life.begin(stream_open=True, predecessor=None)
    for event in ("settled", "presented"):
        with pytest.raises(LifecycleError):
            getattr(life, event)()


# --- the state machine ----------------------------------------------------------------------------

EVENTS = (
    "settled",
    "registered",
    "refused",
    "registry_down",
    "presented",
    "not_presented",
    "agent_gone",
    "stuck",
    "timed_out",
)
ARGS = {"not_presented": ("refused",)}
REFUSALS = ("cap", "superseded")


class RecoveryMachine(RuleBasedStateMachine):
    @initialize(
        stream_open=st.booleans(),
        state=st.sampled_from(["live", "recovering"]),
        give_up=st.booleans(),
    )
    def begin(self, stream_open: bool, state: str, give_up: bool) -> None:
        self.life = OwnerLifecycle(MINE)
        self.owed_by_predecessor = state == "live"
        self.effects: list[object] = []
        self.agent_gone = not stream_open
        self.finish_reason: str | None = None
        self.effects += self.life.begin(
            stream_open=stream_open, predecessor=dead(state, give_up=give_up)
        )
        self.gave_up = give_up
        # Where in `effects` the registry's `superseded` refusal landed (None: it did not).
        self.superseded_at: int | None = None

    @rule(event=st.sampled_from(EVENTS), refusal=st.sampled_from(REFUSALS))
    def event(self, event: str, refusal: str) -> None:
        phase = self.life.phase
        args = (refusal,) if event == "refused" else ARGS.get(event, ())
        if (phase, event) not in TRANSITIONS:
            with pytest.raises(LifecycleError):
                getattr(self.life, event)(*args)
            assert self.life.phase is phase
            return
        if event == "agent_gone":
            self.agent_gone = True
        effects = getattr(self.life, event)(*args)
        if args == ("superseded",) and phase is Phase.READOPTING:
            self.superseded_at = len(self.effects)
            assert effects[0] == WriteRow("superseded")
        self.effects += effects

    @rule(reason=st.sampled_from(["normal", "shutdown", "crash"]))
    def finish(self, reason: str) -> None:
        if self.finish_reason is not None:
            return
        self.finish_reason = reason
        self.effects += self.life.finish(reason)

    def _of(self, kind: type) -> list[object]:
        return [e for e in self.effects if isinstance(e, kind)]

    @invariant()
    def one_home_and_balanced_notifications(self) -> None:
        settles = self._of(SettleDisconnected)
        announced = self._of(Announce)
        assert all(e.stream_home_id == OLD for e in [*settles, *announced])  # type: ignore[attr-defined]
        disconnects = len(settles) + sum(
            1
            for a in announced
            if a.event is Event.DISCONNECTED  # type: ignore[attr-defined]
        )
        connects = sum(1 for a in announced if a.event is Event.CONNECTED)  # type: ignore[attr-defined]
        owed_before = 1 if self.owed_by_predecessor else 0
        assert connects <= 1 and disconnects <= owed_before + connects
        crashed = self.finish_reason == "crash"
        if self.finish_reason is not None and not crashed:
            # Exactly one DISCONNECTED for every CONNECTED the session saw.
            assert disconnects == owed_before + connects
        if connects:
            assert not self.gave_up and self.life.outcome == "recovered"

    @invariant()
    def one_outcome_per_restart(self) -> None:
        counts = self._of(ReportRestart)
        assert len(counts) <= 1
        if self.finish_reason in ("normal", "shutdown"):
            assert len(counts) == 1
        if self.gave_up:
            assert counts == [ReportRestart("gave_up")]

    @invariant()
    def stream_left_or_closed_once(self) -> None:
        closes = self._of(CloseStream)
        assert len(closes) <= 1
        if closes:
            assert not self.agent_gone and self.finish_reason in ("normal", "shutdown")
        elif self.finish_reason in ("normal", "shutdown") and self.life.outcome != "recovered":
            assert self.agent_gone

    @invariant()
    def superseded_is_never_registered_again(self) -> None:
        if self.superseded_at is None:
            return
        after = self.effects[self.superseded_at :]
        assert not any(isinstance(e, (RegisterSession, PresentSession, Announce)) for e in after)
        assert self.life.outcome != "recovered"

    @invariant()
    def row_kept_unless_settled(self) -> None:
        deletes = self._of(DeleteRow)
        if self.finish_reason == "crash":
            assert not deletes  # the next restart takes it
        elif self.finish_reason is not None:
            assert deletes == [DeleteRow()]


TestRecoveryMachine = RecoveryMachine.TestCase
TestRecoveryMachine.settings = settings(max_examples=300, stateful_step_count=12, deadline=None)
