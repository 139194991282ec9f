"""`/readyz` on a real node: every check of the seed ("Readiness"; SPEC_INDEX HL-03..HL-05) is
named in the body, and each one, turned false the way it fails in production, makes `/readyz`
answer 503 with that check named (and only the checks that really fail with it).

How each is turned false: the actor behind an aliveness check is stopped through its supervisor
(`terminate_child`, so it stays down while the probe runs) and started again, which turns
`/readyz` back to 200; the breaker opens after consecutive failed registrations against a fake
server; an upstream channel whose CA file is missing fails on TLS files; shedding is driven by a
fake memory reader."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import grpc.aio
import pytest

from gateway.devstack.fake_upstream import FakeUpstream
from gateway.node import memory_reader
from gateway.node.node import Node
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.api import restart_child, terminate_child
from tests.support.node import TEST_CONFIG, http_get, running_node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

EVERY_CHECK = {
    "registry",
    "upstream",
    "agent_sup",
    "router",
    "sessions_index",
    "upstream_tls_files",
    "circuit_breaker",
    "listeners",
    "memory_shedding",
}


async def readyz(node: Node) -> tuple[int, dict[str, object]]:
    status, body = await http_get(node.ctx.bound["health"][1], "/readyz")
    return status, json.loads(body)


async def until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def assert_not_ready(node: Node, failing: set[str]) -> None:
    status, body = await readyz(node)
    assert status == 503
    assert body["status"] == "not_ready"
    assert set(body["failing"]) == failing  # type: ignore[arg-type]
    checks = body["checks"]
    assert isinstance(checks, dict)
    assert {name for name, ok in checks.items() if not ok} == failing


def node_config(tmp_path: Path, replacement: str) -> Path:
    config = tmp_path / "readiness.config"
    config.write_text(TEST_CONFIG.read_text().replace("{allow_no_upstream, true}", replacement))
    return config


def test_the_body_names_every_check_of_the_specification(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as node:
            status, body = await readyz(node)
            assert status == 200
            assert body["status"] == "ready"
            assert set(body["checks"]) == EVERY_CHECK  # type: ignore[arg-type]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("child", "failing"),
    [
        ("registry", {"registry", "sessions_index"}),  # the index table dies with its owner
        ("upstream", {"upstream"}),  # no published breaker state: circuit_breaker passes
        ("agent_sup", {"agent_sup"}),
        ("router", {"router"}),
        ("listener_agent", {"listeners"}),
    ],
)
def test_a_child_that_is_down_turns_readyz_red_naming_its_check(
    tmp_path: Path, child: str, failing: set[str]
) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as node:
            assert node.runtime is not None and node.root is not None
            assert (await readyz(node))[0] == 200
            await terminate_child(node.runtime, node.root, child)
            await assert_not_ready(node, failing)
            await restart_child(node.runtime, node.root, child)
            assert (await readyz(node))[0] == 200

    asyncio.run(main())


def test_unusable_upstream_tls_files_turn_readyz_red(tmp_path: Path) -> None:
    missing_ca = tmp_path / "not-yet" / "ca.pem"

    async def main() -> None:
        # A port that completes TCP handshakes (the kernel's backlog), so the attempt gets as far
        # as TLS, which fails on the missing CA file before a byte is sent.
        with socket.create_server(("127.0.0.1", 0)) as server:
            upstream = (
                '{upstream_client, #{channels => [{default_channel, [{https, "127.0.0.1",'
                f" {server.getsockname()[1]}, [{{verify, verify_peer}},"
                f' {{cacertfile, "{missing_ca}"}}]}}], #{{}}}}]}}}}'
            )
            config = node_config(tmp_path, upstream)
            async with running_node(tmp_path, YUZU_GW_CONFIG=str(config)) as node:
                await until(
                    lambda: not node.ctx.readiness.evaluate()["upstream_tls_files"],
                    "the channel's first attempt",
                )
                await assert_not_ready(node, {"upstream_tls_files"})

    asyncio.run(main())


@contextlib.asynccontextmanager
async def agent_channel(node: Node) -> AsyncIterator[grpc.aio.Channel]:
    port = node.ctx.bound["listener_agent"][1]
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
    )
    try:
        yield channel
    finally:
        await channel.close()


def test_an_open_circuit_breaker_turns_readyz_red(tmp_path: Path) -> None:
    async def main() -> None:
        async with FakeUpstream() as fake:
            upstream = (
                "{upstream_client, #{channels => [{default_channel,"
                f' [{{http, "127.0.0.1", {fake.port}, []}}], #{{}}}}]}}}}'
            )
            config = node_config(tmp_path, upstream)
            async with running_node(tmp_path, YUZU_GW_CONFIG=str(config)) as node:
                assert (await readyz(node))[0] == 200
                # INTERNAL counts against the breaker; five in a row open it.
                fake.fail("ProxyRegister", grpc.StatusCode.INTERNAL, times=None)
                async with agent_channel(node) as channel:
                    register = channel.unary_unary(
                        "/yuzu.agent.v1.AgentService/Register",
                        request_serializer=agent_pb2.RegisterRequest.SerializeToString,
                        response_deserializer=agent_pb2.RegisterResponse.FromString,
                    )
                    for attempt in range(10):
                        if not node.ctx.readiness.evaluate()["circuit_breaker"]:
                            break
                        request = agent_pb2.RegisterRequest()
                        request.info.agent_id = f"agent-{attempt}"
                        with pytest.raises(grpc.aio.AioRpcError):
                            await register(request, timeout=10)
                await assert_not_ready(node, {"circuit_breaker"})

    asyncio.run(main())


def test_memory_shedding_turns_readyz_red_naming_the_listeners_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    high, low = 200_000_000, 100_000_000
    used = {"bytes": 0}
    monkeypatch.setattr(memory_reader, "READER", lambda: used["bytes"])
    shedding = (
        "{allow_no_upstream, true}, {memory_shedding, #{interval_ms => 20,"
        f" high_water_bytes => {high}, low_water_bytes => {low}}}}}"
    )

    async def main() -> None:
        config = node_config(tmp_path, shedding)
        async with running_node(tmp_path, YUZU_GW_CONFIG=str(config)) as node:
            assert (await readyz(node))[0] == 200
            used["bytes"] = high
            await until(
                lambda: not node.ctx.readiness.evaluate()["memory_shedding"], "shedding to start"
            )
            # A suspended agent listener reads as not running (seed: "Readiness").
            await until(lambda: not node.ctx.readiness.evaluate()["listeners"], "the suspend")
            await assert_not_ready(node, {"listeners", "memory_shedding"})
            used["bytes"] = low
            await until(lambda: all(node.ctx.readiness.evaluate().values()), "the resume")
            assert (await readyz(node))[0] == 200

    asyncio.run(main())
