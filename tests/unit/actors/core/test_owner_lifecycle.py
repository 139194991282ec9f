"""The owner lifecycle core (actors/core/owner_lifecycle.py) against the seed's rules: one
CONNECTED after the registry accepted the session, exactly one DISCONNECTED with the same stream
home id, the owner-table row kept exactly while that DISCONNECTED is owed, a dead predecessor's
DISCONNECTED sent by its successor, and the stream closed at most once, never after the agent
went away (SPEC_INDEX OC-01, OC-02; "OTP Process Model", "Stream Status Notification").

Example tests pin the effect lists; the state machine feeds arbitrary event sequences and checks
the invariants after every step.
"""

from __future__ import annotations

import pytest
from grpclib.const import Status
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from actors.core.notify_store import Event
from actors.core.owner_lifecycle import (
    OWNER_CONFLICT_DETAILS,
    OWNER_FAILED_DETAILS,
    REFUSED_DETAILS,
    REGISTRY_UNAVAILABLE_DETAILS,
    STOPPING_DETAILS,
    STUCK_DETAILS,
    TRANSITIONS,
    Announce,
    CloseStream,
    DeleteRow,
    FailCommands,
    LifecycleError,
    OwnerLifecycle,
    Phase,
    Predecessor,
    RegisterSession,
    ReportRestart,
    Stop,
    Unregister,
    WriteRow,
)

HOME = "a" * 32
OLD = "b" * 32
UNAVAILABLE = Status.UNAVAILABLE.value
INTERNAL = Status.INTERNAL.value


def streaming() -> OwnerLifecycle:
    life = OwnerLifecycle(HOME)
    assert life.begin(stream_open=True, predecessor=None) == [RegisterSession()]
    assert life.phase is Phase.REGISTERING
    assert life.registered() == [WriteRow("live"), Announce(Event.CONNECTED, HOME)]
    assert life.phase is Phase.STREAMING
    return life


# --- examples -----------------------------------------------------------------------------------


def test_agent_goes_away_one_disconnected_no_close() -> None:
    life = streaming()
    assert life.agent_gone() == [Stop()]
    assert life.phase is Phase.STOPPING
    assert life.finish("normal") == [
        Announce(Event.DISCONNECTED, HOME),
        DeleteRow(),
        Unregister(),
        FailCommands(),
    ]
    assert life.phase is Phase.STOPPED


def test_planned_stop_closes_the_stream_unavailable() -> None:
    life = streaming()
    assert life.finish("shutdown") == [
        Announce(Event.DISCONNECTED, HOME),
        DeleteRow(),
        Unregister(),
        FailCommands(),
        CloseStream(UNAVAILABLE, STOPPING_DETAILS),
    ]


def test_a_crash_leaves_the_session_to_the_successor() -> None:
    # Owner-crash recovery: the row, the DISCONNECTED and the stream are the successor's.
    life = streaming()
    assert life.finish("crash") == [Unregister(), FailCommands()]


def test_a_crash_while_registering_closes_the_stream() -> None:
    life = OwnerLifecycle(HOME)
    life.begin(stream_open=True, predecessor=None)
    assert life.finish("crash")[-1] == CloseStream(UNAVAILABLE, OWNER_FAILED_DETAILS)


def test_stuck_stream_is_ended_unavailable() -> None:
    life = streaming()
    assert life.stuck() == [Stop()]
    effects = life.finish("normal")
    assert effects[0] == Announce(Event.DISCONNECTED, HOME)
    assert effects[-1] == CloseStream(UNAVAILABLE, STUCK_DETAILS)


@pytest.mark.parametrize("reason", ["cap", "connection_down", "no_connection"])
def test_refused_registration_ends_unavailable_without_notifications(reason: str) -> None:
    life = OwnerLifecycle(HOME)
    life.begin(stream_open=True, predecessor=None)
    assert life.refused(reason) == [Stop()]
    # Nothing was announced and the registry already freed the slot.
    assert life.finish("normal") == [
        FailCommands(),
        CloseStream(UNAVAILABLE, REFUSED_DETAILS[reason]),
    ]


