"""The agent plane end to end: grpcio agents against a real node (`running_node`) whose
upstream channel dials the grpcio fake server in the same loop.

Every assertion is on what crosses a wire: the gRPC status the agent reads, what the fake server
received, and `/metrics` deltas; registry counts are read with the registry's own `GetCounts`.
One grpcio channel is one HTTP/2 connection (a local subchannel pool), so "another connection"
is another channel. Agents send a 20 s deadline: the calls path keeps a 5 s handler margin, and
the server gets at most upstream_rpc_timeout_ms (5 s) of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from actors.agents.api import DeliverCommand, owner_row
from actors.heartbeat.api import NAME as HEARTBEAT_BUFFER
from actors.registry.api import GetCounts, RegistryCounts, pending_of
from actors.upstream.api import upstream_channel
from gateway.devstack.fake_upstream import FakeUpstream, Presented
from gateway.node.node import Node
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.api import SupervisorError, terminate_child
from tests.support.node import TEST_CONFIG, http_get, running_node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

Code = grpc.StatusCode
SERVICE = "/yuzu.agent.v1.AgentService/"
DEADLINE_S = 20.0
UNKNOWN_SESSION = "unknown session"


# -- the node and its agents ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def gateway(
    tmp_path: Path, extra: str = "", replace: tuple[str, str] = ("", "")
) -> AsyncIterator[tuple[Node, FakeUpstream]]:
    """A node whose default_channel dials a fresh fake server; waits for the connection.
    `replace` swaps one term of the test config for another."""
    async with FakeUpstream() as fake:
        config = tmp_path / "agent_plane.config"
        upstream = (
            "{upstream_client, #{channels => [{default_channel,"
            f' [{{http, "127.0.0.1", {fake.port}, []}}], #{{}}}}]}}}}{extra}'
        )
        text = TEST_CONFIG.read_text().replace("{allow_no_upstream, true}", upstream)
        if replace[0]:
            assert replace[0] in text, replace[0]
            text = text.replace(*replace)
        config.write_text(text)
        async with running_node(tmp_path, YUZU_GW_CONFIG=str(config)) as node:
            await until(lambda: _live(node), "the upstream connection")
            yield node, fake


def _live(node: Node) -> bool:
    assert node.runtime is not None
    channel = upstream_channel(node.runtime)
    return channel is not None and channel.live_connections() == 1  # type: ignore[attr-defined]


async def until(predicate: Any, what: str, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Agent:
    """One grpcio channel: one HTTP/2 connection to the agent listener."""

    def __init__(self, node: Node) -> None:
        port = node.ctx.bound["listener_agent"][1]
        self.channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )

    def unary(self, method: str, response: type[Any]) -> Any:
        return self.channel.unary_unary(
            SERVICE + method,
            request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
            response_deserializer=response.FromString,
        )

    async def register(
        self, agent_id: str | None = "agent-1", observed: str = ""
    ) -> agent_pb2.RegisterResponse:
        request = agent_pb2.RegisterRequest(gateway_observed_peer=observed)
        if agent_id is not None:
            request.info.agent_id = agent_id
        request.info.plugins.add(name="os")
        call = self.unary("Register", agent_pb2.RegisterResponse)
        return await call(request, timeout=DEADLINE_S)

    async def heartbeat(self, session_id: str) -> agent_pb2.HeartbeatResponse:
        call = self.unary("Heartbeat", agent_pb2.HeartbeatResponse)
        return await call(agent_pb2.HeartbeatRequest(session_id=session_id), timeout=DEADLINE_S)

    async def inventory(self, report: agent_pb2.InventoryReport | bytes) -> agent_pb2.InventoryAck:
        call = self.unary("ReportInventory", agent_pb2.InventoryAck)
        return await call(report, timeout=DEADLINE_S)

    def subscribe(self, session_id: str | None) -> grpc.aio.StreamStreamCall:
        call = self.channel.stream_stream(
            SERVICE + "Subscribe",
            request_serializer=agent_pb2.CommandResponse.SerializeToString,
            response_deserializer=agent_pb2.CommandRequest.FromString,
        )
        metadata = () if session_id is None else (("x-yuzu-session-id", session_id),)
        return call(metadata=metadata)

    async def close(self) -> None:
        await self.channel.close()


@contextlib.asynccontextmanager
async def agents(node: Node, count: int = 1) -> AsyncIterator[list[Agent]]:
    made = [Agent(node) for _ in range(count)]
    try:
        yield made
    finally:
        for agent in made:
            await agent.close()


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def counts(node: Node) -> RegistryCounts:
    assert node.runtime is not None
    registry = node.runtime.whereis("registry")
    assert registry is not None
    answer: RegistryCounts = await node.runtime.ask(registry, GetCounts(), 2.0)
    return answer


class Metrics:
    """`/metrics` read now; `delta` against an earlier read."""

    def __init__(self, text: str) -> None:
        self.text = text

    @classmethod
    async def read(cls, node: Node) -> Metrics:
        status, body = await http_get(node.ctx.bound["metrics"][1], "/metrics")
        assert status == 200
        return cls(body.decode())

    def value(self, name: str, **labels: str) -> float:
        wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
        pattern = "^" + re.escape(name + (f"{{{wanted}}}" if labels else "")) + r" (\S+)$"
        match = re.search(pattern, self.text, re.MULTILINE)
        assert match is not None, f"no series {name}{labels}"
        return float(match.group(1))

    def delta(self, earlier: Metrics, name: str, **labels: str) -> float:
        return self.value(name, **labels) - earlier.value(name, **labels)


def register_calls(fake: FakeUpstream) -> Sequence[Any]:
    return fake.calls("ProxyRegister")


def run(body: Any) -> None:
    asyncio.run(body())


# -- Register ------------------------------------------------------------------------------------


def test_register_round_trip_overwrites_the_observed_peer(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            answer = await agent.register("agent-1", observed="6.6.6.6")
            [call] = register_calls(fake)
            # The server got the gateway's attribution, never the agent's claim...
            assert call.request.gateway_observed_peer == "127.0.0.1"
            assert call.request.info.agent_id == "agent-1"
            # ...what is left of the agent's deadline, at most upstream_rpc_timeout_ms...
            assert call.deadline is not None and 0 < call.deadline <= 5.1
            # ...and its answer came back verbatim.
            assert answer == call.response
            assert answer.accepted and answer.session_id == fake.session_of("agent-1")
            assert node.runtime is not None
            row = pending_of(node.runtime, answer.session_id)
            assert row is not None and row.peer == "127.0.0.1" and row.plugins == ("os",)

            # accepted=false is relayed too, and leaves no pending row.
            fake.reject_agents("agent-2", reason="enrollment denied")
            denied = await agent.register("agent-2")
            assert not denied.accepted and denied.reject_reason == "enrollment denied"
            assert (await counts(node)).pending == 1
            assert (await counts(node)).reservations == 0

            # The listener tells the registry when the connection closes: its row goes after
            # the grace, and the connection takes nothing new meanwhile.
            await agent.close()
            for _ in range(100):
                if (await counts(node)).connections_down == 1:
                    break
                await asyncio.sleep(0.02)
            assert (await counts(node)).connections_down == 1

    run(body)


def test_the_agent_id_is_checked_first(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="yuzu_gw.agent")

    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            before = await Metrics.read(node)
            for agent_id in ("", None, "a" * 257, "é" * 129):  # 258 bytes in 129 characters
                error = await refused(agent.register(agent_id))
                assert error.code() is Code.INVALID_ARGUMENT
                assert error.details() == "agent_id length exceeds 256 bytes or is empty"
            assert register_calls(fake) == []
            assert (await counts(node)).reservations == 0
            after = await Metrics.read(node)
            assert (
                after.delta(before, "yuzu_gw_register_refused_total", reason="agent_id_length") == 4
            )
            # Exactly 256 bytes (multi-byte characters counted in bytes) is accepted.
            assert (await agent.register("é" * 128)).accepted
            assert len(register_calls(fake)) == 1
        lines = [r.getMessage() for r in caplog.records if "Register refused" in r.getMessage()]
        # Warn-limited: the first line at once, the size only, never the id.
        assert lines[0] == (
            "Register refused: the agent id is empty or longer than 256 bytes (size 0 bytes)"
        )
        assert len(lines) == 1 and "aaaa" not in " ".join(lines)

    run(body)


def test_twenty_concurrent_same_id_registers_at_cap_eight(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            fake.set_latency(0.5, "ProxyRegister")
            results = await asyncio.gather(
                *(agent.register("agent-1") for _ in range(20)), return_exceptions=True
            )
            capped = [
                r
                for r in results
                if isinstance(r, grpc.aio.AioRpcError)
                and r.code() is Code.UNAVAILABLE
                and "cap" in (r.details() or "")
            ]
            assert len(register_calls(fake)) == 8
            assert len(capped) == 12
            # Of the 8 sent, the newest committed row stays; the agent has one pending row.
            c = await counts(node)
            assert (c.pending, c.reservations) == (1, 0)

    run(body)


def test_forty_registers_of_one_agent_leave_one_pending_row(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            answers = [await agent.register("agent-1") for _ in range(40)]
            assert all(a.accepted for a in answers)
            assert len(register_calls(fake)) == 40
            c = await counts(node)
            assert (c.pending, c.reservations) == (1, 0)
            assert node.runtime is not None
            assert pending_of(node.runtime, answers[-1].session_id) is not None

    run(body)


def test_upstream_refusals_are_unavailable_and_never_sent(tmp_path: Path) -> None:
    async def body() -> None:
        extra = ", {circuit_breaker_reset_timeout_ms, 60000}"
        async with gateway(tmp_path, extra) as (node, fake), agents(node) as [agent]:
            fake.fail("ProxyRegister", Code.UNAVAILABLE, times=None)
            for _ in range(5):  # the server's own status: the agent sees INTERNAL
                assert (await refused(agent.register())).code() is Code.INTERNAL
            error = await refused(agent.register())  # the breaker is open now
            assert error.code() is Code.UNAVAILABLE and "circuit_open" in (error.details() or "")
            assert len(register_calls(fake)) == 5
            assert (await counts(node)).reservations == 0

    run(body)


def test_a_cancelled_register_frees_its_slot_and_permit_at_once(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            fake.freeze("ProxyRegister")
            call = agent.register()
            task = asyncio.ensure_future(call)
            await fake.wait_for_calls("ProxyRegister")
            assert (await counts(node)).reservations == 1
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await task
            for _ in range(100):
                if (await counts(node)).reservations == 0:
                    break
                await asyncio.sleep(0.02)
            assert (await counts(node)).reservations == 0
            metrics = await Metrics.read(node)
            assert metrics.value("yuzu_gw_upstream_permits_held", **{"class": "register"}) == 0
            # The call already sent is not cancelled: the server still answers it.
            fake.unfreeze("ProxyRegister")
            [sent] = await fake.wait_for_calls("ProxyRegister", answered=True)
            assert sent.code is Code.OK

    run(body)


# -- Subscribe -----------------------------------------------------------------------------------


def test_subscribe_refusals_end_with_their_own_status(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, _fake), agents(node, 2) as [a, b]:
            assert (await a.subscribe(None).code()) is Code.INVALID_ARGUMENT
            assert (await a.subscribe("gw-session-" + "0" * 32).code()) is Code.NOT_FOUND
            # A session pending on connection A, subscribed on connection B which already holds
            # eight: the slot cannot move, UNAVAILABLE, and the row stays for a retry.
            session = (await a.register("mover")).session_id
            for i in range(8):
                assert (await b.register(f"filler-{i}")).accepted
            assert (await b.subscribe(session).code()) is Code.UNAVAILABLE
            assert node.runtime is not None
            assert pending_of(node.runtime, session) is not None

    run(body)


def test_subscribe_while_agent_sup_is_down_is_internal_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="yuzu_gw.agent")

    async def body() -> None:
        async with gateway(tmp_path) as (node, _fake), agents(node) as [agent]:
            assert node.runtime is not None and node.root is not None
            with contextlib.suppress(SupervisorError):
                await terminate_child(node.runtime, node.root, "agent_sup")
            assert node.runtime.whereis("agent_sup") is None
            session = (await agent.register()).session_id
            call = agent.subscribe(session)
            assert (await call.code()) is Code.INTERNAL
            # The taken slot was handed back: nothing is left subscribing on the connection.
            c = await counts(node)
            assert (c.subscribing, c.pending) == (0, 0)
        [line] = [r.getMessage() for r in caplog.records if r.name == "yuzu_gw.agent"]
        assert line == "Subscribe failed: agent_sup_unavailable"

    run(body)


def test_a_subscribe_stream_carries_the_session_until_the_agent_leaves(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node, 2) as [agent, other]:
            runtime = node.runtime
            assert runtime is not None
            session = (await agent.register("agent-1")).session_id
            stream = agent.subscribe(session)
            await stream.initial_metadata()
            [connected] = await fake.wait_for_calls("NotifyStreamStatus")
            assert (connected.request.agent_id, connected.request.session_id) == (
                "agent-1",
                session,
            )
            assert connected.request.event == 0  # CONNECTED
            assert connected.request.peer_addr == "127.0.0.1"
            c = await counts(node)
            assert (c.agents, c.pending) == (1, 0)
            held = await Metrics.read(node)
            assert held.value("yuzu_gw_agents_current") == 1
            assert held.value("yuzu_gw_agents_connected_total") == 1
            # The session is now bound to the connection that opened the stream.
            assert (await agent.heartbeat(session)).acknowledged
            assert (await refused(other.heartbeat(session))).code() is Code.NOT_FOUND
            # The owner writes what it is given to the stream...
            row = owner_row(runtime, session)
            assert row is not None
            command = agent_pb2.CommandRequest(command_id="c1", plugin="os", action="info")
            runtime.tell(row.owner, DeliverCommand(command))
            assert await asyncio.wait_for(stream.read(), 5) == command
            # ...and the agent's frames reach it: an unsolicited Guardian event goes upstream
            # under the stream's agent id, whatever the frame claims.
            await stream.write(agent_pb2.CommandResponse(plugin="__guard__", output="evil"))
            [guard] = await fake.wait_for_calls("ForwardGuardianMessage")
            assert guard.request.agent_id == "agent-1"
            # The agent leaves: its owner ends and the server hears DISCONNECTED once.
            stream.cancel()
            [_, gone] = await fake.wait_for_calls("NotifyStreamStatus", count=2)
            assert gone.request.event == 1 and gone.request.session_id == session
            assert gone.request.stream_home_id == connected.request.stream_home_id
            await until(lambda: owner_row(runtime, session) is None, "the owner to end")
            assert (await counts(node)).agents == 0
            assert (await Metrics.read(node)).value("yuzu_gw_agents_current") == 0

    run(body)


def test_an_undecodable_frame_ends_the_stream_internal(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            session = (await agent.register()).session_id
            raw = agent.channel.stream_stream(
                SERVICE + "Subscribe",
                request_serializer=lambda b: b,
                response_deserializer=agent_pb2.CommandRequest.FromString,
            )
            stream = raw(metadata=(("x-yuzu-session-id", session),))
            await fake.wait_for_calls("NotifyStreamStatus")
            await stream.write(b"\x0a\x05ab")  # command_id: 5 bytes announced, 2 sent
            assert await asyncio.wait_for(stream.code(), 5) is Code.INTERNAL
            [_, gone] = await fake.wait_for_calls("NotifyStreamStatus", count=2)
            assert gone.request.event == 1  # the owner ended: DISCONNECTED

    run(body)


def test_an_owner_that_dies_ends_its_stream_unavailable(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            runtime = node.runtime
            assert runtime is not None
            # The restarted owner cannot present the session again, so it does not recover it
            # (the recovery itself: tests/integration/test_owner_recovery.py).
            fake.presented_known = Presented.REFUSE
            session = (await agent.register()).session_id
            stream = agent.subscribe(session)
            await fake.wait_for_calls("NotifyStreamStatus")
            row = owner_row(runtime, session)
            assert row is not None
            runtime.kill(row.owner)
            assert await asyncio.wait_for(stream.code(), 10) is Code.UNAVAILABLE
            # Exactly one DISCONNECTED for the killed owner's stream home.
            await fake.wait_for_calls("NotifyStreamStatus", count=2)
            await asyncio.sleep(0.2)
            events = [c.request.event for c in fake.calls("NotifyStreamStatus")]
            assert events == [0, 1]

    run(body)


# -- Heartbeat -----------------------------------------------------------------------------------


def test_heartbeat_admission_binds_the_session_to_its_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="yuzu_gw.agent")

    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node, 2) as [home, other]:
            session = (await home.register()).session_id
            before = await Metrics.read(node)
            ack = await home.heartbeat(session)
            assert ack.acknowledged and ack.server_time.millis_epoch > 0

            error = await refused(other.heartbeat(session))  # another connection
            assert (error.code(), error.details()) == (Code.NOT_FOUND, UNKNOWN_SESSION)
            error = await refused(home.heartbeat("gw-session-" + "f" * 32))
            assert (error.code(), error.details()) == (Code.NOT_FOUND, UNKNOWN_SESSION)

            after = await Metrics.read(node)
            mismatch = after.delta(
                before, "yuzu_gw_heartbeat_session_mismatch_total", event="security"
            )
            unknown = after.delta(
                before, "yuzu_gw_heartbeat_rejected_total", reason="unknown_session"
            )
            assert (mismatch, unknown) == (1, 1)
            for reason in ("no_connection", "registry_unavailable"):
                assert after.value("yuzu_gw_heartbeat_rejected_total", reason=reason) == 0
            assert node.runtime is not None
            if node.runtime.whereis(HEARTBEAT_BUFFER) is not None:
                # The admitted heartbeat reaches the server in a batch; the refused ones never.
                [batch] = await fake.wait_for_calls("BatchHeartbeat", timeout=5.0)
                assert [h.session_id for h in batch.request.heartbeats] == [session]
        messages = [r.getMessage() for r in caplog.records]
        assert (
            "Heartbeat admission is connection-bound: a heartbeat is admitted only on the"
            " connection that opened its session." in messages
        )
        # One summary within the interval (1 s in test.config), reason counts only.
        summaries = [m for m in messages if m.startswith("Heartbeat admission rejected")]
        assert summaries == [
            "Heartbeat admission rejected heartbeats since the last summary: connection_mismatch=1"
        ]

    run(body)


def test_a_killed_registry_rejects_heartbeats_until_agents_register_again(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node, 3) as held:
            runtime = node.runtime
            assert runtime is not None
            sessions = [(await a.register(f"agent-{i}")).session_id for i, a in enumerate(held)]
            streams = [a.subscribe(s) for a, s in zip(held, sessions, strict=True)]
            await fake.wait_for_calls("NotifyStreamStatus", count=3)
            assert (await counts(node)).agents == 3
            for agent, session in zip(held, sessions, strict=True):
                assert (await agent.heartbeat(session)).acknowledged
            before = await Metrics.read(node)
            registry = runtime.whereis("registry")
            assert registry is not None
            runtime.kill(registry)
            await until(
                lambda: runtime.whereis("registry") not in (None, registry), "registry restart"
            )
            for agent, session in zip(held, sessions, strict=True):
                error = await refused(agent.heartbeat(session))
                assert (error.code(), error.details()) == (Code.NOT_FOUND, UNKNOWN_SESSION)
            after = await Metrics.read(node)
            assert (
                after.delta(before, "yuzu_gw_heartbeat_rejected_total", reason="unknown_session")
                == 3
            )
            # The streams are still up: only the registry's state was lost.
            assert all(not s.done() for s in streams)
            # Registering again (as an agent does on NOT_FOUND) makes it admitted again.
            for i, agent in enumerate(held):
                session = (await agent.register(f"agent-{i}")).session_id
                assert (await agent.heartbeat(session)).acknowledged

    run(body)


# -- ReportInventory -----------------------------------------------------------------------------


def test_inventory_admission_size_and_relay(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node, 2) as [home, other]:
            session = (await home.register()).session_id
            before = await Metrics.read(node)

            report = agent_pb2.InventoryReport(session_id=session)
            report.plugin_data["os"] = b"linux"
            ack = await home.inventory(report)
            [call] = fake.calls("ProxyInventory")
            assert call.request == report and ack == call.response and ack.received

            # Over the server's 4194304-byte limit: INTERNAL, nothing sent.
            big = agent_pb2.InventoryReport(session_id=session)
            big.plugin_data["blob"] = b"x" * 4_194_304
            assert (await refused(home.inventory(big))).code() is Code.INTERNAL
            # Bytes that are not a protobuf message (session_id, field 1, cut short): INTERNAL,
            # nothing sent.
            assert (await refused(home.inventory(b"\x0a\x05ab"))).code() is Code.INTERNAL

            error = await refused(other.inventory(report))  # another connection
            assert (error.code(), error.details()) == (Code.NOT_FOUND, UNKNOWN_SESSION)
            unknown = agent_pb2.InventoryReport(session_id="gw-session-" + "e" * 32)
            assert (await refused(home.inventory(unknown))).code() is Code.NOT_FOUND

            assert len(fake.calls("ProxyInventory")) == 1
            await asyncio.sleep(0.05)  # the upstream actor counts the local refusals
            after = await Metrics.read(node)

            def delta(name: str, **labels: str) -> float:
                return after.delta(before, name, **labels)

            rejected = "yuzu_gw_inventory_rejected_total"
            assert delta(rejected, reason="connection_mismatch") == 1
            assert delta(rejected, reason="unknown_session") == 1
            errors = "yuzu_gw_upstream_rpc_errors_total"
            assert delta(errors, code="encode", rpc_name="inventory") == 2
            # Local refusals never move the breaker; heartbeat families are untouched.
            assert after.value("yuzu_gw_upstream_circuit_breaker_state", state="closed") == 1
            assert delta("yuzu_gw_heartbeat_session_mismatch_total", event="security") == 0

    run(body)


# -- the rest of the service ---------------------------------------------------------------------


def test_execute_command_and_updates_are_unimplemented_on_the_wire(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, _fake), agents(node) as [agent]:
            execute = agent.channel.unary_stream(
                SERVICE + "ExecuteCommand",
                request_serializer=agent_pb2.CommandRequest.SerializeToString,
                response_deserializer=agent_pb2.CommandResponse.FromString,
            )
            call = execute(agent_pb2.CommandRequest(command_id="c1"), timeout=DEADLINE_S)
            assert (await call.code()) is Code.UNIMPLEMENTED
            assert (await call.details()) == "Use Subscribe for command delivery"
            check = agent.unary("CheckForUpdate", agent_pb2.CheckForUpdateResponse)
            error = await refused(check(agent_pb2.CheckForUpdateRequest(), timeout=DEADLINE_S))
            assert error.code() is Code.UNIMPLEMENTED

    run(body)
