"""gRPC health, reflection and the RPC metrics on a real node (docs/health.md, docs/metrics.md).

In this process the health calls are grpcio generic calls with grpclib's own health messages
(the wire format is the service's); grpcio's own Health stub and reflection client run in a
subprocess (tests/support/grpcio_probe.py says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.reflection.v1.reflection_pb2 import ServerReflectionRequest, ServerReflectionResponse

from gateway.node import memory_reader
from gateway.node.boot import prepare
from gateway.node.node import Node
from tests.integration.test_agent_plane import Metrics, agents, gateway, refused
from tests.integration.test_mgmt_auth import Pki, mgmt_test, start
from tests.support.actors import Harness
from tests.support.certs import spki_sha256_hex
from tests.support.node import ROOT, TEST_CONFIG, node_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

AGENT = "yuzu.agent.v1.AgentService"
MGMT = "yuzu.server.v1.ManagementService"
SERVING = HealthCheckResponse.SERVING
NOT_SERVING = HealthCheckResponse.NOT_SERVING
HIGH, LOW = 200_000_000, 100_000_000
SERVER = "yuzu_gw_grpc_server_handled_total"
CLIENT = "yuzu_gw_grpc_client_handled_total"


def serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


class Health:
    """grpc.health.v1 over one grpcio channel (one connection) to a listener."""

    def __init__(self, node: Node, listener: str) -> None:
        port = node.ctx.bound[f"listener_{listener}"][1]
        self.channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self._check = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=serialize,
            response_deserializer=HealthCheckResponse.FromString,
        )
        self._watch = self.channel.unary_stream(
            "/grpc.health.v1.Health/Watch",
            request_serializer=serialize,
            response_deserializer=HealthCheckResponse.FromString,
        )

    async def check(self, service: str) -> int:
        answer = await self._check(HealthCheckRequest(service=service), timeout=5)
        return int(answer.status)

    def watch(self, service: str) -> grpc.aio.UnaryStreamCall:
        return self._watch(HealthCheckRequest(service=service))


async def next_status(call: grpc.aio.UnaryStreamCall) -> int:
    answer = await asyncio.wait_for(call.read(), 5)
    assert answer is not grpc.aio.EOF
    return int(answer.status)


def server(method: str, code: str, service: str = AGENT, kind: str = "unary") -> dict[str, str]:
    # In the exposition's order (by name), which Metrics.value matches literally.
    return {
        "grpc_code": code,
        "grpc_method": method,
        "grpc_service": service,
        "grpc_type": kind,
    }


@contextlib.asynccontextmanager
async def shedding_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Node, dict[str, int]]]:
    used = {"bytes": 0}
    monkeypatch.setattr(memory_reader, "READER", lambda: used["bytes"])
    config = tmp_path / "health.config"
    config.write_text(
        TEST_CONFIG.read_text().replace(
            "{allow_no_upstream, true}",
            "{allow_no_upstream, true}, {memory_shedding, #{interval_ms => 20,"
            f" high_water_bytes => {HIGH}, low_water_bytes => {LOW}}}}}",
        )
    )
    node = Node(prepare(node_env(tmp_path, YUZU_GW_CONFIG=str(config))))
    await node.start()
    try:
        yield node, used
    finally:
        await node.stop()  # a no-op when the test stopped it


def test_health_follows_readiness_per_service_and_the_planned_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        async with shedding_node(tmp_path, monkeypatch) as (node, used):
            agent_health, mgmt_health = Health(node, "agent"), Health(node, "mgmt")
            before = await Metrics.read(node)
            assert await agent_health.check("") == SERVING
            assert await agent_health.check(AGENT) == SERVING
            assert await mgmt_health.check(MGMT) == SERVING
            # Each listener knows only its own services.
            missing = await refused(agent_health.check(MGMT))
            assert missing.code() is grpc.StatusCode.NOT_FOUND
            agent_watch, mgmt_watch = agent_health.watch(AGENT), mgmt_health.watch(MGMT)
            assert await next_status(agent_watch) == SERVING
            assert await next_status(mgmt_watch) == SERVING

            # Shedding: the agent side goes NOT_SERVING on the connection it keeps; management
            # is not shed.
            used["bytes"] = HIGH
            assert await next_status(agent_watch) == NOT_SERVING
            assert await agent_health.check("") == NOT_SERVING
            assert await mgmt_health.check(MGMT) == SERVING
            used["bytes"] = LOW
            assert await next_status(agent_watch) == SERVING

            # RPC metrics: Health's own calls, and a status a handler writes in its trailers
            # (NOT_FOUND for a session the node does not hold).
            async with agents(node) as [agent]:
                lost = await refused(agent.heartbeat("gw-session-" + "0" * 32))
            after = await Metrics.read(node)
            check = "grpc.health.v1.Health"
            assert after.delta(before, SERVER, **server("Check", "OK", check)) >= 4
            assert after.delta(before, SERVER, **server("Check", "NOT_FOUND", check)) == 1
            code = lost.code().name
            assert after.delta(before, SERVER, **server("Heartbeat", code)) == 1
            assert (
                after.value(
                    "yuzu_gw_grpc_server_handling_seconds_count",
                    grpc_method="Heartbeat",
                    grpc_service=AGENT,
                    grpc_type="unary",
                )
                >= 1
            )
            assert after.value("yuzu_gw_readiness_check", check="memory_shedding") == 1

            # The planned stop's drain: management's Watch hears NOT_SERVING at once.
            stop = asyncio.get_running_loop().create_task(node.stop())
            assert await next_status(mgmt_watch) == NOT_SERVING
            await stop
            for channel in (agent_health.channel, mgmt_health.channel):
                await channel.close()

    asyncio.run(body())


async def probe(port: int, *services: str) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.grpcio_probe",
        f"127.0.0.1:{port}",
        *services,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0
    result: dict[str, Any] = json.loads(out)
    return result


def test_grpcio_stubs_upstream_metrics_and_the_scrape_formats(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path, ", {grpc_reflection, [agent]}") as (node, fake):
            before = await Metrics.read(node)
            # grpcio's own Health stub and reflection client: reflection is on for `agent` only.
            agent_side = await probe(node.ctx.bound["listener_agent"][1], "", AGENT, MGMT)
            assert agent_side["health"] == {"": "SERVING", AGENT: "SERVING", MGMT: "NOT_FOUND"}
            assert AGENT in agent_side["services"]
            assert "grpc.health.v1.Health" in agent_side["services"]
            # Described from the proto, which declares more methods than the gateway routes.
            assert {"Register", "Heartbeat", "ReportInventory", "Subscribe"} <= set(
                agent_side["agent_methods"]
            )
            with pytest.raises(AssertionError):  # no reflection on `mgmt`: the probe fails
                await probe(node.ctx.bound["listener_mgmt"][1], MGMT)

            # Upstream calls by status.
            async with agents(node) as [agent]:
                assert (await agent.register("agent-1")).accepted
                fake.fail("ProxyRegister", grpc.StatusCode.INTERNAL, details="boom")
                failed = await refused(agent.register("agent-2"))
            after = await Metrics.read(node)
            upstream = "yuzu.gateway.v1.GatewayUpstream"
            ok = server("ProxyRegister", "OK", upstream)
            assert after.delta(before, CLIENT, **ok) == 1
            internal = server("ProxyRegister", "INTERNAL", upstream)
            assert after.delta(before, CLIENT, **internal) == 1
            # What the agent was told is what the agent listener counted.
            assert after.delta(before, SERVER, **server("Register", failed.code().name)) == 1
            assert 'yuzu_gw_build_info{grpclib="' in after.text

            # /metrics: OpenMetrics when asked, gzip when accepted.
            port = node.ctx.bound["metrics"][1]
            head, payload = await raw_get(
                port,
                "Accept: application/openmetrics-text; version=1.0.0\r\nAccept-Encoding: gzip\r\n",
            )
            assert "content-encoding: gzip" in head.lower()
            assert "application/openmetrics-text" in head
            text = gzip.decompress(payload).decode()
            assert text.rstrip().endswith("# EOF")
            assert "yuzu_gw_grpc_server_handled_total" in text

    asyncio.run(body())


async def raw_get(port: int, headers: str) -> tuple[str, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.decode("latin-1"), body


def test_management_health_is_answered_before_authorisation_and_reflection_after(
    tmp_path: Path,
) -> None:
    """A judged management listener (mutual TLS, pin mode): an agent's certificate (no
    serverAuth) gets Health's answer and nothing else; the server's gets reflection too."""
    pki = Pki(tmp_path)
    agent = pki.leaf("agent", server_auth=False)
    pin = f'{{mgmt_peer_pins, [{{spki_sha256, "{spki_sha256_hex(pki.server.cert)}"}}]}}'

    def reflection(chan: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:
        return chan.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=serialize,
            response_deserializer=ServerReflectionResponse.FromString,
        )(timeout=5)

    async def body(h: Harness) -> None:
        gw = start(h, pki, pin + ", {grpc_reflection, [mgmt]}")
        for leaf, authorised in ((agent, False), (pki.server, True)):
            async with gw.client(leaf) as chan:
                health = chan.unary_unary(
                    "/grpc.health.v1.Health/Check",
                    request_serializer=serialize,
                    response_deserializer=HealthCheckResponse.FromString,
                )
                answer = await health(HealthCheckRequest(service=MGMT), timeout=5)
                assert answer.status == SERVING
                call = reflection(chan)
                if authorised:
                    await call.write(ServerReflectionRequest(list_services=""))
                    listed = await call.read()
                    names = {s.name for s in listed.list_services_response.service}
                    assert names == {MGMT, "grpc.health.v1.Health"}
                    await call.done_writing()
                else:  # refused before the handler reads a request
                    assert await call.code() is grpc.StatusCode.UNAUTHENTICATED
        assert gw.rejected("missing_server_auth_eku") == 1  # reflection, not Health
        assert gw.handler.calls == 0

    mgmt_test(body)
