"""A simulated agent (gateway/devstack/agents.py) against a tiny in-process grpcio AgentService:
what it sends, how it answers commands, and how it comes back after losing its session."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from actors.core.owner_commands import is_guardian_event
from gateway.devstack.agents import SESSION_KEY, AgentSettings, Fleet, Target
from gateway.devstack.behaviour import Backoff
from protos.yuzu.agent.v1 import agent_pb2

pytestmark = pytest.mark.timeout(30)

Status = agent_pb2.CommandResponse.Status
SERVICE = "yuzu.agent.v1.AgentService"
FAST = AgentSettings(
    heartbeat_s=0.05,
    inventory_s=0.1,
    guard_s=0.1,
    answer_delay_s=0.0,
    rpc_timeout_s=2.0,
    backoff=Backoff(base_s=0.02, cap_s=0.1),
)


def run(body: Callable[[], Awaitable[None]], timeout: float = 15.0) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


class Gateway:
    """Register, Heartbeat, ReportInventory and Subscribe, recording what the agents send."""

    def __init__(self) -> None:
        self.registers: list[agent_pb2.RegisterRequest] = []
        self.heartbeats: list[agent_pb2.HeartbeatRequest] = []
        self.reports: list[agent_pb2.InventoryReport] = []
        self.subscribed: list[str] = []  # the session id of each Subscribe
        self.frames: asyncio.Queue[agent_pb2.CommandResponse] = asyncio.Queue()
        self.commands: asyncio.Queue[agent_pb2.CommandRequest | None] = asyncio.Queue()
        self.heartbeat_code: grpc.StatusCode | None = None
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def register(self, request: Any, context: Any) -> agent_pb2.RegisterResponse:
        self.registers.append(request)
        return agent_pb2.RegisterResponse(accepted=True, session_id=f"s-{len(self.registers)}")

    async def heartbeat(self, request: Any, context: Any) -> agent_pb2.HeartbeatResponse:
        self.heartbeats.append(request)
        if self.heartbeat_code is not None:
            code, self.heartbeat_code = self.heartbeat_code, None
            await context.abort(code, "unknown session")
        return agent_pb2.HeartbeatResponse(acknowledged=True)

    async def inventory(self, request: Any, context: Any) -> agent_pb2.InventoryAck:
        self.reports.append(request)
        return agent_pb2.InventoryAck(received=True)

    async def subscribe(self, _requests: Any, context: Any) -> None:
        metadata = dict(context.invocation_metadata())
        self.subscribed.append(metadata[SESSION_KEY])
        await context.send_initial_metadata(())  # a gateway answers the headers at once

        async def frames() -> None:
            while (frame := await context.read()) is not grpc.aio.EOF:
                await self.frames.put(frame)

        reader = asyncio.create_task(frames())
        try:
            # None ends the stream OK, as a gateway's planned stop does.
            while (command := await self.commands.get()) is not None:
                await context.write(command)
        finally:
            reader.cancel()

    async def start(self, port: int = 0) -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])

        def unary(fn: Any, req: Any, resp: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
            )

        handlers = {
            "Register": unary(self.register, agent_pb2.RegisterRequest, agent_pb2.RegisterResponse),
            "Heartbeat": unary(
                self.heartbeat, agent_pb2.HeartbeatRequest, agent_pb2.HeartbeatResponse
            ),
            "ReportInventory": unary(
                self.inventory, agent_pb2.InventoryReport, agent_pb2.InventoryAck
            ),
            "Subscribe": grpc.stream_stream_rpc_method_handler(
                self.subscribe,
                request_deserializer=agent_pb2.CommandResponse.FromString,
                response_serializer=agent_pb2.CommandRequest.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self.port = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        self.server = server

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
            self.server = None

    async def frame(self, want: Callable[[agent_pb2.CommandResponse], bool]) -> Any:
        """The next frame `want` accepts (others, such as Guardian events, are skipped)."""
        while not want(frame := await self.frames.get()):
            pass
        return frame


@contextlib.asynccontextmanager
async def stack(count: int = 1) -> AsyncIterator[tuple[Gateway, Fleet]]:
    gateway = Gateway()
    await gateway.start()
    fleet = Fleet(count, Target(f"127.0.0.1:{gateway.port}"), FAST, seed=7)
    fleet.start()
    try:
        assert await fleet.wait_subscribed(5.0)
        yield gateway, fleet
    finally:
        await fleet.stop()
        await gateway.stop()


async def until(predicate: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(5.0):
        while not predicate():
            await asyncio.sleep(0.01)


def test_a_command_is_answered_running_then_success_on_the_subscribed_session() -> None:
    async def body() -> None:
        async with stack() as (gateway, fleet):
            [registered] = gateway.registers
            assert registered.info.agent_id == "devstack-agent-0001"
            assert gateway.subscribed == ["s-1"]
            command = agent_pb2.CommandRequest(command_id="c-1", plugin="os", action="info")
            await gateway.commands.put(command)
            answers = [await gateway.frame(lambda f: f.command_id == "c-1") for _ in range(2)]
            assert [a.status for a in answers] == [Status.RUNNING, Status.SUCCESS]
            assert answers[1].output.endswith("os info done")
            assert fleet.agents[0].answered == 1

            # Meanwhile: heartbeats and inventory on the session, and Guardian events.
            guard = await gateway.frame(lambda f: is_guardian_event(f.plugin, f.command_id))
            assert guard.output
            await until(lambda: len(gateway.heartbeats) >= 2 and gateway.reports, "reports")
            assert {hb.session_id for hb in gateway.heartbeats} == {"s-1"}
            assert {r.session_id for r in gateway.reports} == {"s-1"}

    run(body)


def test_a_stream_the_gateway_ends_makes_the_agent_register_again() -> None:
    async def body() -> None:
        async with stack() as (gateway, fleet):
            await gateway.commands.put(None)
            await until(lambda: gateway.subscribed == ["s-1", "s-2"], "a second session")
            assert len(gateway.registers) == 2
            assert fleet.agents[0].sessions == 2

    run(body)


def test_a_heartbeat_answered_not_found_makes_the_agent_register_again() -> None:
    async def body() -> None:
        async with stack() as (gateway, _fleet):
            gateway.heartbeat_code = grpc.StatusCode.NOT_FOUND
            await until(lambda: gateway.subscribed[-1:] == ["s-2"], "a second session")

    run(body)


def test_agents_come_back_when_the_gateway_does() -> None:
    async def body() -> None:
        async with stack(count=3) as (gateway, fleet):
            port = gateway.port
            await gateway.stop()
            await until(lambda: fleet.subscribed == 0, "every agent to lose its stream")
            await gateway.start(port)
            assert await fleet.wait_subscribed(5.0)
            # Each agent registered again on the new gateway, once per agent.
            assert len(gateway.registers) == 6
            assert sorted(r.info.agent_id for r in gateway.registers[3:]) == [
                "devstack-agent-0001",
                "devstack-agent-0002",
                "devstack-agent-0003",
            ]

    run(body)
