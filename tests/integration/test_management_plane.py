"""The management plane end to end: grpcio operator clients on the management listener and grpcio
agents on the agent listener of a real node (`running_node`), whose upstream is the grpcio fake
server. Every assertion is on what crosses a wire (the responses and the status the operator
reads, what the agent's stream carries) or on `/metrics` and the log.

Agents and the node come from tests/integration/test_agent_plane.py's helpers. Each test bounds
its own time (the module's timeout and the calls' deadlines).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from actors.registry.api import agent_session
from actors.router.api import ROUTER_NAME
from actors.upstream.api import upstream_channel
from gateway.devstack.fake_upstream import FakeUpstream
from gateway.node.node import Node
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2 as mgmt
from supervisors.api import restart_child, terminate_child
from tests.integration.test_agent_plane import Agent, Metrics, agents, run, until
from tests.support.node import TEST_CONFIG, running_node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(40)]

Code = grpc.StatusCode
S = agent_pb2.CommandResponse.Status
SERVICE = "/yuzu.server.v1.ManagementService/"
DEADLINE_S = 20.0
MARKER = "mgmt-param-marker-93e1"


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, default_timeout_s: int = 300) -> AsyncIterator[Node]:
    """A node (test.config: an agent and a management listener on free loopback ports) whose
    upstream is a fresh fake server; `default_timeout_s` is default_command_timeout_s."""
    async with FakeUpstream() as fake:
        upstream = (
            "{upstream_client, #{channels => [{default_channel,"
            f' [{{http, "127.0.0.1", {fake.port}, []}}], #{{}}}}]}}}}'
        )
        text = TEST_CONFIG.read_text().replace("{allow_no_upstream, true}", upstream)
        text = text.replace(
            "{default_command_timeout_s, 300}",
            f"{{default_command_timeout_s, {default_timeout_s}}}",
        )
        config = tmp_path / "mgmt_plane.config"
        config.write_text(text)
        async with running_node(tmp_path, YUZU_GW_CONFIG=str(config)) as node:
            assert node.runtime is not None
            channel = upstream_channel(node.runtime)
            await until(
                lambda: channel is not None and channel.live_connections() == 1,  # type: ignore[attr-defined]
                "the upstream connection",
            )
            yield node


class Operator:
    """One grpcio channel to a management listener at `target`, host:port (the server's
    replica, say)."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(
            target, options=[("grpc.use_local_subchannel_pool", 1)]
        )

    def _method(self, kind: str, name: str, response: type[Any]) -> Any:
        make = self.channel.unary_stream if kind == "stream" else self.channel.unary_unary
        return make(
            SERVICE + name,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,
        )

    def send(
        self,
        command: agent_pb2.CommandRequest,
        agent_ids: tuple[str, ...] = (),
        timeout_seconds: int = 0,
    ) -> grpc.aio.UnaryStreamCall:
        request = mgmt.SendCommandRequest(
            agent_ids=agent_ids, command=command, timeout_seconds=timeout_seconds
        )
        call: grpc.aio.UnaryStreamCall = self._method(
            "stream", "SendCommand", mgmt.SendCommandResponse
        )(request, timeout=DEADLINE_S)
        return call

    def watch(self, *agent_ids: str) -> grpc.aio.UnaryStreamCall:
        call: grpc.aio.UnaryStreamCall = self._method("stream", "WatchEvents", mgmt.AgentEvent)(
            mgmt.WatchEventsRequest(agent_ids=agent_ids), timeout=DEADLINE_S
        )
        return call

    async def unary(self, name: str, request: Any, response: type[Any]) -> Any:
        return await self._method("unary", name, response)(request, timeout=DEADLINE_S)

    async def close(self) -> None:
        await self.channel.close()


@contextlib.asynccontextmanager
async def operator(node: Node | str) -> AsyncIterator[Operator]:
    """On `node`'s management listener, or on the one at `host:port` (a node in another
    process)."""
    target = node if isinstance(node, str) else f"127.0.0.1:{node.ctx.bound['listener_mgmt'][1]}"
    made = Operator(target)
    try:
        yield made
    finally:
        await made.close()