def test_registry_down_while_registering_is_internal() -> None:
    life = OwnerLifecycle(HOME)
    life.begin(stream_open=True, predecessor=None)
    assert life.registry_down() == [Stop()]
    assert life.finish("normal") == [
        FailCommands(),
        CloseStream(INTERNAL, REGISTRY_UNAVAILABLE_DETAILS),
    ]


def test_registry_down_while_streaming_changes_nothing() -> None:
    life = streaming()
    assert life.registry_down() == []
    assert life.phase is Phase.STREAMING


def test_late_answers_after_the_agent_went_away() -> None:
    life = OwnerLifecycle(HOME)
    life.begin(stream_open=True, predecessor=None)
    assert life.agent_gone() == [Stop()]
    # The registry's answer arrives after the decision to stop: no CONNECTED, no row.
    assert life.registered() == []
    assert life.stuck() == []
    assert life.finish("normal") == [Unregister(), FailCommands()]


def test_restart_after_the_session_ended_exits_quietly() -> None:
    life = OwnerLifecycle(HOME)
    assert life.begin(stream_open=False, predecessor=None) == [Stop()]
    assert life.finish("normal") == [FailCommands()]


def test_successor_of_a_killed_owner_whose_agent_left_sends_its_disconnected() -> None:
    # The recovery itself: tests/unit/actors/core/test_owner_recovery.py.
    life = OwnerLifecycle(HOME)
    assert life.begin(stream_open=False, predecessor=Predecessor(OLD, alive=False)) == [Stop()]
    assert life.finish("normal") == [
        ReportRestart("disconnected_only"),
        Announce(Event.DISCONNECTED, OLD),
        DeleteRow(),
        FailCommands(),
    ]


def test_a_live_other_owner_is_left_alone() -> None:
    life = OwnerLifecycle(HOME)
    assert life.begin(stream_open=True, predecessor=Predecessor(OLD, alive=True)) == [Stop()]
    assert life.finish("normal") == [
        FailCommands(),
        CloseStream(UNAVAILABLE, OWNER_CONFLICT_DETAILS),
    ]


def test_illegal_events_raise_named_errors() -> None:
    life = OwnerLifecycle(HOME)
    with pytest.raises(LifecycleError) as raised:
        life.registered()
    assert (raised.value.phase, raised.value.event) == (Phase.STARTING, "registered")
    assert life.phase is Phase.STARTING
    life = streaming()
    with pytest.raises(LifecycleError):
        life.registered()  # a second answer
    with pytest.raises(LifecycleError):
        life.begin(stream_open=True, predecessor=None)
    life.finish("normal")
    with pytest.raises(LifecycleError):
        life.finish("normal")
    with pytest.raises(LifecycleError):
        life.agent_gone()


def test_commands_accepted_only_while_the_stream_is_ours() -> None:
    life = OwnerLifecycle(HOME)
    assert not life.accepts_commands
    life.begin(stream_open=True, predecessor=None)
    assert life.accepts_commands  # the router may find the session before the answer arrives
    life.registered()
    assert life.accepts_commands
    life.agent_gone()
    assert not life.accepts_commands


def test_every_phase_but_stopped_can_finish() -> None:
    assert {p for (p, e) in TRANSITIONS if e == "finish"} == set(Phase) - {Phase.STOPPED}


# --- the state machine ----------------------------------------------------------------------------

EVENTS = ("registered", "refused", "registry_down", "agent_gone", "stuck")


