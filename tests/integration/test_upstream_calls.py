"""The call path end to end: `UpstreamCalls` through the real upstream channel (grpclib) to the
grpcio fake server, with the `upstream` and `upstream_regulator` actors on a real runtime.

The breaker rules the issue names (5 failures open it, a probe closes it, neutral statuses never
move it), a dead server seen as a transport failure, the server's stream limit reaching the
permits, the grpc-timeout the server is told, and a call that outlives its cancelled caller.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from actors.core.breaker import ResultKind, State
from actors.core.permits import Caller
from actors.upstream.actor import breaker_view
from actors.upstream.api import (
    CHANNEL_ACTOR_NAME,
    PROXY_REGISTER,
    REGULATOR_NAME,
    UPSTREAM_NAME,
    UpstreamCallError,
    UpstreamRefused,
    upstream_channel,
)
from actors.upstream.regulator import GetPermits, PermitSnapshot
from gateway.devstack.fake_upstream import FakeUpstream
from gateway.upstream.channel_actor import UpstreamChannelActor
from protos.yuzu.agent.v1 import agent_pb2
from tests.support.actors import Harness, actor_test
from tests.support.fake_channel import UpstreamActors, start_upstream_actors, upstream_context
from tests.support.node import http_get, running_node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Code = grpc.StatusCode
REQUEST_FAULTS = (
    Code.INVALID_ARGUMENT,
    Code.NOT_FOUND,
    Code.ALREADY_EXISTS,
    Code.FAILED_PRECONDITION,
    Code.OUT_OF_RANGE,
)


async def start(h: Harness, fake: FakeUpstream, extra: str = "") -> UpstreamActors:
    """The channel actor dialling `fake`, then the two upstream actors; waits for the
    connection to be up."""
    endpoint = f'{{http, "127.0.0.1", {fake.port}, []}}'
    ctx = upstream_context(
        f"[{{upstream_client, #{{channels => [{{default_channel, [{endpoint}], #{{}}}}]}}}},"
        " {circuit_breaker_reset_timeout_ms, 200}, {circuit_breaker_max_reset_timeout_ms, 800}"
        f"{extra}]"
    )
    h.create(UpstreamChannelActor, ctx, CHANNEL_ACTOR_NAME)
    actors = start_upstream_actors(h.create, ctx)
    channel = upstream_channel(h.base)
    assert channel is not None
    await h.wait_until(lambda: channel.live_connections() == 1, 5.0, "a live connection")  # type: ignore[attr-defined]
    return actors


async def register(
    h: Harness, actors: UpstreamActors, grpc_timeout_s: float | None = None
) -> agent_pb2.RegisterResponse:
    request = agent_pb2.RegisterRequest()
    request.info.agent_id = "agent-1"
    return await actors.calls(h.base).call(
        Caller.REGISTER,
        PROXY_REGISTER,
        request,
        agent_pb2.RegisterResponse,
        grpc_timeout_s=grpc_timeout_s,
    )


def state(h: Harness) -> State:
    view = breaker_view(h.base)
    assert view is not None
    return view.state


async def failing(h: Harness, actors: UpstreamActors) -> UpstreamCallError:
    with pytest.raises(UpstreamCallError) as caught:
        await register(h, actors)
    return caught.value


@actor_test(timeout=30)
async def test_five_failures_open_it_and_a_probe_closes_it(h: Harness) -> None:
    async with FakeUpstream() as fake:
        actors = await start(h, fake)
        assert (await register(h, actors)).accepted
        fake.fail("ProxyRegister", Code.UNAVAILABLE, times=None, details="down for maintenance")
        for _ in range(5):
            error = await failing(h, actors)
            assert (error.kind, error.status) == (ResultKind.STATUS, 14)
        await h.settle()
        assert state(h) is State.OPEN
        with pytest.raises(UpstreamRefused) as refused:
            await register(h, actors)
        assert refused.value.reason == "circuit_open"
        assert len(fake.calls("ProxyRegister")) == 6  # 1 good, 5 failed, none while open

        fake.reset_script("ProxyRegister")  # the server recovers
        await h.wait_until(lambda: state(h) is State.HALF_OPEN, 2.0, "half-open")
        assert (await register(h, actors)).accepted  # the probe
        await h.settle()
        assert state(h) is State.CLOSED
        assert len(fake.calls("ProxyRegister")) == 7


@actor_test(timeout=30)
async def test_neutral_statuses_never_move_it(h: Harness) -> None:
    async with FakeUpstream() as fake:
        actors = await start(h, fake)
        for code in REQUEST_FAULTS * 4:
            fake.fail("ProxyRegister", code)
            error = await failing(h, actors)
            assert error.kind is ResultKind.STATUS
        await h.settle()
        assert state(h) is State.CLOSED
        # Four failures, then request faults, then one failure: the run was not reset.
        fake.fail("ProxyRegister", Code.INTERNAL, times=4)
        for _ in range(4):
            await failing(h, actors)
        for code in REQUEST_FAULTS:
            fake.fail("ProxyRegister", code)
            await failing(h, actors)
        await h.settle()
        assert state(h) is State.CLOSED
        fake.fail("ProxyRegister", Code.RESOURCE_EXHAUSTED)  # counted: "the only brake"
        await failing(h, actors)
        await h.settle()
        assert state(h) is State.OPEN
        # Half-open: request faults leave it half-open.
        await h.wait_until(lambda: state(h) is State.HALF_OPEN, 2.0, "half-open")
        for code in REQUEST_FAULTS:
            fake.fail("ProxyRegister", code)
            await failing(h, actors)
        await h.settle()
        assert state(h) is State.HALF_OPEN


@actor_test(timeout=30)
async def test_a_dead_server_is_a_transport_failure_the_breaker_sees(h: Harness) -> None:
    fake = FakeUpstream()
    await fake.start()
    actors = await start(h, fake, ", {circuit_breaker_failure_threshold, 3}")
    await fake.stop()
    channel = upstream_channel(h.base)
    assert channel is not None
    await h.wait_until(lambda: channel.live_connections() == 0, 5.0, "the connection lost")  # type: ignore[attr-defined]
    kinds = set()
    for _ in range(3):
        error = await failing(h, actors)
        kinds.add(error.kind)
    assert kinds <= {ResultKind.TRANSPORT, ResultKind.TIMEOUT}
    await h.settle()
    assert state(h) is State.OPEN
    registry = actors.ctx.registry
    total = sum(
        registry.get_sample_value(
            "yuzu_gw_upstream_rpc_errors_total", {"code": code, "rpc_name": "register"}
        )
        or 0
        for code in ("transport", "timeout")
    )
    assert total == 3


@actor_test(timeout=30)
async def test_the_server_stream_limit_sizes_the_permits(h: Harness) -> None:
    async with FakeUpstream(max_concurrent_streams=100) as fake:
        actors = await start(h, fake)
        regulator = h.instance(actors.regulator)
        await h.wait_until(lambda: regulator.pool.server_max_streams == 100, 5.0, "SETTINGS")
        snapshot = await h.ask(actors.regulator, GetPermits())
        assert isinstance(snapshot, PermitSnapshot)
        assert snapshot.limits == {"register": 33, "inventory": 6, "replay": 16}
        assert (await register(h, actors)).accepted


@actor_test(timeout=30)
async def test_the_server_is_told_what_is_left_of_the_deadline(h: Harness) -> None:
    async with FakeUpstream() as fake:
        actors = await start(h, fake)
        await register(h, actors, grpc_timeout_s=7.0)  # 2 s left after the 5 s margin
        await register(h, actors, grpc_timeout_s=60.0)  # at most upstream_rpc_timeout_ms
        first, second = fake.calls("ProxyRegister")
        assert first.deadline is not None and 1.8 < first.deadline <= 2.1
        assert second.deadline is not None and 4.8 < second.deadline <= 5.1


@actor_test(timeout=30)
async def test_a_cancelled_caller_frees_its_permit_and_the_call_runs_on(h: Harness) -> None:
    async with FakeUpstream() as fake:
        actors = await start(h, fake, ", {upstream_register_concurrency, 1}")
        fake.freeze("ProxyRegister")
        caller = asyncio.create_task(register(h, actors))
        await fake.wait_for_calls("ProxyRegister")
        caller.cancel()
        await asyncio.gather(caller, return_exceptions=True)
        await h.settle()
        snapshot = await h.ask(actors.regulator, GetPermits())
        assert snapshot.held["register"] == 0  # freed at once
        fake.unfreeze("ProxyRegister")
        [call] = await fake.wait_for_calls("ProxyRegister", answered=True)
        assert call.code == Code.OK  # not cancelled upstream
        assert (await register(h, actors)).accepted


def test_a_node_runs_both_actors_with_their_checks_and_metrics(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as node:
            assert node.runtime is not None
            assert node.runtime.whereis(UPSTREAM_NAME) is not None
            assert node.runtime.whereis(REGULATOR_NAME) is not None
            _, body = await http_get(node.ctx.bound["health"][1], "/readyz")
            checks = json.loads(body)["checks"]
            assert checks["upstream"] is True and checks["circuit_breaker"] is True
            status, body = await http_get(node.ctx.bound["metrics"][1], "/metrics")
            assert status == 200
            text = body.decode()
            for series in (
                'yuzu_gw_upstream_permit_limit{class="register"} 48.0',
                'yuzu_gw_upstream_permits_held{class="register"} 0.0',
                'yuzu_gw_upstream_permit_refused_total{reason="queue_full"} 0.0',
                'yuzu_gw_upstream_rpc_errors_total{code="encode",rpc_name="register"} 0.0',
                'yuzu_gw_upstream_rpc_errors_total{code="exception",rpc_name="batch_heartbeat"}'
                " 0.0",
                'yuzu_gw_upstream_circuit_breaker_state{state="closed"} 1.0',
            ):
                assert series in text, series

    asyncio.run(main())
