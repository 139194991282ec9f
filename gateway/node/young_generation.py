"""The node's bound on the young generation's real size (supervisors/gc_policy.py says why the
collector's own threshold is not one): a task of the node that, every `YOUNG_CHECK_S`, collects
generation 0 when it holds more than `YOUNG_GENERATION_BOUND` objects, and counts it in
`yuzu_gw_gc_young_bounded_total` (a name of this rebuild's; the seed names no collector series).

Each such collection is also timed in `yuzu_gw_gc_pause_seconds{generation="0"}`, as the
collector's own are (actors/node/metrics.py).
"""

from __future__ import annotations

import asyncio

import attrs
from prometheus_client import CollectorRegistry, Counter

from gateway.node.task import NodeTask
from supervisors.gc_policy import YOUNG_CHECK_S, YOUNG_GENERATION_BOUND, collect_young_if_over

__all__ = ["BOUNDED", "YoungGenerationBound"]

BOUNDED = "yuzu_gw_gc_young_bounded_total"


@attrs.define
class YoungGenerationBound(NodeTask):
    """Owned by the node: `start` in `Node.start`, `stop` in `Node.stop`."""

    registry: CollectorRegistry
    bound: int = YOUNG_GENERATION_BOUND
    interval_s: float = YOUNG_CHECK_S

    def start(self) -> None:
        if self.task is None:
            bounded = Counter(
                BOUNDED,
                "Young-generation collections the node started because generation 0 held more"
                " than its bound of objects (the collector's threshold counts deallocations of"
                " old objects too, so it lets generation 0 grow past it).",
                registry=self.registry,
            )
            self._spawn(self._run(bounded), "young_generation_bound")

    async def _run(self, bounded: Counter) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if collect_young_if_over(self.bound) is not None:
                bounded.inc()
