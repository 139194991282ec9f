"""`yuzu.agent.v1.AgentService` on the agent listener (the Erlang yuzu_gw_agent_service).

Every method is implemented, so no call falls through to grpclib's own answer:

| method | kind | module |
| --- | --- | --- |
| Register | request process | gateway/agent/register.py |
| Subscribe | stream process | gateway/agent/subscribe.py |
| Heartbeat | request process, admission | gateway/agent/heartbeat.py |
| ReportInventory | request process, admission | gateway/agent/inventory.py |
| ExecuteCommand | UNIMPLEMENTED "Use Subscribe for command delivery" | here |
| CheckForUpdate, DownloadUpdate | UNIMPLEMENTED (the server's update plane, not proxied) | here |

Build one per node inside the root supervisor's spec (`agent_service(ctx, runtime)`): it logs
the admission startup line and creates the summary-line state there, after the metrics and
before the listeners start (seed: "Heartbeat admission" > Observability). The listeners route
it under the module name `yuzu_gw_agent_service`. Its requests are parsed tolerantly
(gateway/agent/lenient.py): a request whose text is not valid UTF-8 gets its method's own
answer, not a parser's INTERNAL.
"""

from __future__ import annotations

import logging

from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from actors.registry.api import AGENTS_TABLE
from gateway.agent.admission import AgentAdmission
from gateway.agent.heartbeat import ADMISSION_STARTUP_LINE, RejectionSummary, heartbeat
from gateway.agent.inventory import report_inventory
from gateway.agent.lenient import Tolerant
from gateway.agent.metrics import agent_metrics
from gateway.agent.plane import AgentPlane, guarded
from gateway.agent.register import register
from gateway.agent.status import EXECUTE_COMMAND_DETAILS
from gateway.agent.subscribe import subscribe
from gateway.config.context import NodeContext
from gateway.config.keys.node import TELEMETRY_GAUGE_INTERVAL_MS
from gateway.upstream.calls import UpstreamCalls
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.agent.v1.agent_grpc import AgentServiceBase
from supervisors.errors import TableGone
from supervisors.runtime import LoopSystemBase

__all__ = ["MODULE", "AgentService", "agent_service"]

log = logging.getLogger("yuzu_gw.agent")

# The name a grpc_listeners `services` map gives this service's handler.
MODULE = "yuzu_gw_agent_service"
_UPDATES_DETAILS = "Updates are not served by the gateway"


class AgentService(AgentServiceBase):
    def __init__(self, plane: AgentPlane, summary: RejectionSummary) -> None:
        self.plane = plane
        self.summary = summary

    def __mapping__(self) -> dict[str, Handler]:
        # Every request is parsed tolerantly: text that is not valid UTF-8 reaches the handler
        # as `Undecoded`, for the method's own rule, instead of grpclib's INTERNAL.
        return {
            path: handler._replace(request_type=Tolerant(handler.request_type))
            for path, handler in super().__mapping__().items()
        }

    @guarded("Register")
    async def Register(
        self, stream: Stream[agent_pb2.RegisterRequest, agent_pb2.RegisterResponse]
    ) -> None:
        await register(self.plane, stream)

    @guarded("Heartbeat")
    async def Heartbeat(
        self, stream: Stream[agent_pb2.HeartbeatRequest, agent_pb2.HeartbeatResponse]
    ) -> None:
        await heartbeat(self.plane, self.summary, stream)

    @guarded("Subscribe")
    async def Subscribe(
        self, stream: Stream[agent_pb2.CommandResponse, agent_pb2.CommandRequest]
    ) -> None:
        await subscribe(self.plane, stream)

    @guarded("ReportInventory")
    async def ReportInventory(
        self, stream: Stream[agent_pb2.InventoryReport, agent_pb2.InventoryAck]
    ) -> None:
        await report_inventory(self.plane, stream)

    async def ExecuteCommand(
        self, stream: Stream[agent_pb2.CommandRequest, agent_pb2.CommandResponse]
    ) -> None:
        # A real status on the wire: commands reach agents over their Subscribe stream.
        raise GRPCError(Status.UNIMPLEMENTED, EXECUTE_COMMAND_DETAILS)

    async def CheckForUpdate(
        self, stream: Stream[agent_pb2.CheckForUpdateRequest, agent_pb2.CheckForUpdateResponse]
    ) -> None:
        raise GRPCError(Status.UNIMPLEMENTED, _UPDATES_DETAILS)

    async def DownloadUpdate(
        self, stream: Stream[agent_pb2.DownloadUpdateRequest, agent_pb2.DownloadUpdateChunk]
    ) -> None:
        raise GRPCError(Status.UNIMPLEMENTED, _UPDATES_DETAILS)


def agent_service(ctx: NodeContext, runtime: LoopSystemBase) -> AgentService:
    """The node's agent service (module doc)."""

    def agents_held() -> int:
        table = runtime.table(AGENTS_TABLE)
        try:
            return len(table) if table is not None else 0
        except TableGone:  # the registry is restarting: it holds nothing
            return 0

    plane = AgentPlane(
        runtime=runtime,
        config=ctx.config,
        calls=UpstreamCalls(runtime, ctx.config),
        metrics=agent_metrics(ctx.registry, agents_held),
        admission=AgentAdmission.of(ctx.config, runtime.loop.time),
    )
    summary = RejectionSummary(ctx.config[TELEMETRY_GAUGE_INTERVAL_MS] / 1000.0)
    log.info("%s", ADMISSION_STARTUP_LINE)
    return AgentService(plane, summary)