async def collect(call: grpc.aio.UnaryStreamCall) -> tuple[list[Any], grpc.StatusCode]:
    """Every response of a stream, and how it ended."""
    out: list[Any] = []
    with contextlib.suppress(grpc.aio.AioRpcError):
        while (response := await call.read()) is not grpc.aio.EOF:
            out.append(response)
    return out, await call.code()


async def connect(node: Node, agent: Agent, agent_id: str) -> grpc.aio.StreamStreamCall:
    """Register and subscribe `agent` as `agent_id`; returns once the node holds it."""
    session = (await agent.register(agent_id)).session_id
    stream = agent.subscribe(session)
    assert node.runtime is not None
    runtime = node.runtime
    await until(lambda: agent_session(runtime, agent_id) is not None, f"{agent_id} held")
    return stream


def command(command_id: str = "c1") -> agent_pb2.CommandRequest:
    return agent_pb2.CommandRequest(
        command_id=command_id,
        plugin="shell",
        action="run",
        parameters={"secret": MARKER},
        payload=b"\x00payload",
        dispatch_tag="tag-9",
    )


def answers(responses: list[mgmt.SendCommandResponse]) -> list[tuple[str, int, str]]:
    return [(r.agent_id, r.response.status, r.response.output) for r in responses]


async def reply(stream: grpc.aio.StreamStreamCall, command_id: str, *statuses: int) -> None:
    for status in statuses:
        await stream.write(
            agent_pb2.CommandResponse(command_id=command_id, status=status, output=f"s{status}")
        )


# -- SendCommand -------------------------------------------------------------------------------


