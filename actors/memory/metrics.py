"""The memory shedder's metric families (seed, "Node-wide memory load shedding" and "When a
suspend or resume fails"; SPEC_INDEX M36-M42), every series present at 0 from the start:

- `yuzu_gw_memory_shedding_active`: 1 from reaching the high-water mark until falling to the
  low-water mark;
- `yuzu_gw_memory_shedding_suspensions_total`: each time shedding began;
- `yuzu_gw_memory_shedding_transition_failures_total{action}`: each failed suspend or resume
  attempt (action `suspend` | `resume`);
- `yuzu_gw_memory_shedding_transition_failing{action}`: agent listeners whose last attempt
  failed and that have not moved since;
- `yuzu_gw_memory_shedding_high_water_bytes`, `..._low_water_bytes`: the resolved marks (0 while
  the shedder is not running);
- `yuzu_gw_memory_shedding_inactive`: 1 when shedding is enabled but cannot run (no memory limit
  readable with a fractional mark, or no memory sample on this platform); 0 while it runs, when
  it is disabled and when there is no agent listener to shed.

One `ShedderMetrics` per registry, so a restarted shedder finds its families again.
"""

from __future__ import annotations

import weakref

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge

from actors.core import Count
from actors.core.shedder_marks import RESUME, SUSPEND, SUSPENSIONS, TRANSITION_FAILURES, Action
from actors.effects import count_into

__all__ = ["ShedderMetrics", "shedder_metrics"]

ACTIONS: tuple[Action, ...] = (SUSPEND, RESUME)


@attrs.define
class ShedderMetrics:
    active: Gauge
    suspensions: Counter
    transition_failures: Counter
    transition_failing: Gauge
    high_water_bytes: Gauge
    low_water_bytes: Gauge
    inactive: Gauge

    def count(self, effect: Count) -> None:
        """Apply one `Count` effect of the shedder core."""
        counters = {SUSPENSIONS: self.suspensions, TRANSITION_FAILURES: self.transition_failures}
        count_into(counters, effect)

    def marks(self, high: int, low: int) -> None:
        self.high_water_bytes.set(high)
        self.low_water_bytes.set(low)

    def state(self, *, active: bool, failing: dict[Action, int]) -> None:
        self.active.set(1 if active else 0)
        for action in ACTIONS:
            self.transition_failing.labels(action=action).set(failing.get(action, 0))

    def not_running(self, *, inactive: bool) -> None:
        """The shedder does not sample: every gauge 0 but `inactive`."""
        self.marks(0, 0)
        self.state(active=False, failing={})
        self.inactive.set(1 if inactive else 0)


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, ShedderMetrics] = (
    weakref.WeakKeyDictionary()
)


def _create(registry: CollectorRegistry) -> ShedderMetrics:
    metrics = ShedderMetrics(
        active=Gauge(
            "yuzu_gw_memory_shedding_active",
            "1 while the gateway sheds (memory reached the high-water mark and has not yet fallen"
            " to the low-water mark), else 0.",
            registry=registry,
        ),
        suspensions=Counter(
            SUSPENSIONS,
            "Times memory shedding began (the agent listeners were asked to suspend).",
            registry=registry,
        ),
        transition_failures=Counter(
            TRANSITION_FAILURES,
            "Failed attempts to suspend or resume an agent listener, by action.",
            ("action",),
            registry=registry,
        ),
        transition_failing=Gauge(
            "yuzu_gw_memory_shedding_transition_failing",
            "Agent listeners the shedder has not yet managed to suspend or resume, by action.",
            ("action",),
            registry=registry,
        ),
        high_water_bytes=Gauge(
            "yuzu_gw_memory_shedding_high_water_bytes",
            "The high-water mark the shedder resolved, in bytes (0 while it does not run).",
            registry=registry,
        ),
        low_water_bytes=Gauge(
            "yuzu_gw_memory_shedding_low_water_bytes",
            "The low-water mark the shedder resolved, in bytes (0 while it does not run).",
            registry=registry,
        ),
        inactive=Gauge(
            "yuzu_gw_memory_shedding_inactive",
            "1 when shedding is enabled but cannot run (memory_limit_unknown with a fractional"
            " mark, or memory_sample_unavailable), else 0.",
            registry=registry,
        ),
    )
    for action in ACTIONS:
        metrics.transition_failures.labels(action=action)
    metrics.not_running(inactive=False)
    return metrics


def shedder_metrics(registry: CollectorRegistry) -> ShedderMetrics:
    metrics = _BY_REGISTRY.get(registry)
    if metrics is None:
        metrics = _BY_REGISTRY[registry] = _create(registry)
    return metrics
