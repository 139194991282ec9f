"""The slow-server gauge (seed M18, "What happens when the server restarts > Slow server").

- `yuzu_gw_upstream_slow`: 1 when the upstream lanes' backpressure duty cycle over the last 60 s
  is 0.5 or more, else 0 (actors/core/slow_server.py). It exists at 0 from the first sampler
  start and reads 0 again while no sampler runs: a restarted sampler starts a fresh window.

One `SlowMetrics` per registry, so a restarted sampler finds its gauge again (registering a name
twice in one registry raises).
"""

from __future__ import annotations

import weakref

import attrs
from prometheus_client import CollectorRegistry, Gauge

__all__ = ["SLOW", "SlowMetrics", "slow_metrics"]

SLOW = "yuzu_gw_upstream_slow"


@attrs.define
class SlowMetrics:
    slow: Gauge

    def set_slow(self, slow: bool) -> None:
        self.slow.set(1.0 if slow else 0.0)


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, SlowMetrics] = (
    weakref.WeakKeyDictionary()
)


def slow_metrics(registry: CollectorRegistry) -> SlowMetrics:
    """The slow-server gauge of `registry`, created once, at 0."""
    metrics = _BY_REGISTRY.get(registry)
    if metrics is None:
        metrics = SlowMetrics(
            slow=Gauge(
                SLOW,
                "1 when the upstream lanes were saturated (permits waiting, every notification"
                " or Guardian slot held) for at least half of the last 60 s, else 0.",
                registry=registry,
            )
        )
        _BY_REGISTRY[registry] = metrics
    return metrics
