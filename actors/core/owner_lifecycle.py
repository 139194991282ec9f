"""The lifecycle of one agent owner (the Erlang gateway's yuzu_gw_agent, a gen_statem there).

Rules of this file: everything that decides what an owner owes the rest of the node at each step
of its life lives here: when it registers, when it announces CONNECTED, when it writes and
deletes its owner-table row, which DISCONNECTED it sends, whether and how it ends the stream.
Nothing here does I/O, reads a clock or knows an address: every method returns effects (small
frozen records) that the actor (actors/agents/owner.py) carries out in the order given.

Theory of operation (seed: "OTP Process Model", "Subscribe Stream Proxy", "Stream Status
Notification", "When an agent's owner process crashes"; SPEC_INDEX OC-01, OC-02):

* STARTING. `begin` decides from what `init` found. An open stream and no earlier owner of the
  session: RegisterSession (OwnerUp to the registry), phase REGISTERING. Otherwise the owner
  ends at once (`Stop`): it is a restart of an owner whose session is already over, and ending
  normally is what keeps a transient restart from looping.
* REGISTERING. `registered` (OwnerRegistered) writes the owner-table row (`live`) and announces
  CONNECTED, phase STREAMING. `refused` (OwnerRefused), `registry_down`, `agent_gone`
  (StreamClosed) and `stuck` (the stream's queue is full) all stop the owner.
* STREAMING. `agent_gone` and `stuck` stop the owner. A late `registry_down` changes nothing: a
  restarted registry starts empty and the agent registers again (ADM-09).
* STOPPING. The owner has decided to end and waits for its own exit; late answers (a
  registration, a refusal, the agent going) are absorbed here without effects.
* `finish` (from `terminate`, for every reason and every phase but STOPPED) is the one place that
  settles what is owed, in this order: the DISCONNECTED (exactly once, only when a CONNECTED went
  out for that stream home id), the owner-table row, the registry, the commands still waiting
  for an answer, and last the stream (closed with a status unless the agent already went away).

Invariants (tests/unit/actors/core/test_owner_lifecycle.py drives arbitrary event sequences against
them):
a row exists exactly while a DISCONNECTED is owed; every CONNECTED is followed by exactly one
DISCONNECTED with the same stream home id; the stream is closed at most once and never after
the agent went away; nothing happens after `finish`.

The owner table is the crash record (seed: "the session's details survive the crash in the owner
table"). A crashed owner (`finish` with a reason other than normal or shutdown) that holds a row
leaves the row, the DISCONNECTED it owes and the stream to its successor; one that holds none
(it crashed while registering) closes the stream as before. A restarted owner that finds a dead
owner's row (`Predecessor`) recovers the session (seed steps 2 to 4; docs/owner-recovery.md):

* it takes the predecessor's stream home id and row (rewritten `recovering`);
* gave up (the 4th restart within 60 s, actors/core/owner_recovery.py): the DISCONNECTED if
  owed, the stream closed, outcome `gave_up`;
* the stream is gone: the DISCONNECTED if owed, outcome `disconnected_only`;
* else SETTLING: the DISCONNECTED, if owed (a `live` row: the predecessor had announced
  CONNECTED; a `recovering` one had already sent it), and wait for it to settle; READOPTING:
  OwnerUp to the registry; PRESENTING: ProxyRegister with the session id; accepted: CONNECTED
  with the same stream home id, row `live`, phase STREAMING, outcome `recovered`. Any failure,
  the agent going, or the recovery deadline ends the owner (outcome `disconnected_only`). A
  registry refusal `superseded` (the agent registered a newer session meanwhile) rewrites the
  row `superseded` first: the session is neither registered nor presented again.

Every restart reports its outcome exactly once (`ReportRestart`: counted, and its one line).

So a row exists while a DISCONNECTED is owed or while a restarted owner recovers the session.
"""

from __future__ import annotations

import enum

import attrs
from grpclib.const import Status

from actors.core.notify_store import Event
from actors.core.owner_recovery import RestartOutcome