class LifecycleMachine(RuleBasedStateMachine):
    @initialize(
        stream_open=st.booleans(),
        # A dead predecessor (a recovery): tests/unit/actors/core/test_owner_recovery.py.
        predecessor=st.sampled_from(["none", "alive"]),
    )
    def begin(self, stream_open: bool, predecessor: str) -> None:
        self.life = OwnerLifecycle(HOME)
        self.predecessor = predecessor
        pred = None if predecessor == "none" else Predecessor(OLD, alive=predecessor == "alive")
        self.effects: list[object] = []
        self.stopped_by: str | None = None
        self.agent_went_before_finish = not stream_open
        self.finished = False
        # A crash with a row leaves what is owed to the successor.
        self.crashed_with_row = False
        self._take(self.life.begin(stream_open=stream_open, predecessor=pred))

    def _take(self, effects: list[object]) -> None:
        if Stop() in effects:
            assert effects[-1] == Stop(), "Stop is always the last effect"
        self.effects.extend(effects)

    def _feed(self, event: str, *args: str) -> None:
        phase = self.life.phase
        allowed = (phase, event) in TRANSITIONS
        if not allowed:
            with pytest.raises(LifecycleError):
                getattr(self.life, event)(*args)
            assert self.life.phase is phase, "an illegal event changes nothing"
            return
        if event == "agent_gone":
            self.agent_went_before_finish = True
        self._take(getattr(self.life, event)(*args))

    @rule(event=st.sampled_from(EVENTS), reason=st.sampled_from(sorted(REFUSED_DETAILS)))
    def event(self, event: str, reason: str) -> None:
        if event == "refused":
            self._feed(event, reason)
        else:
            self._feed(event)

    @rule(reason=st.sampled_from(["normal", "shutdown", "crash", "killed"]))
    def finish(self, reason: str) -> None:
        was_stopped = self.life.phase is Phase.STOPPED
        row = self.life.row
        self._feed("finish", reason)
        if not was_stopped and row and reason in ("crash", "killed"):
            self.crashed_with_row = True
        if not was_stopped:
            self.finished = True

    # -- invariants --

    def _announced(self, event: Event) -> list[Announce]:
        return [e for e in self.effects if isinstance(e, Announce) and e.event is event]

    @invariant()
    def notifications(self) -> None:
        connected = self._announced(Event.CONNECTED)
        disconnected = self._announced(Event.DISCONNECTED)
        assert len(connected) <= 1 and len(disconnected) <= 1
        assert all(a.stream_home_id == HOME for a in connected)
        if self.predecessor != "none":
            assert not connected  # a successor (for now) never registers
        if self.finished:
            if self.crashed_with_row:
                assert not disconnected
            elif connected:
                assert disconnected == [Announce(Event.DISCONNECTED, HOME)]
            elif self.predecessor == "dead":
                assert disconnected == [Announce(Event.DISCONNECTED, OLD)]
            else:
                assert not disconnected
        elif disconnected:
            raise AssertionError("a DISCONNECTED before finish")

    @invariant()
    def row_while_owed(self) -> None:
        assert self.life.row == (self.life.owed is not None)
        writes = [e for e in self.effects if isinstance(e, WriteRow)]
        deletes = [e for e in self.effects if isinstance(e, DeleteRow)]
        assert len(writes) <= 1 and len(deletes) <= 1
        if writes:
            assert self._announced(Event.CONNECTED), "a row only with its CONNECTED"
        if self.finished and writes and not self.crashed_with_row:
            assert deletes
        if self.predecessor == "alive":
            assert not writes and not deletes

    @invariant()
    def stream_closed_at_most_once(self) -> None:
        closes = [e for e in self.effects if isinstance(e, CloseStream)]
        assert len(closes) <= 1
        if closes:
            assert self.finished and not self.agent_went_before_finish
        elif self.finished:
            assert self.agent_went_before_finish or self.crashed_with_row

    @invariant()
    def registry(self) -> None:
        registers = [e for e in self.effects if isinstance(e, RegisterSession)]
        unregisters = [e for e in self.effects if isinstance(e, Unregister)]
        assert len(registers) <= 1 and len(unregisters) <= 1
        if unregisters:
            assert registers and self.finished
        stops = [e for e in self.effects if isinstance(e, Stop)]
        assert len(stops) <= 1

    @invariant()
    def stopped_after_finish(self) -> None:
        assert (self.life.phase is Phase.STOPPED) == self.finished
        if self.finished:
            assert not self.life.accepts_commands


TestLifecycleMachine = LifecycleMachine.TestCase
TestLifecycleMachine.settings = settings(max_examples=300, stateful_step_count=12, deadline=None)
