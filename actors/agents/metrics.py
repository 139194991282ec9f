"""`yuzu_gw_agent_owner_restarts_total{outcome}`: what each restart of a crashed agent owner came
to (seed: "When an agent's owner process crashes"; docs/owner-recovery.md). Outcomes:
`recovered`, `disconnected_only`, `gave_up` (actors/core/owner_recovery.py), every series
created at 0.

Owners have no node context, so `agent_sup` (which has it) installs the family for its runtime
and the owners find it by their runtime. One family per node registry (prometheus refuses a name
registered twice, and agent_sup restarts).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import attrs
from prometheus_client import CollectorRegistry, Counter

from actors.core.owner_recovery import RESTART_OUTCOMES, RestartOutcome

if TYPE_CHECKING:
    from supervisors.runtime import LoopSystemBase

__all__ = ["OwnerMetrics", "install_owner_metrics", "owner_metrics"]


@attrs.frozen(eq=False)
class OwnerMetrics:
    restarts: Counter

    def restarted(self, outcome: RestartOutcome) -> None:
        self.restarts.labels(outcome).inc()


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, OwnerMetrics] = (
    weakref.WeakKeyDictionary()
)
_BY_RUNTIME: weakref.WeakKeyDictionary[LoopSystemBase, OwnerMetrics] = weakref.WeakKeyDictionary()


def install_owner_metrics(runtime: LoopSystemBase, registry: CollectorRegistry) -> OwnerMetrics:
    metrics = _BY_REGISTRY.get(registry)
    if metrics is None:
        counter = Counter(
            "yuzu_gw_agent_owner_restarts",
            "Restarts of crashed agent owners, by what they came to.",
            ("outcome",),
            registry=registry,
        )
        for outcome in RESTART_OUTCOMES:
            counter.labels(outcome)
        metrics = _BY_REGISTRY[registry] = OwnerMetrics(counter)
    _BY_RUNTIME[runtime] = metrics
    return metrics


def owner_metrics(runtime: LoopSystemBase) -> OwnerMetrics | None:
    """The family installed for `runtime`, or None (a bare test tree without agent_sup's
    context)."""
    return _BY_RUNTIME.get(runtime)
