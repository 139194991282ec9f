"""`AgentOwner`: the actor that holds one agent session (the Erlang gateway's yuzu_gw_agent).

One per Subscribe stream, started by the stream process under `agent_sup` (actors/agents/sup.py,
simple_one_for_one, transient) with `OwnerArgs`. The lifecycle (what is owed when) is the pure
core actors/core/owner_lifecycle.py; this module turns messages into its events and carries out
its effects:

    init            mint the stream home id (32 hex), look for a predecessor's row, `begin`
                    (a dead predecessor's: recovery, docs/owner-recovery.md); ended at once
                    (the stream already ended, another owner holds the session): ReleaseTaken
    RegisterSession OwnerUp to the registry, which is watched until it answers
    WriteRow        this owner's row in the owner table (actors/agents/api.py)
    Announce        Notify posted into the notification hold for `upstream` (CONNECTED also
                    logs "Agent <id> connected from <addr>")
    Stop            end `normal` (a message to itself while still in `init`)
    SettleDisconnected / PresentSession   posted (the first) and sent (the second) to
                    `upstream` (actors/upstream/api.py) while recovering;
                    DisconnectSettled / SessionPresented come back
    terminate       `finish`: exactly one DISCONNECTED, the row deleted, Unregister, waiting
                    commands failed, the stream closed unless the agent went away (a crash
                    leaves the row, the DISCONNECTED and the stream to the restarted owner);
                    a step that faults does not stop the others or the DISCONNECTED

Commands: `DeliverCommand` puts the request in the stream's bounded queue; a full queue means the
agent is not reading, so the stream is ended as stuck. Answers go to the command's `reply_to` as
`CommandAnswer` (actors/agents/api.py); an unsolicited `__guard__` frame goes upstream as
`ForwardGuardian` with this owner's agent id, whatever the frame says.

The owner does not trap exits: a planned stop (`ActorExitRequest` from `agent_sup`) ends it with
`shutdown` right after the handler, and `terminate` does the same settling as for any end, with
nothing to wait for (every effect is a send or a queue put).

`format_status` shows counts and the phase only: never the session id, the agent id, the peer,
the Register request it keeps (for the replay of a later issue) or command parameters.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any, cast

import attrs
from grpclib.const import Status
from thespian.actors import WakeupMessage

from actors.agents.api import (
    OWNERS_TABLE,
    AgentFrame,
    CommandAnswer,
    CommandFailed,
    DeliverCommand,
    FailReason,
    ForgetCommand,
    OwnerArgs,
    OwnerRow,
    OwnerState,
    StreamClosed,
    StreamEnd,
    owner_row,
)
from actors.agents.metrics import owner_metrics
from actors.agents.watch import publish
from actors.core.notify_store import Event, log_text, sanitise_peer_addr
from actors.core.owner_commands import PendingCommands, is_guardian_event
from actors.core.owner_lifecycle import (
    Announce,
    CloseStream,
    DeleteRow,
    Effect,
    FailCommands,
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
    GAVE_UP_LOG,
    NOT_RECOVERED_LOG,
    RECOVERED_LOG,
    RECOVERY_DEADLINE_S,
    RestartOutcome,
    record_restart,
)
from actors.core.warn_limit import WarnLimiter
from actors.registry.api import (
    REGISTRY_NAME,
    OwnerRefused,
    OwnerRegistered,
    OwnerUp,
    ReleaseTaken,
)
from actors.registry.api import Unregister as UnregisterSession
from actors.upstream.api import (
    FAILED_DETAILS,
    UPSTREAM_NAME,
    DisconnectSettled,
    EndSession,
    ForwardGuardian,
    Notify,
    SessionPresented,
    post,
)
from actors.upstream.api import PresentSession as PresentRequest
from actors.upstream.api import SettleDisconnected as SettleRequest
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.address import Address
from supervisors.messages import ActorDown
from supervisors.process import Process
from supervisors.reason import NORMAL, ExitReason

__all__ = ["CONNECTED_LOG", "AgentOwner"]

log = logging.getLogger("yuzu_gw.agent")

# L05, as the seed quotes it; both values are cut to 128 bytes with controls as "?" (log_text).
CONNECTED_LOG = "Agent %s connected from %s"
_NOT_SENT_LOG = "Stream-status notification (%s) not sent: there is no notification hold%s"
# One line a second at most: a restarting upstream while thousands of agents come and go must
# not flood the log (the count of held-back lines follows).
_not_sent = WarnLimiter(1.0)
_RUNNING = agent_pb2.CommandResponse.Status.RUNNING
# A session the server refused on a replay: the agent comes back through Register.
_UNAVAILABLE = int(Status.UNAVAILABLE.value)


@attrs.frozen
class _EndSession:
    """Sent to itself when `init` decides to end: an actor cannot exit before its init returns."""


@attrs.frozen
class _RecoveryDeadline:
    """The payload of a restarted owner's one wakeup (RECOVERY_DEADLINE_S)."""


