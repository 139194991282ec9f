"""`node_gauges`: samples the node gauges every `telemetry_gauge_interval_ms` (10 s; the Erlang
gateway's yuzu_gw_gauge) and times the garbage collections while it runs.

A sample is a few reads (the process's memory through `GaugesArgs.read_memory`, the runtime's
name registry, the heartbeat buffer's status) and sets the families of actors/node/metrics.py; it
never sends a message, so a stuck actor cannot hold it up. The families and what each kind means
are documented there. Its `GaugesArgs` are built by gateway/node/children/gauges.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from prometheus_client import CollectorRegistry
from thespian.actors import WakeupMessage

from actors.node.metrics import NodeMetrics, node_metrics
from supervisors.process import Process

if TYPE_CHECKING:
    from supervisors.address import Address
    from supervisors.reason import ExitReason

__all__ = ["GaugesArgs", "NodeGauges"]

_SAMPLE = "node_gauges_sample"


@attrs.frozen(eq=False)
class GaugesArgs:
    interval_ms: int
    registry: CollectorRegistry
    # The process's memory kinds in bytes (`rss`, `rss_anon`); {} when they cannot be read.
    read_memory: Callable[[], Mapping[str, int]]
    # The heartbeat buffer's registered name: its status carries the bytes it retains.
    heartbeat_buffer: str


class NodeGauges(Process):
    def init(self, args: GaugesArgs) -> None:
        self.interval_s = args.interval_ms / 1000
        self.read_memory = args.read_memory
        self.heartbeat_buffer = args.heartbeat_buffer
        self.metrics: NodeMetrics = node_metrics(args.registry)
        self.metrics.watch_gc()
        self.samples = 0
        self._sample()

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        match msg:
            case WakeupMessage(payload=payload) if payload == _SAMPLE:
                self._sample()
            case _:
                pass

    def terminate(self, reason: ExitReason) -> None:
        self.metrics.unwatch_gc()
        self.metrics.clear()

    def format_status(self) -> Mapping[str, Any]:
        return {"interval_s": self.interval_s, "samples": self.samples}

    def _sample(self) -> None:
        self.metrics.sample(self.runtime, self.read_memory(), self.heartbeat_buffer)
        self.samples += 1
        self.wakeupAfter(self.interval_s, _SAMPLE)
