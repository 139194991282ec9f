"""`yuzu.server.v1.ManagementService` on the management listener (the Erlang
yuzu_gw_mgmt_service). Operators (the server's replicas) call it; docs/management-plane.md.

Every method answers with a real status, so no call falls through to grpclib's own answer:

| method | kind | module |
| --- | --- | --- |
| SendCommand | request process + the router | gateway/mgmt/command.py, actors/router/actor.py |
| ListAgents, GetAgent | table reads | gateway/mgmt/agents.py |
| WatchEvents | one watcher per stream | gateway/mgmt/watch.py, actors/agents/watch.py |
| QueryInventory | UNIMPLEMENTED (the server owns inventory) | here |

Build one per node inside the root supervisor's spec (`mgmt_service(ctx, runtime)`); the
listeners route it under the module name `yuzu_gw_mgmt_service`. Who may call it (the peer
authorisation of the management listener) is decided before a handler runs, not here.
"""

from __future__ import annotations

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from gateway.agent.plane import guarded
from gateway.config.context import NodeContext
from gateway.mgmt.agents import get_agent, list_agents
from gateway.mgmt.command import send_command
from gateway.mgmt.metrics import mgmt_metrics
from gateway.mgmt.plane import MgmtPlane
from gateway.mgmt.watch import watch_events
from protos.yuzu.server.v1 import management_pb2
from protos.yuzu.server.v1.management_grpc import ManagementServiceBase
from supervisors.runtime import LoopSystemBase

__all__ = ["MODULE", "QUERY_INVENTORY_DETAILS", "ManagementService", "mgmt_service"]

# The name a grpc_listeners `services` map gives this service's handler.
MODULE = "yuzu_gw_mgmt_service"
QUERY_INVENTORY_DETAILS = "Inventory is stored and queried by the server"


class ManagementService(ManagementServiceBase):
    def __init__(self, plane: MgmtPlane) -> None:
        self.plane = plane

    @guarded("SendCommand")
    async def SendCommand(
        self,
        stream: Stream[management_pb2.SendCommandRequest, management_pb2.SendCommandResponse],
    ) -> None:
        await send_command(self.plane, stream)

    @guarded("ListAgents")
    async def ListAgents(
        self, stream: Stream[management_pb2.ListAgentsRequest, management_pb2.ListAgentsResponse]
    ) -> None:
        await list_agents(self.plane, stream)

    @guarded("GetAgent")
    async def GetAgent(
        self, stream: Stream[management_pb2.GetAgentRequest, management_pb2.GetAgentResponse]
    ) -> None:
        await get_agent(self.plane, stream)

    @guarded("WatchEvents")
    async def WatchEvents(
        self, stream: Stream[management_pb2.WatchEventsRequest, management_pb2.AgentEvent]
    ) -> None:
        await watch_events(self.plane, stream)

    async def QueryInventory(
        self,
        stream: Stream[management_pb2.QueryInventoryRequest, management_pb2.QueryInventoryResponse],
    ) -> None:
        raise GRPCError(Status.UNIMPLEMENTED, QUERY_INVENTORY_DETAILS)


def mgmt_service(ctx: NodeContext, runtime: LoopSystemBase) -> ManagementService:
    """The node's management service (module doc)."""
    return ManagementService(MgmtPlane(runtime=runtime, metrics=mgmt_metrics(ctx.registry)))
