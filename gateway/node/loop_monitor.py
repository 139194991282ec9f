"""Event-loop stall measurement: a task of the node that wakes every `TICK_S` and records how
late it woke (the time the loop spent on something else: a long callback, a garbage
collection).

Three series on the node's registry. Their names are this rebuild's (the seed names no loop
gauges):

- `yuzu_gw_event_loop_lag_seconds`: the lateness of the latest wake-up;
- `yuzu_gw_event_loop_max_stall_seconds`: the longest lateness since the monitor started;
- `yuzu_gw_event_loop_stall_seconds`: a histogram of every wake-up's lateness, so the longest
  stall of any window (between two scrapes, or while a benchmark runs) is bounded by the
  highest bucket its observations reached, which an all-time maximum cannot tell;
- `yuzu_gw_event_loop_busy_stall_seconds`: the same lateness capped by the CPU time the loop's
  thread used meanwhile (`min(late, cpu)`): the part of a stall the node's own work can have
  caused. A late wake-up with little CPU used is the process waiting for a core (a host
  shared with other busy processes), not a long callback or a collection. It misses a stall
  spent blocked off-CPU in the node's own code (a synchronous read of a slow disk): the wall
  histogram has those.

The per-wake-up work is two clock reads, a subtraction, a comparison, a gauge set and a
histogram observation: about 100 a second, a few microseconds each.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable

import attrs
from prometheus_client import CollectorRegistry, Gauge, Histogram

from gateway.node.task import NodeTask

__all__ = [
    "BUSY_STALL",
    "LAG",
    "MAX_STALL",
    "STALL",
    "STALL_BUCKETS",
    "TICK_S",
    "LoopMonitor",
    "loop_gauges",
]

# 10 ms: fine enough to see a stall well under the 50 ms target, coarse enough to cost nothing.
TICK_S = 0.010

LAG = "yuzu_gw_event_loop_lag_seconds"
MAX_STALL = "yuzu_gw_event_loop_max_stall_seconds"
STALL = "yuzu_gw_event_loop_stall_seconds"
BUSY_STALL = "yuzu_gw_event_loop_busy_stall_seconds"
# Around the 50 ms stall target of issue 4 (docs/dev/benchmarks.md), up to a full collection of a
# large heap; below the tick (10 ms) a bucket says only "on time".
STALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@attrs.define
class LoopGauges:
    lag: Gauge
    max_stall: Gauge
    stalls: Histogram
    busy_stalls: Histogram


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, LoopGauges] = weakref.WeakKeyDictionary()


def loop_gauges(registry: CollectorRegistry) -> LoopGauges:
    """The loop series of `registry`, created once (registering a name twice raises)."""
    gauges = _BY_REGISTRY.get(registry)
    if gauges is None:
        gauges = LoopGauges(
            lag=Gauge(
                LAG, "How late the event loop monitor's latest wake-up was.", registry=registry
            ),
            max_stall=Gauge(
                MAX_STALL,
                "The longest event-loop stall (monitor wake-up lateness) since the node started.",
                registry=registry,
            ),
            stalls=Histogram(
                STALL,
                "How late each event loop monitor wake-up was (every 10 ms).",
                buckets=STALL_BUCKETS,
                registry=registry,
            ),
            busy_stalls=Histogram(
                BUSY_STALL,
                "How late each event loop monitor wake-up was, capped by the CPU time the"
                " loop's thread used meanwhile (the part of the stall the node's own work caused).",
                buckets=STALL_BUCKETS,
                registry=registry,
            ),
        )
        _BY_REGISTRY[registry] = gauges
    return gauges


@attrs.define
class LoopMonitor(NodeTask):
    """Owned by the node: `start` in `Node.start`, `stop` in `Node.stop`."""

    registry: CollectorRegistry
    tick_s: float = TICK_S
    # systemd's watchdog (gateway/node/sd_notify.py): called from this loop every
    # `watchdog_interval_s`, so a loop stalled longer than systemd's WatchdogSec= stops the
    # pings by itself and the unit restarts the node.
    watchdog: Callable[[], None] | None = None
    watchdog_interval_s: float | None = None
    max_stall_s: float = attrs.field(init=False, default=0.0)

    def start(self) -> None:
        if self.task is None:
            gauges = loop_gauges(self.registry)
            gauges.lag.set(0.0)
            gauges.max_stall.set(0.0)
            self._spawn(self._run(gauges), "loop_monitor")

    async def _run(self, gauges: LoopGauges) -> None:
        loop = asyncio.get_running_loop()
        tick = self.tick_s
        set_lag, set_max, observe = gauges.lag.set, gauges.max_stall.set, gauges.stalls.observe
        observe_busy = gauges.busy_stalls.observe
        cpu_clock = time.thread_time
        watchdog, interval = self.watchdog, self.watchdog_interval_s
        next_ping = loop.time()
        while True:
            if watchdog is not None and interval is not None and loop.time() >= next_ping:
                watchdog()
                next_ping = loop.time() + interval
            before, cpu_before = loop.time(), cpu_clock()
            await asyncio.sleep(tick)
            late = max(0.0, loop.time() - before - tick)
            set_lag(late)
            observe(late)
            observe_busy(min(late, cpu_clock() - cpu_before))
            if late > self.max_stall_s:
                self.max_stall_s = late
                set_max(late)
