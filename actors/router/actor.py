"""`router`: the command router (the Erlang gateway's yuzu_gw_router; seed: "Subscribe Stream
Proxy").

A permanent child of `gateway_sup`, after `agent_sup`. For each SendCommand the handler tells it
`RouteCommand` (actors/router/api.py); the router

1. resolves the timeout (actors/core/command_timeout.py: the request's own clamped to 1..3600,
   else `default_command_timeout_s`, read now);
2. resolves the targets: the request's agent ids (each once), or every agent this node holds
   when there are none, each through the registry's `agents_by_id` table (two lookups, no
   message). A target not held here, or whose owner is gone, is answered FAILURE
   `not_connected`; a target that this router already has the same command id in flight to is
   answered FAILURE `duplicate_command_id` and not sent again. With peers connected (the
   cluster, gateway/cluster/actor.py), a target not held here is handed to the `cluster` actor
   instead, which asks the peers and answers for it as an owner would (docs/cluster.md); a
   peer's forwarded command (`LocalRouteCommand`) is never forwarded again;
   During a planned stop (`StopRouting`) a target held here is refused FAILURE
   `agent_disconnected` (its session is about to end; nothing is delivered), and only those:
   a target not held here is still asked of the cluster, and for a peer's forwarded command it
   is "not held here", so the forwarding node asks the next holder, never takes the refusal as
   the answer for another node's agent;
3. sends each held target's owner one `DeliverCommand` (the same message, the command untouched)
   with itself as `reply_to` and the command's deadline;
4. streams every `CommandAnswer` into the handler's sink as it arrives (RUNNING frames
   included), and turns every `CommandFailed` into that target's FAILURE answer
   (`agent_disconnected`, `stream_stuck`, ...);
5. ends the command (`sink.finish`: the stream ends OK) when every target has its terminal
   answer, or at the deadline, when every target that still owes one gets TIMEOUT and its owner
   `ForgetCommand`.

Which target still owes what is the pure core actors/core/command_fanout.py. Answers are matched
to a command by (agent id, command id): an owner answers with its own agent id, and the router
never has one command id in flight twice to one agent.

An owner that is killed (not one that ends: that one fails its commands `agent_disconnected`)
sends nothing, and its targets get TIMEOUT at the deadline, as the seed says ("What is lost").

The router never waits: the sink's `put` and `end` return at once (the sink, not the router,
bounds what a slow operator stream holds: gateway/mgmt/command.py). The handler watches the
router; a router that ends with commands in flight leaves them to their handlers, which end
their streams UNAVAILABLE, and its `terminate` tells the owners to forget them.

Never logged or shown: the command (its parameters may be secrets), agent ids, session ids.
`format_status` shows counts only, and a crash report names the exception's class and frame
only (supervisors/reason.py), so neither can carry a command's parameters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

import attrs
from thespian.actors import WakeupMessage

from actors.agents.api import CommandAnswer, CommandFailed, DeliverCommand, ForgetCommand
from actors.cluster.api import ForwardCommand, cluster_route
from actors.core.command_fanout import (
    CommandFanout,
    Done,
    Effect,
    Forget,
    Forward,
    Settle,
)
from actors.core.command_timeout import FALLBACK_TIMEOUT_S, CommandTimeouts
from actors.node.api import RoutingStopped, StopRouting
from actors.registry.api import agent_session, held_agent_ids
from actors.router.api import (
    NOT_CONNECTED,
    AbandonCommand,
    CommandSink,
    LocalRouteCommand,
    ResponseKind,
    RouteCommand,
)
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2
from supervisors.address import Address
from supervisors.process import Process
from supervisors.reason import ExitReason

__all__ = ["Router", "RouterArgs"]

log = logging.getLogger("yuzu_gw.router")

_TIMEOUT = "command_timeout"
_STOP_GRACE = "stop_grace"
_Status = agent_pb2.CommandResponse.Status
_RUNNING = _Status.RUNNING


def _fallback() -> object:
    return FALLBACK_TIMEOUT_S


@attrs.frozen
class RouterArgs:
    """Built by gateway/node/children/router.py."""

    # Reads default_command_timeout_s as it is now (the router calls it per command).
    read_default_timeout: Callable[[], object] = _fallback


@attrs.define(eq=False)
class _Flight:
    """One command in flight: its fan-out, the sink of its operator stream, its timer."""

    seq: int
    command_id: str
    sink: CommandSink
    fanout: CommandFanout
    timer: asyncio.TimerHandle | None = None


class Router(Process):
    def init(self, args: RouterArgs | None) -> None:
        args = args if args is not None else RouterArgs()
        self.timeouts = CommandTimeouts(args.read_default_timeout)
        self._seq = 0
        self._flights: dict[int, _Flight] = {}
        # The handler's sink -> its flight (for AbandonCommand).
        self._by_sink: dict[int, _Flight] = {}
        # (agent id, command id) -> the flight that target's answers belong to.
        self._routes: dict[tuple[str, str], _Flight] = {}
        self.routed = 0
        self.completed = 0
        self.timed_out = 0
        self.abandoned = 0
        self.answers = 0
        self.late_answers = 0
        # A planned stop (StopRouting): who waits for the commands in flight to end, and when
        # the grace ends.
        self._stopping: list[Address] | None = None
        self._stop_timer: asyncio.TimerHandle | None = None

    # -- messages ------------------------------------------------------------------------------

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        match msg:
            case CommandAnswer(agent_id=agent_id, response=response):
                self._answer(agent_id, response)
            case CommandFailed(agent_id=agent_id, command_id=command_id, reason=reason):
                flight = self._routes.get((agent_id, command_id))
                if flight is not None:
                    self._apply(flight, flight.fanout.failed(agent_id, reason))
            case RouteCommand():
                self._route(msg)
            case StopRouting(grace_s=grace_s):
                self._stop_routing(grace_s, sender)
            case WakeupMessage(payload=payload) if payload == _STOP_GRACE:
                self._stop_timer = None
                self._stopped()
            case AbandonCommand(sink=sink):
                flight = self._by_sink.get(id(sink))
                if flight is not None:
                    self.abandoned += 1
                    self._apply(flight, flight.fanout.abandon())
                    self._forget_flight(flight)
            case WakeupMessage(payload=(tag, seq)) if tag == _TIMEOUT:
                flight = self._flights.get(seq)
                if flight is not None:
                    flight.timer = None
                    self._apply(flight, flight.fanout.expire())
            case _:
                pass

    def terminate(self, reason: ExitReason) -> None:
        # The handlers see this router end and end their streams themselves; the owners are
        # told here so they drop the answers instead of sending them to a dead address.
        for flight in list(self._flights.values()):
            self._apply(flight, flight.fanout.abandon())

    def format_status(self) -> Mapping[str, Any]:
        return {
            "commands_in_flight": len(self._flights),
            "targets_owed": len(self._routes),
            "commands_routed": self.routed,
            "commands_completed": self.completed,
            "commands_timed_out": self.timed_out,
            "commands_abandoned": self.abandoned,
            "answers_forwarded": self.answers,
            "late_answers": self.late_answers,
        }

    # -- a planned stop --------------------------------------------------------------------------

    def _stop_routing(self, grace_s: float, sender: Address) -> None:
        """Take no more commands; answer when none is in flight or the grace ends (seed:
        "Planned stop" step 2: up to 3 s or 30% of the budget, whichever is less)."""
        if self._stopping is None:
            self._stopping = []
            self._stop_timer = self.wakeupAfter(max(0.0, grace_s), _STOP_GRACE)
        self._stopping.append(sender)
        if not self._flights:
            self._stopped()

    def _stopped(self) -> None:
        waiters, self._stopping = self._stopping or [], []
        if self._stop_timer is not None:
            self.cancel_wakeup(self._stop_timer)
            self._stop_timer = None
        for waiter in waiters:
            self.send(waiter, RoutingStopped(len(self._flights)))

    # -- a new command -------------------------------------------------------------------------

    def _route(self, msg: RouteCommand) -> None:
        now = self.now()
        command, sink = msg.command, msg.sink
        command_id = command.command_id
        resolved = self.timeouts.resolve(msg.timeout_seconds, now)
        if resolved.warning is not None:
            log.warning("%s", resolved.warning)
        targets = msg.agent_ids or tuple(held_agent_ids(self.runtime) or ())
        stopping = self._stopping is not None
        self._seq += 1
        self.routed += 1
        flight = _Flight(self._seq, command_id, sink, CommandFanout(targets))
        self._flights[flight.seq] = flight
        self._by_sink[id(sink)] = flight
        fanout = flight.fanout
        # One message for every owner: the command is forwarded untouched, payload and
        # dispatch_tag included, and is not copied per agent.
        deliver = DeliverCommand(command, self.myAddress, now + resolved.seconds)
        runtime = self.runtime
        # With peers connected, a target not held here goes to the `cluster` actor, which asks
        # them (gateway/cluster/actor.py); alone, or for a peer's forwarded command, it is
        # not_connected.
        cluster = None if isinstance(msg, LocalRouteCommand) else cluster_route(runtime)
        remote: list[str] = []
        effects: list[Effect] = []
        for agent_id in fanout.targets:
            key = (agent_id, command_id)
            if key in self._routes:
                effects += fanout.refused(agent_id, "duplicate_command_id")
                continue
            row = agent_session(runtime, agent_id)
            if stopping and row is not None:
                # Its session is about to end: refused, never delivered. Only what this node
                # holds: the rest is "not held here" (a peer's command) or asked of the cluster.
                effects += fanout.refused(agent_id, "agent_disconnected")
                continue
            if row is None or not runtime.is_alive(row.owner):
                if cluster is None:
                    effects += fanout.refused(agent_id, NOT_CONNECTED)
                    continue
                fanout.dispatched(agent_id, cluster)
                self._routes[key] = flight
                remote.append(agent_id)
                continue
            fanout.dispatched(agent_id, row.owner)
            self._routes[key] = flight
            self.send(row.owner, deliver)
        if remote and cluster is not None:
            deadline = now + resolved.seconds
            self.send(cluster, ForwardCommand(command, tuple(remote), deadline, self.myAddress))
        effects += fanout.routed()
        self._apply(flight, effects)
        if not fanout.done:
            flight.timer = self.wakeupAfter(resolved.seconds, (_TIMEOUT, flight.seq))

    # -- answers -------------------------------------------------------------------------------

    def _answer(self, agent_id: str, response: agent_pb2.CommandResponse) -> None:
        flight = self._routes.get((agent_id, response.command_id))
        if flight is None:
            # The command ended (timeout, abandoned) before this answer came.
            self.late_answers += 1
            return
        self.answers += 1
        self._apply(flight, flight.fanout.answered(agent_id, response.status != _RUNNING), response)

    # -- effects -------------------------------------------------------------------------------

    def _apply(
        self,
        flight: _Flight,
        effects: list[Effect],
        response: agent_pb2.CommandResponse | None = None,
    ) -> None:
        sink = flight.sink
        for effect in effects:
            match effect:
                case Forward(agent_id=agent_id, final=final):
                    if final:
                        self._unroute(flight, agent_id)
                    sink.put(
                        management_pb2.SendCommandResponse(agent_id=agent_id, response=response),
                        "agent",
                        final,
                    )
                case Settle(agent_id=agent_id, status=status, output=output):
                    self._unroute(flight, agent_id)
                    kind = cast(ResponseKind, "timeout" if status == "TIMEOUT" else output)
                    answer = agent_pb2.CommandResponse(
                        command_id=flight.command_id, status=_Status.Value(status), output=output
                    )
                    sink.put(
                        management_pb2.SendCommandResponse(agent_id=agent_id, response=answer),
                        kind,
                        True,
                    )
                case Forget(agent_id=agent_id, route=route):
                    self._unroute(flight, agent_id)
                    self.send(cast(Address, route), ForgetCommand(flight.command_id))
                case Done(outcome=outcome):
                    if outcome == "timeout":
                        self.timed_out += 1
                    else:
                        self.completed += 1
                    self._forget_flight(flight)
                    sink.finish(outcome)

    def _unroute(self, flight: _Flight, agent_id: str) -> None:
        key = (agent_id, flight.command_id)
        # A refused duplicate's key belongs to the flight that holds the id, not to this one.
        if self._routes.get(key) is flight:
            del self._routes[key]

    def _forget_flight(self, flight: _Flight) -> None:
        self._flights.pop(flight.seq, None)
        if self._stopping and not self._flights:
            self._stopped()
        self._by_sink.pop(id(flight.sink), None)
        if flight.timer is not None:
            self.cancel_wakeup(flight.timer)
            flight.timer = None
