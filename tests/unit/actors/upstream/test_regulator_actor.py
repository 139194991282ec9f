"""The `upstream_regulator` actor's wiring, through the real call path and a fake channel:
permits bound what is in flight, full queues and passed deadlines are refused (and never
sent) with their metrics, a cancelled caller frees its permit or place at once, and the server's
stream limit sizes the pools with the seed's log lines.

The pool's rules themselves are tested on the core (test_permits.py).
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from actors.core.breaker import Lane, ResultKind, State
from actors.core.permits import Caller
from actors.upstream.actor import Outcome, breaker_view
from actors.upstream.api import CHANNEL_ACTOR_NAME, PROXY_INVENTORY, PROXY_REGISTER, UpstreamRefused
from actors.upstream.regulator import GetPermits, PermitSnapshot
from protos.yuzu.agent.v1 import agent_pb2
from tests.support.actors import Harness, actor_test
from tests.support.fake_channel import (
    FakeChannel,
    FakeChannelOwner,
    UpstreamActors,
    start_upstream_actors,
    upstream_context,
)

LOGGER = "yuzu_gw.upstream_regulator"
ONE_PERMIT = "[{upstream_register_concurrency, 1}, {upstream_permit_queue_max, 2}]"


def start(
    h: Harness, config: str = "[]", channel: FakeChannel | None = None
) -> tuple[UpstreamActors, FakeChannel]:
    channel = channel or FakeChannel()
    return start_upstream_actors(h.create, upstream_context(config), channel), channel


async def register(
    h: Harness, actors: UpstreamActors, grpc_timeout_s: float | None = None
) -> agent_pb2.RegisterResponse:
    return await actors.calls(h.base).call(
        Caller.REGISTER,
        PROXY_REGISTER,
        agent_pb2.RegisterRequest(),
        agent_pb2.RegisterResponse,
        grpc_timeout_s=grpc_timeout_s,
    )


async def permits(h: Harness, actors: UpstreamActors) -> PermitSnapshot:
    snapshot = await h.ask(actors.regulator, GetPermits())
    assert isinstance(snapshot, PermitSnapshot)
    return snapshot


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def logged(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


@actor_test
async def test_at_most_n_calls_are_in_flight(h: Harness) -> None:
    actors, channel = start(h, "[{upstream_register_concurrency, 4}]")
    channel.latency["ProxyRegister"] = 0.02
    results = await asyncio.gather(*(register(h, actors) for _ in range(20)))
    assert len(results) == 20
    assert channel.peak_in_flight == 4
    registry = actors.ctx.registry
    assert sample(registry, "yuzu_gw_upstream_permit_wait_seconds_count") == 20
    # 4 at a time, 20 ms each: the last of five rounds waited about 80 ms
    assert sample(registry, "yuzu_gw_upstream_permit_wait_seconds_bucket", le="0.05") < 20
    await h.settle()
    snapshot = await permits(h, actors)
    assert snapshot.held == {"register": 0, "inventory": 0}
    assert sample(registry, "yuzu_gw_upstream_permits_held", **{"class": "register"}) == 0
    assert sample(registry, "yuzu_gw_upstream_permit_limit", **{"class": "register"}) == 4


@actor_test
async def test_pools_are_separate(h: Harness) -> None:
    actors, channel = start(h, ONE_PERMIT)
    channel.freeze()
    held = asyncio.create_task(register(h, actors))
    await h.wait_until(lambda: channel.in_flight == 1)
    inventory = asyncio.create_task(
        actors.calls(h.base).call(
            Caller.INVENTORY,
            PROXY_INVENTORY,
            agent_pb2.InventoryReport(),
            agent_pb2.InventoryAck,
            grpc_timeout_s=None,
        )
    )
    await h.wait_until(lambda: channel.in_flight == 2)  # not behind the register permit
    channel.unfreeze()
    await asyncio.gather(held, inventory)


@actor_test
async def test_a_full_queue_is_refused_at_once_with_its_metric(h: Harness) -> None:
    actors, channel = start(h, ONE_PERMIT)
    channel.freeze()
    tasks = [asyncio.create_task(register(h, actors)) for _ in range(3)]  # 1 holds, 2 wait
    await h.wait_until(lambda: channel.in_flight == 1)
    await h.settle()
    assert (await permits(h, actors)).waiting["register"] == 2
    registry = actors.ctx.registry
    assert sample(registry, "yuzu_gw_upstream_permits_waiting", **{"class": "register"}) == 2
    with pytest.raises(UpstreamRefused) as refused:
        await register(h, actors)
    assert refused.value.reason == "queue_full"
    assert sample(registry, "yuzu_gw_upstream_permit_refused_total", reason="queue_full") == 1
    assert sample(registry, "yuzu_gw_upstream_calls_dropped_total") == 0
    channel.unfreeze()
    await asyncio.gather(*tasks)
    assert len(channel.calls()) == 3


@actor_test
async def test_a_passed_deadline_is_refused_and_never_sent(h: Harness) -> None:
    actors, channel = start(h, ONE_PERMIT)
    channel.freeze()
    holder = asyncio.create_task(register(h, actors))
    await h.wait_until(lambda: channel.in_flight == 1)
    started = h.loop.time()
    with pytest.raises(UpstreamRefused) as refused:
        # grpc-timeout 5.2 s less the 5 s handler margin: 200 ms in the queue
        await register(h, actors, grpc_timeout_s=5.2)
    waited = h.loop.time() - started
    assert refused.value.reason == "deadline"
    assert 0.18 <= waited < 0.5
    registry = actors.ctx.registry
    assert sample(registry, "yuzu_gw_upstream_permit_refused_total", reason="deadline") == 1
    assert sample(registry, "yuzu_gw_upstream_calls_dropped_total") == 1
    # A grpc-timeout inside the margin leaves nothing: refused at once, even with a free permit.
    channel.unfreeze()
    await holder
    with pytest.raises(UpstreamRefused) as refused:
        await register(h, actors, grpc_timeout_s=4.0)
    assert refused.value.reason == "deadline"
    assert len(channel.calls()) == 1  # neither refused request reached the channel


@actor_test
async def test_the_call_gets_what_is_left_of_the_deadline_at_most_the_rpc_timeout(
    h: Harness,
) -> None:
    actors, channel = start(h, "[{upstream_rpc_timeout_ms, 2000}, {upstream_call_timeout_ms, 900}]")
    await register(h, actors, grpc_timeout_s=30.0)
    await register(h, actors, grpc_timeout_s=5.5)
    await register(h, actors)  # no grpc-timeout: upstream_call_timeout_ms
    first, second, third = (s.timeout for s in channel.calls())
    assert first == pytest.approx(2.0, abs=0.05)
    assert second == pytest.approx(0.5, abs=0.05)
    assert third == pytest.approx(0.9, abs=0.05)


@actor_test
async def test_cancelled_callers_free_their_place_and_their_permit_at_once(h: Harness) -> None:
    actors, channel = start(h, ONE_PERMIT)
    channel.freeze()
    holder = asyncio.create_task(register(h, actors))
    await h.wait_until(lambda: channel.in_flight == 1)
    waiter = asyncio.create_task(register(h, actors))
    await h.settle()
    assert (await permits(h, actors)).waiting["register"] == 1

    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    await h.settle()
    snapshot = await permits(h, actors)
    assert snapshot.waiting["register"] == 0 and snapshot.held["register"] == 1

    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)
    await h.settle()
    assert (await permits(h, actors)).held["register"] == 0
    assert channel.in_flight == 1  # the call already sent runs on
    # The freed permit goes to the next caller at once.
    channel.unfreeze()
    await register(h, actors)
    await h.settle()
    assert len(channel.calls()) == 2


@actor_test
async def test_a_breaker_that_opened_while_waiting_stops_the_call(h: Harness) -> None:
    actors, channel = start(h, ONE_PERMIT + "")
    channel.freeze()
    holder = asyncio.create_task(register(h, actors))
    await h.wait_until(lambda: channel.in_flight == 1)
    waiter = asyncio.create_task(register(h, actors))
    await h.settle()
    view = breaker_view(h.base)
    assert view is not None
    for _ in range(5):
        h.tell(
            actors.upstream,
            Outcome(
                view.incarnation, view.epoch, Lane.INVENTORY, PROXY_INVENTORY, ResultKind.TRANSPORT
            ),
        )
    await h.settle()
    assert breaker_view(h.base).state is State.OPEN  # type: ignore[union-attr]
    channel.unfreeze()
    await holder
    with pytest.raises(UpstreamRefused) as refused:
        await waiter
    assert refused.value.reason == "circuit_open"
    assert len(channel.calls()) == 1
    await h.settle()
    assert (await permits(h, actors)).held["register"] == 0


@actor_test
async def test_the_server_stream_limit_sizes_the_pools_with_the_log_lines(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    actors, channel = start(h, channel=FakeChannel(max_streams=128))
    await h.settle()
    assert (await permits(h, actors)).limits == {"register": 48, "inventory": 8, "replay": 24}
    assert logged(caplog) == []  # 128 leaves 67 for 56: nothing changes

    channel.set_server_max_streams(100)
    await h.settle()
    snapshot = await permits(h, actors)
    assert snapshot.limits == {"register": 33, "inventory": 6, "replay": 16}
    assert snapshot.server_max_streams == 100
    registry = actors.ctx.registry
    limit = "yuzu_gw_upstream_permit_limit"
    assert sample(registry, limit, **{"class": "register"}) == 33
    assert sample(registry, limit, **{"class": "inventory"}) == 6
    assert sample(registry, limit, **{"class": "replay"}) == 16

    channel.set_server_max_streams(50)
    await h.settle()
    assert (await permits(h, actors)).limits == {"register": 1, "inventory": 1, "replay": 1}

    channel.set_server_max_streams(0)  # the connection went: no limit known
    await h.settle()
    assert (await permits(h, actors)).limits == {"register": 48, "inventory": 8, "replay": 24}
    assert logged(caplog) == [
        (
            logging.INFO,
            "Upstream permits lowered to the server's stream limit: register 33 of 48, replay "
            "16 of 24, inventory 6 of 8 (the server allows 100 concurrent streams; 61 are kept "
            "for the lanes that take no permit)",
        ),
        (
            logging.WARNING,
            "The server allows 50 concurrent streams on the gateway's connections; the "
            "gateway's other upstream lanes need 61 (10 stream-status notifications, 50 "
            "Guardian forwards, 1 heartbeat flush), so each permit pool is cut to 1 and those "
            "lanes can hit the server's limit too. Raise the server's "
            "--grpc-max-concurrent-streams (not the channel's pool_size).",
        ),
        (
            logging.INFO,
            "Upstream permits lowered to the server's stream limit: register 1 of 48, replay 1 "
            "of 24, inventory 1 of 8 (the server allows 50 concurrent streams; 61 are kept for "
            "the lanes that take no permit)",
        ),
        (
            logging.INFO,
            "Upstream permits in force: register 48, replay 24, inventory 8 (server stream "
            "limit: unknown)",
        ),
    ]


@actor_test
async def test_a_lower_limit_takes_nothing_away(h: Harness) -> None:
    actors, channel = start(h, "[{upstream_register_concurrency, 4}]")
    channel.freeze()
    tasks = [asyncio.create_task(register(h, actors)) for _ in range(6)]
    await h.wait_until(lambda: channel.in_flight == 4)
    channel.set_server_max_streams(63)  # 2 left after the 61 reserved: register 1
    await h.settle()
    snapshot = await permits(h, actors)
    assert snapshot.held["register"] == 4 and snapshot.waiting["register"] == 2
    assert snapshot.limits["register"] == 1
    channel.unfreeze()
    await asyncio.gather(*tasks)
    assert channel.peak_in_flight == 4


@actor_test
async def test_the_limit_is_read_at_start_and_again_after_a_channel_restart(h: Harness) -> None:
    channel = FakeChannel(max_streams=100)
    actors, _ = start(h, channel=channel)
    await h.settle()
    assert (await permits(h, actors)).limits["register"] == 33
    assert actors.channel_owner is not None
    h.base.kill(actors.channel_owner)  # no chance to tell anyone
    regulator = h.instance(actors.regulator)
    # Found gone at the next look (every second): unknown, so the configured sizes apply.
    await h.wait_until(lambda: regulator.pool.limits.register == 48, 3.0)
    h.create(FakeChannelOwner, FakeChannel(max_streams=70), CHANNEL_ACTOR_NAME)
    await h.wait_until(lambda: regulator.pool.limits.register == 7, 3.0)


@actor_test
async def test_a_planned_stop_refuses_the_waiters(h: Harness) -> None:
    actors, channel = start(h, ONE_PERMIT)
    channel.freeze()
    holder = asyncio.create_task(register(h, actors))
    await h.wait_until(lambda: channel.in_flight == 1)
    waiter = asyncio.create_task(register(h, actors))
    await h.settle()
    await h.base.stop(actors.regulator, 1.0)
    with pytest.raises(UpstreamRefused) as refused:
        await waiter
    assert refused.value.reason == "stopping"
    with pytest.raises(UpstreamRefused) as refused:
        await register(h, actors)
    assert refused.value.reason == "unavailable"
    channel.unfreeze()
    await holder  # the call in flight finishes; its release goes nowhere, harmlessly


@actor_test
async def test_a_replay_cap_above_the_register_pool_is_warned_once(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    actors, _ = start(h, "[{upstream_register_concurrency, 10}, {upstream_replay_concurrency, 20}]")
    assert (await permits(h, actors)).limits == {"register": 10, "inventory": 8, "replay": 5}
    [(level, line)] = logged(caplog)
    assert level == logging.WARNING and "upstream_replay_concurrency is 20" in line
