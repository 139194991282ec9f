"""Retry hints on the wire: a refusal the gateway answers itself carries `grpc-retry-pushback-ms`
in its trailers, in its kind's range and jittered (gateway/listeners/retry_hint.py,
docs/agent-plane.md "Retry hints"). grpcio agents and operators against a real node whose
upstream is the fake server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest

from actors.router.api import ROUTER_NAME
from gateway.listeners.retry_hint import (
    BREAKER_HINT_MS,
    CAPACITY_HINT_MS,
    PUSHBACK_HEADER,
    SHORT_HINT_MS,
)
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.api import restart_child, terminate_child
from tests.integration.test_agent_plane import agents, counts, gateway, refused, register_calls, run
from tests.integration.test_management_plane import collect, command, operator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(40)]

Code = grpc.StatusCode


def hint(error: grpc.aio.AioRpcError) -> int:
    """The one pushback value in the call's trailers."""
    trailers = error.trailing_metadata()
    assert trailers is not None
    [value] = [v for k, v in trailers if k == PUSHBACK_HEADER]
    assert isinstance(value, str) and value.isdigit()
    return int(value)


def in_range(value: int, bounds: tuple[int, int]) -> bool:
    return bounds[0] <= value <= bounds[1]


def test_the_session_cap_refusal_carries_a_jittered_capacity_hint(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            fake.set_latency(0.5, "ProxyRegister")
            results = await asyncio.gather(
                *(agent.register("agent-1") for _ in range(20)), return_exceptions=True
            )
            capped = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
            assert len(capped) == 12 and len(register_calls(fake)) == 8
            for error in capped:
                assert (error.code(), error.details()) == (
                    Code.UNAVAILABLE,
                    "Register refused: cap",
                )
            hints = [hint(error) for error in capped]
            assert all(in_range(h, CAPACITY_HINT_MS) for h in hints), hints
            # Jittered: twelve agents refused at once are not told the same time.
            assert len(set(hints)) > 1
            # What the gateway answered OK carries no hint.
            assert sum(1 for r in results if isinstance(r, agent_pb2.RegisterResponse)) == 8

    run(body)


def test_breaker_and_permit_refusals_carry_their_hints(tmp_path: Path) -> None:
    async def body() -> None:
        extra = (
            ", {circuit_breaker_reset_timeout_ms, 60000}"
            ", {upstream_register_concurrency, 1}, {upstream_permit_queue_max, 1}"
        )
        async with gateway(tmp_path, extra) as (node, fake), agents(node, 3) as [a, b, c]:
            # Permits: one Register holds the only permit, one waits, the third finds the queue
            # full and is refused before anything is sent.
            fake.freeze("ProxyRegister")
            held = asyncio.ensure_future(a.register("agent-a"))
            await fake.wait_for_calls("ProxyRegister")
            waiting = asyncio.ensure_future(b.register("agent-b"))
            await asyncio.sleep(0.2)
            error = await refused(c.register("agent-c"))
            assert (error.code(), error.details()) == (
                Code.UNAVAILABLE,
                "Upstream Register failed: queue_full",
            )
            assert in_range(hint(error), SHORT_HINT_MS)
            fake.unfreeze("ProxyRegister")
            assert (await held).accepted and (await waiting).accepted

            # The breaker: five server failures open it; then Register and ReportInventory are
            # refused at once, each with a breaker hint.
            session = (await a.register("agent-a")).session_id
            fake.fail("ProxyRegister", Code.UNAVAILABLE, times=None)
            for _ in range(5):
                assert (await refused(b.register("agent-b"))).code() is Code.INTERNAL
            error = await refused(b.register("agent-b"))
            assert (error.code(), error.details()) == (
                Code.UNAVAILABLE,
                "Upstream Register failed: circuit_open",
            )
            assert in_range(hint(error), BREAKER_HINT_MS)
            error = await refused(a.inventory(agent_pb2.InventoryReport(session_id=session)))
            assert error.code() is Code.UNAVAILABLE and "circuit_open" in (error.details() or "")
            assert in_range(hint(error), BREAKER_HINT_MS)
            assert (await counts(node)).reservations == 0

    run(body)


def test_send_command_without_a_router_carries_a_restart_hint(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, _fake), operator(node) as op:
            runtime = node.runtime
            assert runtime is not None and node.root is not None
            await terminate_child(runtime, node.root, ROUTER_NAME)
            call = op.send(command(), ("agent-1",))
            assert await collect(call) == ([], Code.UNAVAILABLE)
            assert await call.details() == "command router unavailable"
            trailers = await call.trailing_metadata()
            [value] = [v for k, v in trailers if k == PUSHBACK_HEADER]
            assert in_range(int(value), SHORT_HINT_MS)
            # Running again: a command is taken, and the stream that ends carries no hint.
            await restart_child(runtime, node.root, ROUTER_NAME)
            ok = op.send(command("c2"), ("nobody",))
            assert (await collect(ok))[1] is Code.OK
            assert PUSHBACK_HEADER not in dict(await ok.trailing_metadata())

    run(body)
