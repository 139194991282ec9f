"""The planned stop's permit refusals are counted (issue 7): from `StopAdmitting` on, and at the
regulator's own stop, every refusal `stopping` (proxied Register and inventory answered
UNAVAILABLE) moves `yuzu_gw_upstream_permit_refused_total{reason="stopping"}`, a series that
exists at 0 from the start. The rest of the regulator is tested in test_regulator_actor.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from actors.core.permits import Caller
from actors.node.api import StopAdmitting
from actors.upstream.api import PROXY_INVENTORY, UpstreamRefused
from protos.yuzu.agent.v1 import agent_pb2
from tests.support.actors import Harness, actor_test
from tests.support.fake_channel import UpstreamActors
from tests.unit.actors.upstream.test_regulator_actor import ONE_PERMIT, register, sample, start

REFUSED = "yuzu_gw_upstream_permit_refused_total"


async def refused_reason(call: asyncio.Future[object] | asyncio.Task[object]) -> str:
    with pytest.raises(UpstreamRefused) as refused:
        await call
    return refused.value.reason


@contextlib.asynccontextmanager
async def held_and_waiting(
    h: Harness, waiting: int
) -> AsyncIterator[tuple[UpstreamActors, list[asyncio.Future[object]]]]:
    """One register permit held by a call the frozen server does not answer, `waiting` calls
    queued behind it; the held call finishes after the block, neither refused nor counted."""
    actors, channel = start(h, ONE_PERMIT)
    channel.freeze()
    holder = asyncio.create_task(register(h, actors))
    await h.wait_until(lambda: channel.in_flight == 1)
    waiters = [asyncio.ensure_future(register(h, actors)) for _ in range(waiting)]
    await h.settle()
    yield actors, waiters
    channel.unfreeze()
    await holder


@actor_test
async def test_refusals_after_stop_admitting_are_counted_stopping(h: Harness) -> None:
    async with held_and_waiting(h, 1) as (actors, [waiter]):
        registry = actors.ctx.registry
        assert registry.get_sample_value(REFUSED, {"reason": "stopping"}) == 0
        h.base.tell(actors.regulator, StopAdmitting())
        # The waiter is refused at once, then every new request: a Register and an inventory
        # report.
        assert await refused_reason(waiter) == "stopping"
        assert await refused_reason(asyncio.ensure_future(register(h, actors))) == "stopping"
        inventory = actors.calls(h.base).call(
            Caller.INVENTORY,
            PROXY_INVENTORY,
            agent_pb2.InventoryReport(),
            agent_pb2.InventoryAck,
            grpc_timeout_s=None,
        )
        assert await refused_reason(asyncio.ensure_future(inventory)) == "stopping"
        assert sample(registry, REFUSED, reason="stopping") == 3
        assert sample(registry, REFUSED, reason="queue_full") == 0


@actor_test
async def test_waiters_refused_when_the_regulator_stops_are_counted(h: Harness) -> None:
    async with held_and_waiting(h, 2) as (actors, waiters):
        await h.base.stop(actors.regulator, 1.0)
        assert [await refused_reason(w) for w in waiters] == ["stopping", "stopping"]
        assert sample(actors.ctx.registry, REFUSED, reason="stopping") == 2