__all__ = [
    "OWNER_CONFLICT_DETAILS",
    "OWNER_FAILED_DETAILS",
    "OWNER_GAVE_UP_DETAILS",
    "OWNER_RESTARTED_DETAILS",
    "RECOVERY_FAILED_DETAILS",
    "REFUSED_DETAILS",
    "REGISTRY_UNAVAILABLE_DETAILS",
    "STOPPING_DETAILS",
    "STUCK_DETAILS",
    "TRANSITIONS",
    "Announce",
    "CloseStream",
    "DeleteRow",
    "Effect",
    "FailCommands",
    "LifecycleError",
    "OwnerLifecycle",
    "Phase",
    "Predecessor",
    "PresentSession",
    "RegisterSession",
    "ReportRestart",
    "SettleDisconnected",
    "Stop",
    "Unregister",
    "WriteRow",
]


class Phase(enum.Enum):
    STARTING = "starting"
    REGISTERING = "registering"
    STREAMING = "streaming"
    # Recovery after a crash (see the module doc), in order.
    SETTLING = "settling"
    READOPTING = "readopting"
    PRESENTING = "presenting"
    STOPPING = "stopping"
    STOPPED = "stopped"


# --- what the stream is ended with ---------------------------------------------------------------

# A refusal the gateway makes itself and the agent should simply come back from is UNAVAILABLE; a
# registry that cannot be reached is INTERNAL (gateway/agent/status.py, the seed's rule for
# Register).
REFUSED_DETAILS = {
    "cap": "too many sessions on this connection",
    "connection_down": "connection closed",
    "no_connection": "no connection",
    "superseded": "session superseded by a newer session of the agent",
}
REGISTRY_UNAVAILABLE_DETAILS = "registry_unavailable"
STUCK_DETAILS = "stream stuck: the agent is not reading its commands"
STOPPING_DETAILS = "session owner stopped"
OWNER_FAILED_DETAILS = "session owner failed"
OWNER_RESTARTED_DETAILS = "session owner restarted"
OWNER_CONFLICT_DETAILS = "session already has an owner"
OWNER_GAVE_UP_DETAILS = "session owner restarted too often"
RECOVERY_FAILED_DETAILS = "session owner could not recover the session"
_UNAVAILABLE = int(Status.UNAVAILABLE.value)
_INTERNAL = int(Status.INTERNAL.value)


# --- effects ------------------------------------------------------------------------------------


@attrs.frozen
class RegisterSession:
    """Send OwnerUp to the registry (and watch it until it answers)."""


@attrs.frozen
class WriteRow:
    """Write this owner's row in the owner table with `state`."""

    state: str = "live"


@attrs.frozen
class Announce:
    """Tell upstream a stream-status notification for `stream_home_id`."""

    event: Event
    stream_home_id: str


@attrs.frozen
class Stop:
    """End the owner with reason `normal` (always the last effect of a list)."""


@attrs.frozen
class DeleteRow:
    """Delete the session's row, if it is this owner's or its dead predecessor's."""


@attrs.frozen
class Unregister:
    """Tell the registry the session is over."""


@attrs.frozen
class FailCommands:
    """Tell every command still waiting for an answer that the agent is gone."""


@attrs.frozen
class CloseStream:
    """End the Subscribe stream with this gRPC status and details."""

    status: int
    details: str


@attrs.frozen
class SettleDisconnected:
    """Tell upstream the DISCONNECTED for `stream_home_id` (a dead predecessor's) and be told
    when it has settled (delivered, refused or lost); its earlier resends end."""

    stream_home_id: str


@attrs.frozen
class PresentSession:
    """Present the session to the server again: ProxyRegister of the stored request with the
    session id (the upstream actor's call, as a registration replay does)."""


@attrs.frozen
class ReportRestart:
    """This restart's outcome, decided: count it (yuzu_gw_agent_owner_restarts_total) and log
    its one line (actors/core/owner_recovery.py)."""

    outcome: RestartOutcome