class AgentOwner(Process):
    def init(self, args: OwnerArgs) -> None:
        self.args = args
        self.stream_home_id = secrets.token_hex(16)
        self.life = OwnerLifecycle(self.stream_home_id)
        self.commands = PendingCommands()
        self._registry: Address | None = None
        self._registry_monitor: int | None = None
        self._predecessor: Address | None = None
        # A restarted owner's recovery deadline, cancelled once the session is recovered.
        self._deadline: asyncio.TimerHandle | None = None
        # What every notification and the registry are told; the arguments never change.
        self._peer = sanitise_peer_addr(args.peer)
        # The times of this session's owner restarts within 60 s (kept in its row).
        self._restarts: tuple[float, ...] = ()
        # When the registry first registered the session (kept in its row): None until then,
        # unless this owner is a restart, which registers it again under its predecessor's.
        self._since: float | None = None
        self._in_init = True
        # The last notification sent upstream (terminate's fault path must not send it twice).
        self._told: Notify | None = None
        self.delivered = 0
        self.answers = 0
        self.unmatched = 0
        self.guardian = 0
        effects = self.life.begin(
            stream_open=not args.stream.ended, predecessor=self._find_predecessor()
        )
        # A restarted owner carries on its dead predecessor's stream home id.
        self.stream_home_id = self.life.stream_home_id
        if self.life.restarted:
            self._deadline = self.wakeupAfter(RECOVERY_DEADLINE_S, _RecoveryDeadline())
            # The stream process waits for this owner; told now, it follows it at once.
            args.stream.adopt(self.myAddress)
        self._apply(effects)
        if not self.life.restarted and not self.life.registry_told:
            self._hand_back_take()
        self._in_init = False

    def _find_predecessor(self) -> Predecessor | None:
        row = owner_row(self.runtime, self.args.session_id)
        if row is None:
            return None
        if self.runtime.is_alive(row.owner):
            return Predecessor(row.stream_home_id, alive=True)
        # Its row becomes this owner's to delete; a live owner's row is never touched.
        self._predecessor = row.owner
        self._since = row.since
        self._restarts, give_up = record_restart(row.restarts, self.now())
        return Predecessor(row.stream_home_id, alive=False, state=row.state, give_up=give_up)

    # -- messages ------------------------------------------------------------------------------

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        match msg:
            case DeliverCommand(command=command, reply_to=reply_to, deadline=deadline):
                self._deliver(command, reply_to, deadline)
            case AgentFrame(response=response):
                self._frame(response)
            case ForgetCommand(command_id=command_id):
                self.commands.forget(command_id)
            case StreamClosed():
                self._apply(self.life.agent_gone())
            case OwnerRegistered(session_id=session_id, since=since) if (
                session_id == self.args.session_id
            ):
                self._since = since
                self._forget_registry()
                self._apply(self.life.registered())
            case OwnerRefused(session_id=session_id, reason=reason) if (
                session_id == self.args.session_id
            ):
                self._forget_registry()
                self._apply(self.life.refused(reason))
            case ActorDown(address=address) if address == self._registry:
                self._registry_monitor = None
                self._apply(self.life.registry_down())
            case EndSession(session_id=session_id, details=details) if (
                session_id == self.args.session_id
            ):
                self._end_session(details)
            case _EndSession():
                self.exit(NORMAL)
            case DisconnectSettled(session_id=session_id) if session_id == self.args.session_id:
                self._apply(self.life.settled())
            case SessionPresented(session_id=session_id, accepted=True) if (
                session_id == self.args.session_id
            ):
                self._apply(self.life.presented())
                self._end_deadline()
            case SessionPresented(session_id=session_id, details=details) if (
                session_id == self.args.session_id
            ):
                self._apply(self.life.not_presented(details))
            case WakeupMessage(payload=_RecoveryDeadline()):
                self._apply(self.life.timed_out())
            case _:
                pass

    def terminate(self, reason: ExitReason) -> None:
        """Settle every effect even when one faults, and re-raise the first fault (the runtime
        reports it): nothing restarts an owner that faults here during a planned stop
        (agent_sup is stopping), so a defect in one step must cost neither the server its
        DISCONNECTED nor the agent its stream's end."""
        fault: Exception | None = None
        for effect in self.life.finish(reason.kind):
            try:
                self._apply([effect])
            except Exception as exc:
                fault = fault or exc
                if isinstance(effect, Announce) and not self._announced(effect):
                    self._tell_upstream(
                        effect.event, self._notice(effect.event, effect.stream_home_id)
                    )
        if fault is not None:
            raise fault

    def format_status(self) -> Mapping[str, Any]:
        return {
            "phase": self.life.phase.value,
            "pending_commands": len(self.commands),
            "queued": self.args.stream.qsize(),
            "delivered": self.delivered,
            "answers": self.answers,
            "unmatched_frames": self.unmatched,
            "guardian_forwarded": self.guardian,
        }

    # -- commands ------------------------------------------------------------------------------

    def _deliver(
        self, command: agent_pb2.CommandRequest, reply_to: Any, deadline: float | None
    ) -> None:
        command_id = command.command_id
        tracked = reply_to is not None and bool(command_id)
        if not self.life.accepts_commands:
            self._fail(reply_to, command_id, "agent_disconnected")
            return
        now = self.now()
        if command_id and self.commands.in_flight(command_id, now):
            # Issue 6: the agent already runs this id; writing it again would run it twice.
            self._fail(reply_to, command_id, "duplicate_command_id")
            return
        if tracked and not self.commands.has_room(now):
            self._fail(reply_to, command_id, "too_many_pending")
            return
        if not self.args.stream.deliver(command):
            # Only a full queue refuses while the owner runs (it alone closes the stream): the
            # agent is not reading, and holding more for it would only grow memory.
            self._fail(reply_to, command_id, "stream_stuck")
            self._apply(self.life.stuck())
            return
        self.delivered += 1
        if tracked:
            self.commands.expect(command_id, reply_to, deadline)

    def _frame(self, response: agent_pb2.CommandResponse) -> None:
        if is_guardian_event(response.plugin, response.command_id):
            upstream = self.runtime.whereis(UPSTREAM_NAME)
            if upstream is not None:
                # The agent id is the one this stream registered with, never the frame's.
                self.send(upstream, ForwardGuardian(self.args.agent_id, response))
                self.guardian += 1
            return
        reply_to = self.commands.answer(response.command_id, response.status != _RUNNING)
        if reply_to is None:
            self.unmatched += 1
            return
        self.answers += 1
        self.send(reply_to, CommandAnswer(self.args.agent_id, response))

    def _fail(self, reply_to: Any, command_id: str, reason: FailReason) -> None:
        if reply_to is not None and command_id:
            self.send(reply_to, CommandFailed(self.args.agent_id, command_id, reason))

    # -- effects -------------------------------------------------------------------------------

    def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            match effect:
                case RegisterSession():
                    self._register()
                case WriteRow(state=state):
                    self._write_row(state)
                case Announce(event=event, stream_home_id=home):
                    self._announce(event, home)
                case Stop():
                    if self._in_init:
                        self.send(self.myAddress, _EndSession())
                    else:
                        self.exit(NORMAL)
                case DeleteRow():
                    self._delete_row()
                case Unregister():
                    registry = self.runtime.whereis(REGISTRY_NAME)
                    if registry is not None:
                        self.send(registry, UnregisterSession(self.args.session_id, self.myAddress))
                case FailCommands():
                    for command_id, reply_to in self.commands.drain():
                        self._fail(reply_to, command_id, "agent_disconnected")
                case CloseStream(status=status, details=details):
                    # When to come back is the stream process's word: its connection's GOAWAY's.
                    self.args.stream.close(StreamEnd(status, details))
                case SettleDisconnected(stream_home_id=home):
                    self._settle(home)
                case PresentSession():
                    self._present()
                case ReportRestart(outcome=outcome):
                    metrics = owner_metrics(self.runtime)
                    if metrics is not None:
                        metrics.restarted(outcome)
                    self._log_outcome(outcome)

    def _log_outcome(self, outcome: RestartOutcome) -> None:
        """The restart's one line naming its outcome (docs/owner-recovery.md)."""
        if outcome == "gave_up":
            log.warning(GAVE_UP_LOG, log_text(self.args.agent_id))
        elif outcome == "disconnected_only":
            log.warning(NOT_RECOVERED_LOG, log_text(self.args.agent_id))
        elif log.isEnabledFor(logging.INFO):
            # log_text scans every character: not for a line nobody keeps.
            log.info(RECOVERED_LOG, log_text(self.args.agent_id))

    def _settle(self, stream_home_id: str) -> None:
        """The dead predecessor's DISCONNECTED, answered `DisconnectSettled` once settled."""
        notify = self._notification(Event.DISCONNECTED, stream_home_id)
        if not post(self.runtime, SettleRequest(notify), self.myAddress):
            self._not_sent(Event.DISCONNECTED)
            self._apply(self.life.settled())  # lost: nothing to wait for

    def _present(self) -> None:
        request = self.args.register
        upstream = self.runtime.whereis(UPSTREAM_NAME)
        if upstream is None or not isinstance(request, agent_pb2.RegisterRequest):
            self._apply(self.life.not_presented(FAILED_DETAILS))
            return
        self.send(upstream, PresentRequest(self.args.session_id, self.args.agent_id, request))

    def _end_deadline(self) -> None:
        """Recovered (streaming again): the deadline could only end a recovery, so it is
        cancelled rather than left to arrive as one more message 10 s later, for each of the
        hundreds of owners a mass kill restarts."""
        if self._deadline is not None and self.life.phase is Phase.STREAMING:
            self.cancel_wakeup(self._deadline)
            self._deadline = None

    def _register(self) -> None:
        registry = self.runtime.whereis(REGISTRY_NAME)
        if registry is None:
            self._apply(self.life.registry_down())
            return
        # Watched until it answers: a registry that dies first would leave the owner waiting for
        # ever. After the answer the registry watches the owner, not the other way round.
        self._registry = registry
        self._registry_monitor = self.monitor(registry)
        args = self.args
        self.send(
            registry,
            OwnerUp(
                session_id=args.session_id,
                agent_id=args.agent_id,
                owner=self.myAddress,
                conn_key=args.conn_key,
                stream_home_id=self.stream_home_id,
                peer=self._peer,
                plugins=args.plugins,
                connected_at=time.time(),
                info=getattr(args.register, "info", None),
                since=self._since,
            ),
        )

    def _hand_back_take(self) -> None:
        """This owner ends at `init` without registering the session (the agent left while it
        started, or another owner holds the session): no OwnerUp will move the slot the
        Subscribe took, so it and the session's heartbeat binding go back now, not at the
        take's expiry. A restarted owner holds no take: its predecessor's slot went live."""
        registry = self.runtime.whereis(REGISTRY_NAME)
        if registry is not None:
            self.send(registry, ReleaseTaken(self.args.session_id))

    def _forget_registry(self) -> None:
        if self._registry_monitor is not None:
            self.demonitor(self._registry_monitor)
            self._registry_monitor = None
        self._registry = None

    def _write_row(self, state: str) -> None:
        table = self.runtime.table(OWNERS_TABLE)
        if table is None:
            # No root supervisor (a bare test tree): admission and recovery lose their record.
            return
        args = self.args
        table.insert(
            args.session_id,
            OwnerRow(
                owner=self.myAddress,
                session_id=args.session_id,
                agent_id=args.agent_id,
                conn_key=args.conn_key,
                stream_home_id=self.stream_home_id,
                state=cast(OwnerState, state),
                register=args.register,
                args=args,
                restarts=self._restarts,
                since=self._since or 0.0,
            ),
        )

    def _end_session(self, details: str) -> None:
        """The server refused the session on a registration replay: end it normally (the
        lifecycle sends its one DISCONNECTED) after closing the stream UNAVAILABLE with
        `details`, so the agent registers afresh. Only a streaming owner holds a replayed
        session; one that is still registering or already ending is left alone."""
        if self.life.phase is not Phase.STREAMING:
            return
        self.args.stream.close(StreamEnd(_UNAVAILABLE, details))
        self.exit(NORMAL)

    def _delete_row(self) -> None:
        row = owner_row(self.runtime, self.args.session_id)
        table = self.runtime.table(OWNERS_TABLE)
        # Only this owner's row or its dead predecessor's: a newer owner's row is not ours.
        ours = (self.myAddress, self._predecessor)
        if row is not None and table is not None and row.owner in ours:
            table.delete(self.args.session_id)

    def _announce(self, event: Event, stream_home_id: str) -> None:
        args = self.args
        notify = self._notification(event, stream_home_id)
        if event is Event.CONNECTED and log.isEnabledFor(logging.INFO):
            # log_text scans every character: not for a line nobody keeps.
            log.info(CONNECTED_LOG, log_text(args.agent_id), log_text(notify.peer_addr))
        self._tell_upstream(event, notify)

    def _tell_upstream(self, event: Event, notify: Notify) -> None:
        # Posted into the notification hold, which outlives the upstream actor: a restart of
        # it does not lose the notification (actors/upstream/api.py).
        if not post(self.runtime, notify, self.myAddress):
            self._not_sent(event)
            return
        self._told = notify

    def _announced(self, announce: Announce) -> bool:
        """Whether this notification already went (a fault after its send)."""
        return self._told == self._notice(announce.event, announce.stream_home_id)

    def _notification(self, event: Event, stream_home_id: str) -> Notify:
        """The notification, published to WatchEvents first (actors/agents/watch.py: it sees
        what the server is told; never waits)."""
        args = self.args
        life = self.life
        restart = life.restarted and life.outcome != "recovered"
        reason = "owner_restarted" if restart else "stream_closed"
        publish(self.runtime, args.agent_id, args.session_id, event, reason)
        return self._notice(event, stream_home_id)

    def _notice(self, event: Event, stream_home_id: str) -> Notify:
        args = self.args
        return Notify(args.agent_id, args.session_id, stream_home_id, event, self._peer)

    def _not_sent(self, event: Event) -> None:
        # No notification hold (a node tree without one): nothing would ever send it.
        suffix = _not_sent.admit(event, self.now())
        if suffix is not None:
            log.warning(_NOT_SENT_LOG, event.value, suffix)
