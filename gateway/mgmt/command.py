"""SendCommand: the operator's side of a command (the router is actors/router/actor.py).

The handler checks the request, hands it to the router with a sink (`OperatorSink`), and writes
what the router puts in the sink to the operator's stream until the router finishes it:

| condition | the operator sees |
| --- | --- |
| `command.command_id` empty | INVALID_ARGUMENT, nothing sent to any agent |
| no router running (it is restarting) | UNAVAILABLE "command router unavailable", retry hint |
| each target | its frames as they arrive, RUNNING included, then one terminal answer |
| in a cluster, a target another node holds | the same, through that node (docs/cluster.md) |
| a target known to be on a node this one cannot reach | FAILURE `unavailable` (retryable) |
| a broadcast that could not reach a node | after the answers, one line per such node (below) |
| every target answered terminally, or the timeout | the stream ends OK |
| the router ends with the command in flight | what was queued, then UNAVAILABLE |

A router that ends mid-command ends every stream it was serving UNAVAILABLE, the status a
command gets while the router is not running (seed: "Subscribe Stream Proxy"): the answers
already written stand; the rest are lost, and an agent may still have run the command, so the
operator should not blindly retry a command that is not idempotent. Both UNAVAILABLE answers log
one WARNING naming only the class of the failure (noproc, killed, crash), at most one a second
with a count of the lines held back.

**A broadcast in a cluster** addresses every agent the agent directory knows (this node's, and
each peer's through that peer alone; actors/core/agent_directory.py). A node it could not reach
(its link is down, or its directory has not arrived yet) is named after the answers by one line
of its own: a response with an empty `agent_id` and FAILURE `unavailable`, whose `error` has
code `node_unreachable` and the node's cluster address in `metadata["node"]`
(`NODE_UNREACHABLE`); the agents known to be on it have answered `unavailable` each.

**A slow operator never holds the router.** The router only calls `put` and `finish`, which
never wait. The sink keeps every terminal answer (one per target, so at most the number of
targets) and at most `PROGRESS_QUEUE_MAX` RUNNING frames; a RUNNING frame past that is dropped
and counted (`yuzu_gw_mgmt_command_progress_dropped_total`), so an operator that does not read
holds at most 1024 progress frames plus one answer per target. Once the command is over, the
operator gets `END_WRITE_GRACE_S` for each response still queued; an operator that reads none
in that time has its stream reset (outcome `stalled`). An operator that goes away (cancel,
deadline, closed connection) is abandoned: the router forgets the command and tells the owners.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Literal, Protocol

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from actors.cluster.api import connected_links, directory_of
from actors.registry.api import held_agent_ids
from actors.router.api import (
    NOT_CONNECTED,
    ROUTER_NAME,
    UNAVAILABLE,
    AbandonCommand,
    LocalRouteCommand,
    ResponseKind,
    RouteCommand,
)
from gateway.listeners.retry_hint import HintedRefusal, RefusalKind
from gateway.mgmt.metrics import CommandOutcome, MgmtMetrics
from gateway.mgmt.plane import MgmtPlane, receive
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.common.v1 import common_pb2
from protos.yuzu.server.v1 import management_pb2
from supervisors.reason import ExitReason
from supervisors.runtime import LoopSystemBase

__all__ = [
    "EMPTY_COMMAND_ID_DETAILS",
    "END_WRITE_GRACE_S",
    "NODE_UNREACHABLE",
    "PROGRESS_QUEUE_MAX",
    "ROUTER_DOWN_DETAILS",
    "ROUTER_UNAVAILABLE_DETAILS",
    "OperatorSink",
    "ResponseWriter",
    "run_command",
    "send_command",
]

# RUNNING frames one operator stream may have queued: a healthy operator reads as fast as the
# gateway writes, so the queue only fills when it stops reading, and progress is what can go.
PROGRESS_QUEUE_MAX = 1024
# After the command is over, the longest wait for the operator to take one queued response: an
# operator that stopped reading must not hold a handler, and its answers, for ever.
END_WRITE_GRACE_S = 30.0

EMPTY_COMMAND_ID_DETAILS = "command.command_id is required"
ROUTER_UNAVAILABLE_DETAILS = "command router unavailable"
ROUTER_DOWN_DETAILS = "command router restarted; answers not yet received are lost"
# The error code of a broadcast's line for a node it could not reach (module doc).
NODE_UNREACHABLE = "node_unreachable"
_NOT_RUNNING_LOG = "SendCommand: the command router is not running (%s); answered UNAVAILABLE"
_ENDED_LOG = (
    "SendCommand: the command router ended with commands in flight (%s); answered UNAVAILABLE"
)

CommandStream = Stream[management_pb2.SendCommandRequest, management_pb2.SendCommandResponse]


class ResponseWriter(Protocol):
    """Where a command's responses are written: the operator's stream, or a peer's command
    stream (gateway/cluster/commands.py). `send_message` waits for the reader (the sink bounds
    what waits meanwhile); `cancel` resets a stream nobody reads."""

    async def send_message(self, message: management_pb2.SendCommandResponse) -> None: ...

    async def cancel(self) -> None: ...


class OperatorSink:
    """One command's responses between the router and the handler (module doc). The router
    calls `put` and `finish`; the handler's router monitor calls `router_down`; the handler
    reads with `next`."""

    __slots__ = (
        "_counts",
        "_dropped",
        "_frames",
        "_not_held_bare",
        "_on_end",
        "_progress",
        "_progress_max",
        "_waiter",
        "failure",
        "outcome",
    )

    def __init__(
        self,
        metrics: MgmtMetrics,
        progress_max: int = PROGRESS_QUEUE_MAX,
        not_held_bare: bool = False,
    ) -> None:
        self._frames: collections.deque[tuple[management_pb2.SendCommandResponse, bool]] = (
            collections.deque()
        )
        self._progress = 0
        self._progress_max = progress_max
        self._counts = metrics.responses
        self._dropped = metrics.progress_dropped
        # A peer's forwarded command: a target not held here is written as a response with no
        # `response` field, which the forwarding node tells from any agent's answer.
        self._not_held_bare = not_held_bare
        self._waiter: asyncio.Future[None] | None = None
        self._on_end: asyncio.Timeout | None = None
        # How the router ended it, or the class of the router's failure.
        self.outcome: Literal["completed", "timeout"] | None = None
        self.failure: str | None = None

    @property
    def ended(self) -> bool:
        return self.outcome is not None or self.failure is not None

    # -- the router's side -------------------------------------------------------------------

    def put(
        self, response: management_pb2.SendCommandResponse, kind: ResponseKind, final: bool
    ) -> None:
        if self.ended:
            return
        if not final:
            if self._progress >= self._progress_max:
                self._dropped.inc()
                return
            self._progress += 1
        self._counts.labels(kind).inc()
        if self._not_held_bare and kind == NOT_CONNECTED:
            response = management_pb2.SendCommandResponse(agent_id=response.agent_id)
        self._frames.append((response, final))
        self._wake()

    def finish(self, outcome: Literal["completed", "timeout"]) -> None:
        if not self.ended:
            self.outcome = outcome
            self._ended()

    def router_down(self, reason: ExitReason) -> None:
        if not self.ended:
            self.failure = reason.kind
            self._ended()

    # -- the handler's side ------------------------------------------------------------------

    async def next(self) -> management_pb2.SendCommandResponse | None:
        """The next response to write; None once the command is over and all are written."""
        while not self._frames:
            if self.ended:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        response, final = self._frames.popleft()
        if not final:
            self._progress -= 1
        return response

    def bound_writes(self, timeout: asyncio.Timeout) -> None:
        """From the end on, each write gets `END_WRITE_GRACE_S` (module doc)."""
        self._on_end = timeout
        if self.ended:
            self._extend()

    def written(self) -> None:
        if self.ended:
            self._extend()

    def _extend(self) -> None:
        if self._on_end is not None:
            self._on_end.reschedule(asyncio.get_running_loop().time() + END_WRITE_GRACE_S)

    def _ended(self) -> None:
        self._extend()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


async def send_command(plane: MgmtPlane, stream: CommandStream) -> None:
    """An operator's command."""
    request = await receive(stream)
    await run_command(plane, request, stream)