def test_round_trip_running_then_success_in_order(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as node, agents(node) as [agent], operator(node) as op:
            stream = await connect(node, agent, "agent-1")
            before = await Metrics.read(node)
            call = op.send(command(), ("agent-1",), 30)
            # The agent gets the command untouched: parameters, payload and dispatch_tag.
            assert await asyncio.wait_for(stream.read(), 5) == command()
            # Each frame reaches the operator as it arrives, not when the command is over.
            await reply(stream, "c1", S.RUNNING)
            running = await asyncio.wait_for(call.read(), 5)
            assert answers([running]) == [("agent-1", S.RUNNING, f"s{S.RUNNING}")]
            await reply(stream, "c1", S.SUCCESS)
            responses, code = await collect(call)
            assert code is Code.OK
            assert answers(responses) == [("agent-1", S.SUCCESS, f"s{S.SUCCESS}")]
            after = await Metrics.read(node)
            assert after.delta(before, "yuzu_gw_mgmt_command_responses_total", kind="agent") == 2
            assert after.delta(before, "yuzu_gw_mgmt_commands_total", outcome="completed") == 1
            assert after.value("yuzu_gw_mgmt_commands_in_flight") == 0
            # An empty command id is refused before anything reaches an agent.
            empty = await collect(op.send(agent_pb2.CommandRequest(), ("agent-1",)))
            assert empty == ([], Code.INVALID_ARGUMENT)

    run(body)


def test_broadcast_and_mixed_held_and_unknown_targets(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as node, agents(node, 3) as made, operator(node) as op:
            streams = [await connect(node, a, f"agent-{n}") for n, a in enumerate(made)]
            call = op.send(command(), ())  # no agent ids: every agent this node holds
            for stream in streams:
                assert await asyncio.wait_for(stream.read(), 5) == command()
                await reply(stream, "c1", S.SUCCESS)
            responses, code = await collect(call)
            assert code is Code.OK
            assert sorted(answers(responses)) == [
                (f"agent-{n}", S.SUCCESS, f"s{S.SUCCESS}") for n in range(3)
            ]

            mixed = op.send(command("c2"), ("nobody", "agent-1"))
            assert (await asyncio.wait_for(streams[1].read(), 5)).command_id == "c2"
            await reply(streams[1], "c2", S.FAILURE)
            responses, code = await collect(mixed)
            assert code is Code.OK
            assert answers(responses) == [
                ("nobody", S.FAILURE, "not_connected"),
                ("agent-1", S.FAILURE, f"s{S.FAILURE}"),
            ]

    run(body)


def test_timeout_zero_and_negative_use_the_default(tmp_path: Path) -> None:
    async def body() -> None:
        async with (
            gateway(tmp_path, default_timeout_s=1) as node,
            agents(node) as [agent],
            operator(node) as op,
        ):
            stream = await connect(node, agent, "agent-1")
            loop = asyncio.get_running_loop()
            for n, timeout in enumerate((0, -5)):
                started = loop.time()
                call = op.send(command(f"t{n}"), ("agent-1",), timeout)
                await asyncio.wait_for(stream.read(), 5)  # the agent never answers
                responses, code = await collect(call)
                elapsed = loop.time() - started
                assert code is Code.OK
                assert answers(responses) == [("agent-1", S.TIMEOUT, "")]
                assert 0.9 <= elapsed < 3.0, elapsed

    run(body)


def test_an_agent_that_disconnects_mid_command(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as node, agents(node) as [agent], operator(node) as op:
            stream = await connect(node, agent, "agent-1")
            call = op.send(command(), ("agent-1",), 60)
            await asyncio.wait_for(stream.read(), 5)
            await reply(stream, "c1", S.RUNNING)
            stream.cancel()
            responses, code = await collect(call)
            assert code is Code.OK
            assert answers(responses) == [
                ("agent-1", S.RUNNING, f"s{S.RUNNING}"),
                ("agent-1", S.FAILURE, "agent_disconnected"),
            ]

    run(body)


def test_a_duplicate_command_id_is_answered_once_and_not_sent_again(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as node, agents(node) as [agent], operator(node) as op:
            stream = await connect(node, agent, "agent-1")
            first = op.send(command(), ("agent-1",), 60)
            assert (await asyncio.wait_for(stream.read(), 5)).command_id == "c1"
            responses, code = await collect(op.send(command(), ("agent-1",), 60))
            assert code is Code.OK
            assert answers(responses) == [("agent-1", S.FAILURE, "duplicate_command_id")]
            await reply(stream, "c1", S.SUCCESS)
            responses, code = await collect(first)
            assert (answers(responses), code) == (
                [("agent-1", S.SUCCESS, f"s{S.SUCCESS}")],
                Code.OK,
            )
            # The agent saw the command once: the next thing on its stream is a new command.
            op.send(command("c2"), ("agent-1",), 60)
            assert (await asyncio.wait_for(stream.read(), 5)).command_id == "c2"

    run(body)


def test_router_killed_during_a_command(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    async def body() -> None:
        async with gateway(tmp_path) as node, agents(node) as [agent], operator(node) as op:
            runtime = node.runtime
            assert runtime is not None
            stream = await connect(node, agent, "agent-1")
            call = op.send(command(), ("agent-1",), 60)
            await asyncio.wait_for(stream.read(), 5)
            router = runtime.whereis(ROUTER_NAME)
            assert router is not None
            runtime.kill(router)
            responses, code = await collect(call)
            # The in-flight command ends UNAVAILABLE; the supervisor restarts the router.
            assert (responses, code) == ([], Code.UNAVAILABLE)
            await until(lambda: runtime.whereis(ROUTER_NAME) not in (None, router), "restart")

            # While no router runs, a new command is UNAVAILABLE (and /readyz says router).
            await terminate_child(runtime, node.root, ROUTER_NAME)
            assert node.ctx.readiness.evaluate()[ROUTER_NAME] is False
            assert await collect(op.send(command("c2"), ("agent-1",))) == ([], Code.UNAVAILABLE)
            await restart_child(runtime, node.root, ROUTER_NAME)
            assert node.ctx.readiness.evaluate()[ROUTER_NAME] is True
            # The killed router never told the owner to forget c1 (a kill sends nothing), so the
            # agent's late answer is dropped; a new command id goes through.
            again = op.send(command("c3"), ("agent-1",), 60)
            assert (await asyncio.wait_for(stream.read(), 5)).command_id == "c3"
            await reply(stream, "c3", S.SUCCESS)
            responses, code = await collect(again)
            assert (answers(responses), code) == (
                [("agent-1", S.SUCCESS, f"s{S.SUCCESS}")],
                Code.OK,
            )
            metrics = await Metrics.read(node)
            assert metrics.value("yuzu_gw_mgmt_commands_total", outcome="router_down") == 1
            assert metrics.value("yuzu_gw_mgmt_commands_total", outcome="unavailable") == 1

        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert "command router ended with commands in flight (killed)" in logged
        assert "command router is not running (noproc)" in logged
        assert MARKER not in logged and "payload" not in logged

    run(body)


# -- WatchEvents, ListAgents, GetAgent, QueryInventory ---------------------------------------------


def test_watch_events_two_watchers_and_a_filter(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as node, agents(node, 2) as [a1, a2], operator(node) as op:
            everything = op.watch()
            only_two = op.watch("agent-2")
            # The headers come once each watcher is registered: nothing later is missed.
            await asyncio.wait_for(everything.initial_metadata(), 5)
            await asyncio.wait_for(only_two.initial_metadata(), 5)
            assert (await Metrics.read(node)).value("yuzu_gw_mgmt_watchers") == 2
            first = await connect(node, a1, "agent-1")
            await connect(node, a2, "agent-2")
            first.cancel()

            async def events(call: grpc.aio.UnaryStreamCall, count: int) -> list[Any]:
                got = [await asyncio.wait_for(call.read(), 5) for _ in range(count)]
                return [(e.agent_id, e.WhichOneof("event")) for e in got]

            assert await events(everything, 3) == [
                ("agent-1", "connected"),
                ("agent-2", "connected"),
                ("agent-1", "disconnected"),
            ]
            assert await events(only_two, 1) == [("agent-2", "connected")]
            everything.cancel()
            only_two.cancel()
            runtime = node.runtime
            assert runtime is not None
            table = runtime.table("agent_watchers")
            assert table is not None
            await until(lambda: len(table) == 0, "the watchers to go")

    run(body)


def test_list_get_and_query_inventory(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as node, agents(node, 3) as made, operator(node) as op:
            for agent, agent_id in zip(made, ("b", "é", "a"), strict=True):
                await connect(node, agent, agent_id)

            async def page(cursor: str, limit: int) -> tuple[list[str], str]:
                request = mgmt.ListAgentsRequest(cursor=cursor, limit=limit, filter="ignored")
                answer = await op.unary("ListAgents", request, mgmt.ListAgentsResponse)
                assert all(s.online for s in answer.agents)
                return [s.agent_id for s in answer.agents], answer.next_cursor

            # Bytewise order ("é" is 0xC3 0xA9, after every ASCII id); the cursor is the last id.
            assert await page("", 2) == (["a", "b"], "b")
            assert await page("b", 2) == (["é"], "")
            assert await page("", 0) == (["a", "b", "é"], "")  # 0: the default, 100
            assert await page("", 5000) == (["a", "b", "é"], "")  # over 1000: 100

            got = await op.unary(
                "GetAgent", mgmt.GetAgentRequest(agent_id="a"), mgmt.GetAgentResponse
            )
            assert got.summary.agent_id == "a" and got.summary.online
            assert [p.name for p in got.plugins] == ["os"]  # as its Register described them
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await op.unary(
                    "GetAgent", mgmt.GetAgentRequest(agent_id="z"), mgmt.GetAgentResponse
                )
            assert missing.value.code() is Code.NOT_FOUND
            with pytest.raises(grpc.aio.AioRpcError) as inventory:
                await op.unary(
                    "QueryInventory",
                    mgmt.QueryInventoryRequest(agent_id="a"),
                    mgmt.QueryInventoryResponse,
                )
            assert inventory.value.code() is Code.UNIMPLEMENTED

    run(body)
