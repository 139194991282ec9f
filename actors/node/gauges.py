"""`node_gauges`: samples the node gauges every `telemetry_gauge_interval_ms` (10 s; the Erlang
gateway's yuzu_gw_gauge) and times the garbage collections while it runs.

A sample is a few reads (one procfs file, the runtime's name registry, the heartbeat buffer's
status) and sets the families of actors/node/metrics.py; it never sends a message, so a stuck
actor cannot hold it up. The families and what each kind means are documented there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from thespian.actors import WakeupMessage

from actors.node.metrics import NodeMetrics, node_metrics
from gateway.config.keys.node import TELEMETRY_GAUGE_INTERVAL_MS
from supervisors.process import Process
from supervisors.supervisor import ChildSpec

if TYPE_CHECKING:
    from gateway.config.context import NodeContext
    from supervisors.address import Address
    from supervisors.reason import ExitReason

__all__ = ["NAME", "NodeGauges", "child_spec"]

NAME = "node_gauges"
_SAMPLE = "node_gauges_sample"


def child_spec(ctx: NodeContext) -> ChildSpec:
    return ChildSpec(NAME, NodeGauges, ctx, name=NAME)


class NodeGauges(Process):
    def init(self, args: NodeContext) -> None:
        self.interval_s = args.config[TELEMETRY_GAUGE_INTERVAL_MS] / 1000
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
        self.metrics.sample(self.runtime)
        self.samples += 1
        self.wakeupAfter(self.interval_s, _SAMPLE)
