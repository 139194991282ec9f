"""The event-loop monitor (gateway/node/loop_monitor.py): a blocked loop shows in the max-stall
gauge; `stop` cancels its task."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from gateway.node.loop_monitor import BUSY_STALL, LAG, MAX_STALL, STALL, LoopMonitor

BLOCK_S = 0.1


def _sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None
    return value


def test_a_blocked_loop_shows_in_the_max_stall_gauge() -> None:
    async def scenario() -> None:
        registry = CollectorRegistry()
        monitor = LoopMonitor(registry)
        monitor.start()
        await asyncio.sleep(0.05)  # the monitor is waiting on its tick
        asyncio.get_running_loop().call_soon(time.sleep, BLOCK_S)
        await asyncio.sleep(0.05)  # the block, then at least one more tick
        await asyncio.sleep(0.05)
        assert _sample(registry, MAX_STALL) >= 0.08
        assert _sample(registry, LAG) >= 0.0
        # Every wake-up is observed, and the block landed above the 50 ms bucket.
        count = _sample(registry, STALL + "_count")
        assert count >= 3
        assert _sample(registry, STALL + "_bucket", {"le": "+Inf"}) == count
        assert _sample(registry, STALL + "_bucket", {"le": "0.05"}) <= count - 1
        task = monitor.task
        assert task is not None and not task.done()
        await monitor.stop()
        assert task.cancelled()
        assert monitor.task is None
        await monitor.stop()  # a second stop is a no-op

    asyncio.run(scenario())


def test_two_monitors_on_one_registry_share_the_gauges() -> None:
    async def scenario() -> None:
        registry = CollectorRegistry()
        first = LoopMonitor(registry)
        first.start()
        await first.stop()
        second = LoopMonitor(registry)
        second.start()
        await asyncio.sleep(0.02)
        await second.stop()
        assert _sample(registry, MAX_STALL) >= 0.0

    asyncio.run(scenario())


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_busy_histogram_separates_work_on_the_loop_from_waiting_off_cpu() -> None:
    async def scenario() -> None:
        registry = CollectorRegistry()
        monitor = LoopMonitor(registry)
        monitor.start()
        await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        loop.call_soon(time.sleep, BLOCK_S)  # off CPU: the wall histogram only
        await asyncio.sleep(0.05)
        await asyncio.sleep(0.05)

        def over_50ms(name: str) -> float:
            return _sample(registry, name + "_count") - _sample(
                registry, name + "_bucket", {"le": "0.05"}
            )

        assert over_50ms(STALL) >= 1
        assert over_50ms(BUSY_STALL) == 0
        loop.call_soon(_burn, BLOCK_S)  # on CPU: both
        await asyncio.sleep(0.05)
        await asyncio.sleep(0.05)
        assert over_50ms(BUSY_STALL) >= 1
        await monitor.stop()

    asyncio.run(scenario())