async def run_command(
    plane: MgmtPlane,
    request: management_pb2.SendCommandRequest,
    stream: ResponseWriter,
    *,
    local: bool = False,
) -> CommandOutcome:
    """One command, its responses written to `stream` until it is over (`local`: a peer's
    forwarded command, gateway/cluster/commands.py, for this node's agents); the outcome
    counted."""
    metrics = plane.metrics
    command = request.command
    if not command.command_id:
        metrics.commands.labels("invalid").inc()
        raise GRPCError(Status.INVALID_ARGUMENT, EMPTY_COMMAND_ID_DETAILS)
    runtime = plane.runtime
    router = runtime.whereis(ROUTER_NAME)
    if router is None:
        metrics.commands.labels("unavailable").inc()
        plane.warn(("router", "noproc"), _NOT_RUNNING_LOG, "noproc")
        raise HintedRefusal(RefusalKind.RESTARTING, ROUTER_UNAVAILABLE_DETAILS)
    agent_ids = tuple(request.agent_ids)
    unreached: list[str] = []
    if not local and not agent_ids:
        agent_ids, unreached = _broadcast_targets(runtime)
    sink = OperatorSink(metrics, not_held_bare=local)
    # Watched for the whole stream: a router that dies (or was already gone: the callback runs
    # at once) ends it UNAVAILABLE.
    monitor = runtime.monitor_callback(router, sink.router_down)
    route = LocalRouteCommand if local else RouteCommand
    runtime.tell(router, route(command, agent_ids, request.timeout_seconds, sink))
    metrics.in_flight.inc()
    outcome: CommandOutcome = "abandoned"
    try:
        outcome = await _relay(stream, sink)
        if outcome in ("completed", "timeout"):
            for node in unreached:
                await stream.send_message(_unreached_line(command.command_id, node))
    finally:
        runtime.demonitor(monitor)
        metrics.in_flight.dec()
        metrics.commands.labels(outcome).inc()
        if not sink.ended and runtime.is_alive(router):
            runtime.tell(router, AbandonCommand(sink))
    if sink.failure is not None:
        plane.warn(("router", sink.failure), _ENDED_LOG, sink.failure)
        raise GRPCError(Status.UNAVAILABLE, ROUTER_DOWN_DETAILS)
    return outcome