Effect = (
    RegisterSession
    | WriteRow
    | Announce
    | Stop
    | DeleteRow
    | Unregister
    | FailCommands
    | CloseStream
    | SettleDisconnected
    | PresentSession
    | ReportRestart
)


# --- what `init` found --------------------------------------------------------------------------


@attrs.frozen
class Predecessor:
    """The session's row in the owner table, written by another owner. `alive`: that owner still
    runs (two owners for one session: this one must not touch it). `state`: the row's (`live`:
    its DISCONNECTED is owed; `recovering`: a restarted owner already sent it). `give_up`: this
    restart is one too many (actors/core/owner_recovery.py)."""

    stream_home_id: str
    alive: bool
    state: str = "live"
    give_up: bool = False


class LifecycleError(Exception):
    """An event the phase does not allow: a defect of the caller. The owner lets it crash the
    actor, whose `terminate` then settles what is owed (OTP: let it crash)."""

    def __init__(self, phase: Phase, event: str) -> None:
        super().__init__(f"{event} in phase {phase.value}")
        self.phase = phase
        self.event = event


# --- the transition table -----------------------------------------------------------------------

_P = Phase
# (phase, event) -> next phase, for every event but `begin` (whose target depends on what init
# found, see `OwnerLifecycle.begin`). A pair that is not here raises LifecycleError. STOPPING
# absorbs the answers and endings that were already under way when the owner decided to stop.
_RECOVERING = (_P.SETTLING, _P.READOPTING, _P.PRESENTING)
TRANSITIONS: dict[tuple[Phase, str], Phase] = {
    (_P.REGISTERING, "registered"): _P.STREAMING,
    (_P.SETTLING, "settled"): _P.READOPTING,
    (_P.READOPTING, "registered"): _P.PRESENTING,
    (_P.READOPTING, "refused"): _P.STOPPING,
    (_P.READOPTING, "registry_down"): _P.STOPPING,
    (_P.SETTLING, "registry_down"): _P.SETTLING,
    (_P.PRESENTING, "registry_down"): _P.PRESENTING,
    (_P.PRESENTING, "presented"): _P.STREAMING,
    (_P.PRESENTING, "not_presented"): _P.STOPPING,
    **{(phase, "agent_gone"): _P.STOPPING for phase in _RECOVERING},
    **{(phase, "stuck"): _P.STOPPING for phase in _RECOVERING},
    **{(phase, "timed_out"): _P.STOPPING for phase in _RECOVERING},
    (_P.STREAMING, "timed_out"): _P.STREAMING,
    (_P.STOPPING, "timed_out"): _P.STOPPING,
    (_P.STOPPING, "settled"): _P.STOPPING,
    (_P.STOPPING, "presented"): _P.STOPPING,
    (_P.STOPPING, "not_presented"): _P.STOPPING,
    (_P.REGISTERING, "refused"): _P.STOPPING,
    (_P.REGISTERING, "registry_down"): _P.STOPPING,
    (_P.REGISTERING, "agent_gone"): _P.STOPPING,
    (_P.REGISTERING, "stuck"): _P.STOPPING,
    (_P.STREAMING, "agent_gone"): _P.STOPPING,
    (_P.STREAMING, "stuck"): _P.STOPPING,
    (_P.STREAMING, "registry_down"): _P.STREAMING,
    (_P.STOPPING, "registered"): _P.STOPPING,
    (_P.STOPPING, "refused"): _P.STOPPING,
    (_P.STOPPING, "registry_down"): _P.STOPPING,
    (_P.STOPPING, "agent_gone"): _P.STOPPING,
    (_P.STOPPING, "stuck"): _P.STOPPING,
    **{(phase, "finish"): _P.STOPPED for phase in Phase if phase is not _P.STOPPED},
}


