"""The heartbeat buffer's metric families (seed M01, M02; the gauge is this rebuild's).

- `yuzu_gw_heartbeat_coalesced_total`: a buffered heartbeat replaced by a newer one of its session;
- `yuzu_gw_heartbeat_buffer_dropped_total{reason}`: see docs/heartbeat-buffer.md; every series
  of `INITIAL_SERIES` exists at 0 from the start;
- `yuzu_gw_heartbeat_buffer_sessions`: sessions buffered now, read at scrape time from the
  running actor's buffer (0 while no buffer actor runs).

One `HeartbeatMetrics` per registry, so a restarted actor finds its families again (registering
a name twice in one registry raises).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge

from actors.core.heartbeat_buffer import COALESCED, DROPPED, INITIAL_SERIES, Count
from actors.effects import count_into

__all__ = ["HeartbeatMetrics", "heartbeat_metrics"]


@attrs.define
class HeartbeatMetrics:
    coalesced: Counter
    dropped: Counter
    buffered_sessions: Gauge

    def count(self, effect: Count) -> None:
        """Apply one `Count` effect of the buffer core."""
        count_into({COALESCED: self.coalesced, DROPPED: self.dropped}, effect)

    def watch(self, sessions: Callable[[], int]) -> None:
        """Read the buffered-sessions gauge from `sessions` at scrape time."""
        self.buffered_sessions.set_function(lambda: float(sessions()))

    def unwatch(self) -> None:
        self.buffered_sessions.set_function(lambda: 0.0)


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, HeartbeatMetrics] = (
    weakref.WeakKeyDictionary()
)


def _create(registry: CollectorRegistry) -> HeartbeatMetrics:
    metrics = HeartbeatMetrics(
        coalesced=Counter(
            COALESCED,
            "Buffered heartbeats replaced by a newer heartbeat of the same session.",
            registry=registry,
        ),
        dropped=Counter(
            DROPPED,
            "Heartbeats dropped or changed by the buffer, by reason (heartbeat_invalid: repaired,"
            " among others).",
            ("reason",),
            registry=registry,
        ),
        buffered_sessions=Gauge(
            "yuzu_gw_heartbeat_buffer_sessions",
            "Sessions the heartbeat buffer holds now.",
            registry=registry,
        ),
    )
    for family, labels in INITIAL_SERIES:
        if family == COALESCED:
            metrics.coalesced.inc(0)
        elif family == DROPPED:
            metrics.dropped.labels(**dict(labels))
    metrics.unwatch()
    return metrics


def heartbeat_metrics(registry: CollectorRegistry) -> HeartbeatMetrics:
    """The families of `registry`, created (with their series at 0) on first use."""
    metrics = _BY_REGISTRY.get(registry)
    if metrics is None:
        metrics = _BY_REGISTRY[registry] = _create(registry)
    return metrics