def _broadcast_targets(runtime: LoopSystemBase) -> tuple[tuple[str, ...], list[str]]:
    """A broadcast's targets in a cluster: this node's agents, each peer's as the directory
    knows them, those known to be on an unreachable peer; and the nodes it cannot reach (module
    doc). Alone (no directory, or nothing in it) it is every agent held here, as on one node."""
    directory = directory_of(runtime)
    links = connected_links(runtime)
    if directory is None or not (links or directory.unreachable_peers()):
        return (), []
    held = held_agent_ids(runtime) or []
    plan, lost = directory.broadcast_plan(frozenset(held))
    remote = [agent_id for agents in (*plan.values(), *lost.values()) for agent_id in agents]
    unsynced = [link.addr for link in links if not directory.synced(link.addr)]
    unreached = sorted({str(peer) for peer in (*lost, *unsynced)})
    return (*held, *remote), unreached


def _unreached_line(command_id: str, node: str) -> management_pb2.SendCommandResponse:
    error = common_pb2.ErrorDetail(
        code=NODE_UNREACHABLE,
        message=f"gateway node {node} unreachable: agents it holds may be missing here",
        metadata={"node": node},
    )
    response = agent_pb2.CommandResponse(
        command_id=command_id,
        status=agent_pb2.CommandResponse.Status.FAILURE,
        output=UNAVAILABLE,
        error=error,
    )
    return management_pb2.SendCommandResponse(agent_id="", response=response)


async def _relay(stream: ResponseWriter, sink: OperatorSink) -> CommandOutcome:
    """Write until the sink is over; the outcome to count."""
    try:
        async with asyncio.timeout(None) as bound:
            sink.bound_writes(bound)
            while (response := await sink.next()) is not None:
                await stream.send_message(response)
                sink.written()
    except TimeoutError:
        # The operator read nothing for END_WRITE_GRACE_S after the end: nobody is reading.
        with contextlib.suppress(Exception):
            await stream.cancel()
        return "stalled"
    if sink.failure is not None:
        return "router_down"
    return sink.outcome or "abandoned"