@attrs.define
class OwnerLifecycle:
    """One owner's lifecycle. `stream_home_id` is the owner's (minted by the actor: randomness is
    I/O). The fields record what has been done, so `finish` knows what is owed."""

    stream_home_id: str
    phase: Phase = Phase.STARTING
    stream_open: bool = False
    # A restart of a crashed owner (it found a dead predecessor's row), and what it came to.
    restarted: bool = False
    outcome: RestartOutcome | None = None
    # The stream home id whose DISCONNECTED is owed (this owner's, or a dead predecessor's).
    owed: str | None = None
    # A row in the owner table is this owner's to delete (its own, or a dead predecessor's); a
    # crashed owner leaves it to its successor.
    row: bool = False
    registry_told: bool = False
    # What to end the stream with, decided by the event that stopped the owner.
    end: CloseStream | None = None

    @property
    def accepts_commands(self) -> bool:
        """Commands may be queued once the stream is ours and until the owner decides to stop
        (the router can find the session before the registry's answer reaches the owner)."""
        return self.phase in (
            Phase.REGISTERING,
            Phase.STREAMING,
            Phase.READOPTING,
            Phase.PRESENTING,
        )

    def _step(self, event: str) -> Phase:
        target = TRANSITIONS.get((self.phase, event))
        if target is None:
            raise LifecycleError(self.phase, event)
        previous, self.phase = self.phase, target
        return previous

    def _stop(self, end: CloseStream | None) -> list[Effect]:
        if self.end is None:
            self.end = end
        return [Stop()]

    # -- events ----------------------------------------------------------------------------------

    def begin(self, *, stream_open: bool, predecessor: Predecessor | None) -> list[Effect]:
        if self.phase is not Phase.STARTING:
            raise LifecycleError(self.phase, "begin")
        self.stream_open = stream_open
        if predecessor is not None and predecessor.alive:
            # Another owner holds this session: leave its row, its notifications and its
            # registration alone; only this owner's claim on the stream ends.
            self.phase = Phase.STOPPING
            return self._stop(CloseStream(_UNAVAILABLE, OWNER_CONFLICT_DETAILS))
        if predecessor is not None:
            return self._recover(predecessor)
        if not stream_open:
            # A restart after the session ended (the crashed owner's terminate closed the stream):
            # nothing is owed, and ending `normal` is what stops the transient restarts.
            self.phase = Phase.STOPPING
            return self._stop(None)
        self.phase = Phase.REGISTERING
        self.registry_told = True
        return [RegisterSession()]

    def _recover(self, predecessor: Predecessor) -> list[Effect]:
        """A dead predecessor's session: it is this owner's now (its row, its stream home id,
        and its DISCONNECTED if it had announced CONNECTED: exactly one process sends it)."""
        self.restarted, self.row = True, True
        self.stream_home_id = predecessor.stream_home_id
        owed = predecessor.stream_home_id if predecessor.state == "live" else None
        if predecessor.give_up or not self.stream_open:
            self.owed = owed
            self.phase = Phase.STOPPING
            if not predecessor.give_up:
                return self._stop(None)  # the agent already went: finish settles
            self.outcome = "gave_up"
            end = CloseStream(_UNAVAILABLE, OWNER_GAVE_UP_DETAILS)
            return [ReportRestart("gave_up"), *self._stop(end)]
        effects: list[Effect] = [WriteRow("recovering")]
        if owed is None:
            # The DISCONNECTED went with an earlier restart: nothing to wait for.
            self.phase = Phase.SETTLING
            return effects + self.settled()
        self.phase = Phase.SETTLING
        return [*effects, SettleDisconnected(owed)]

    def settled(self) -> list[Effect]:
        """The predecessor's DISCONNECTED settled (delivered, refused or lost): register the
        session again."""
        if self._step("settled") is not Phase.SETTLING:
            return []
        self.registry_told = True
        return [RegisterSession()]

    def registered(self) -> list[Effect]:
        previous = self._step("registered")
        if previous is Phase.READOPTING:
            return [PresentSession()]
        if previous is not Phase.REGISTERING:
            return []
        # The row and the CONNECTED go together: a row exists while a DISCONNECTED is owed.
        self.owed, self.row = self.stream_home_id, True
        return [WriteRow("live"), Announce(Event.CONNECTED, self.stream_home_id)]

    def presented(self) -> list[Effect]:
        """The server adopted the presented session: CONNECTED with the same stream home id."""
        if self._step("presented") is not Phase.PRESENTING:
            return []
        self.owed, self.outcome = self.stream_home_id, "recovered"
        return [
            WriteRow("live"),
            Announce(Event.CONNECTED, self.stream_home_id),
            ReportRestart("recovered"),
        ]

    def not_presented(self, details: str) -> list[Effect]:
        """The server refused the presented session, or could not be asked: the agent
        registers again (`details` ends its stream)."""
        if self._step("not_presented") is not Phase.PRESENTING:
            return []
        return self._stop(CloseStream(_UNAVAILABLE, details))

    def timed_out(self) -> list[Effect]:
        """The recovery deadline passed before the session was recovered."""
        if self._step("timed_out") not in _RECOVERING:
            return []
        return self._stop(CloseStream(_UNAVAILABLE, RECOVERY_FAILED_DETAILS))

    def refused(self, reason: str) -> list[Effect]:
        if self._step("refused") not in (Phase.REGISTERING, Phase.READOPTING):
            return []
        # The registry has already freed the slot: nothing to unregister.
        self.registry_told = False
        details = REFUSED_DETAILS.get(reason, reason)
        stop = self._stop(CloseStream(_UNAVAILABLE, details))
        if reason == "superseded" and self.row:
            # The agent has a newer session: the row says so until it goes, so no heartbeat of
            # this one is admitted again (seed: heartbeat admission skips superseded rows).
            return [WriteRow("superseded"), *stop]
        return stop

    def registry_down(self) -> list[Effect]:
        if self._step("registry_down") not in (Phase.REGISTERING, Phase.READOPTING):
            return []
        self.registry_told = False
        return self._stop(CloseStream(_INTERNAL, REGISTRY_UNAVAILABLE_DETAILS))

    def agent_gone(self) -> list[Effect]:
        previous = self._step("agent_gone")
        self.stream_open = False
        if previous is Phase.STOPPING:
            return []
        return self._stop(None)

    def stuck(self) -> list[Effect]:
        if self._step("stuck") is Phase.STOPPING:
            return []
        return self._stop(CloseStream(_UNAVAILABLE, STUCK_DETAILS))

    def finish(self, reason: str) -> list[Effect]:
        """Settle what is owed; `reason` is the exit reason's kind (`normal`, `shutdown`, `crash`,
        ...). Called once, from `terminate`."""
        self._step("finish")
        effects: list[Effect] = []
        if reason not in ("normal", "shutdown") and self.row:
            # A crash: the successor agent_sup starts finds the row, sends what is owed and
            # recovers the stream, so none of it is settled here.
            self.row, self.owed, self.stream_open = False, None, False
            if self.registry_told:
                effects.append(Unregister())
                self.registry_told = False
            return [*effects, FailCommands()]
        if self.restarted and self.outcome is None:
            self.outcome = "disconnected_only"
            effects.append(ReportRestart("disconnected_only"))
        if self.owed is not None:
            effects.append(Announce(Event.DISCONNECTED, self.owed))
            self.owed = None
        if self.row:
            effects.append(DeleteRow())
            self.row = False
        if self.registry_told:
            effects.append(Unregister())
            self.registry_told = False
        effects.append(FailCommands())
        if self.stream_open:
            effects.append(self.end or _end_for(reason))
            self.stream_open = False
        return effects


def _end_for(reason: str) -> CloseStream:
    """The stream's end when nothing the owner handled decided it: a planned stop (issue 7 adds
    the retry hint), or a fault of the owner itself (the agent reconnects)."""
    if reason == "shutdown":
        return CloseStream(_UNAVAILABLE, STOPPING_DETAILS)
    return CloseStream(_UNAVAILABLE, OWNER_FAILED_DETAILS)
