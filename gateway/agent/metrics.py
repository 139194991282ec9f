"""The metric families of the agent plane's request and stream processes.

Names, labels and the "every series created at 0" rule come from the seed ("Heartbeat
admission" > Observability, "Known limits"; SPEC_INDEX M03-M08):

- `yuzu_gw_register_refused_total{reason="agent_id_length"}`: a Register refused at the edge;
- `yuzu_gw_heartbeat_rejected_total{reason}` (unknown_session, no_connection,
  registry_unavailable): a heartbeat with no usable binding;
- `yuzu_gw_heartbeat_session_mismatch_total{event="security"}`: a held session's heartbeat
  that arrived on another connection;
- `yuzu_gw_inventory_rejected_total{reason}` (the four admission reasons): an inventory report
  refused admission;
- `yuzu_gw_agents_connected_total`: a Subscribe whose owner started (each agent connect);
- `yuzu_gw_agents_disconnected_total`: such a stream ended, however it ended (once for each
  connect, so `connected - disconnected` is the streams open now);
- `yuzu_gw_agents_current`: read at scrape time from the registry's `agents` table;
- admission under a storm (gateway/agent/admission.py, issue 19):
  `yuzu_gw_admission_admitted_total{call}` and `yuzu_gw_admission_refused_total{call,reason}`
  (call `register` or `subscribe`; reason `pending`), `yuzu_gw_admission_pending{call}` (in
  flight now), `yuzu_gw_admission_bound{call}` (what is admitted at once now) and
  `yuzu_gw_admission_hint_seconds{call}` (the grpc-retry-pushback-ms given).

Every labelled series exists from the start at 0, so an `increase()` or a rate alert sees a
flat line rather than no data. A session id, agent id or address is never a label.

One `AgentMetrics` per node registry (prometheus raises on a name registered twice, and a
restarted root supervisor builds the agent service again).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from actors.core.admission import Call
from actors.registry.api import ADMISSION_REASONS, AdmissionReason

__all__ = [
    "ADMISSION_REFUSED_REASONS",
    "HEARTBEAT_REJECTED_REASONS",
    "REGISTER_REFUSED_REASONS",
    "AgentMetrics",
    "agent_metrics",
]

REGISTER_REFUSED_REASONS = ("agent_id_length",)
# connection_mismatch is not a rejected_total reason: it is counted in the security family,
# which the seed keeps apart so a topology problem stands out from missing state.
HEARTBEAT_REJECTED_REASONS: tuple[AdmissionReason, ...] = tuple(
    r for r in ADMISSION_REASONS if r != "connection_mismatch"
)
SECURITY_EVENT = "security"
# The one reason today: the call's pending bound (the drain-rate bound or its hard maximum).
ADMISSION_REFUSED_REASONS = ("pending",)
# Hints run from 250 ms to admission_hint_max_ms (60 s by default).
_HINT_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@attrs.frozen(eq=False)
class AgentMetrics:
    register_refused: Counter
    heartbeat_rejected: Counter
    heartbeat_session_mismatch: Counter
    inventory_rejected: Counter
    agents_connected: Counter
    agents_disconnected: Counter
    agents_current: Gauge
    admission_admitted: Counter
    admission_refused: Counter
    admission_pending: Gauge
    admission_bound: Gauge
    admission_hint: Histogram

    def heartbeat_refused(self, reason: AdmissionReason) -> None:
        if reason == "connection_mismatch":
            self.heartbeat_session_mismatch.labels(SECURITY_EVENT).inc()
        else:
            self.heartbeat_rejected.labels(reason).inc()

    def inventory_refused(self, reason: AdmissionReason) -> None:
        # Seed: a connection mismatch of an inventory report is counted here, not in the
        # event="security" heartbeat family.
        self.inventory_rejected.labels(reason).inc()


def _create(registry: CollectorRegistry, agents_held: Callable[[], int]) -> AgentMetrics:
    metrics = AgentMetrics(
        register_refused=Counter(
            "yuzu_gw_register_refused",
            "Register calls refused at the edge before anything went upstream, by reason.",
            ("reason",),
            registry=registry,
        ),
        heartbeat_rejected=Counter(
            "yuzu_gw_heartbeat_rejected",
            "Heartbeats refused (NOT_FOUND) for lack of a usable session binding, by reason.",
            ("reason",),
            registry=registry,
        ),
        heartbeat_session_mismatch=Counter(
            "yuzu_gw_heartbeat_session_mismatch",
            "Heartbeats of a held session that arrived on another connection (refused).",
            ("event",),
            registry=registry,
        ),
        inventory_rejected=Counter(
            "yuzu_gw_inventory_rejected",
            "Inventory reports refused admission (NOT_FOUND) before forwarding, by reason.",
            ("reason",),
            registry=registry,
        ),
        agents_connected=Counter(
            "yuzu_gw_agents_connected",
            "Agent Subscribe streams whose owner started (each agent connect).",
            registry=registry,
        ),
        agents_disconnected=Counter(
            "yuzu_gw_agents_disconnected",
            "Agent Subscribe streams counted in agents_connected that ended (each disconnect).",
            registry=registry,
        ),
        agents_current=Gauge(
            "yuzu_gw_agents_current",
            "Agent sessions held by this node (live owners in the registry).",
            registry=registry,
        ),
        admission_admitted=Counter(
            "yuzu_gw_admission_admitted",
            "Agent calls admitted under the storm bound, by call (register, subscribe).",
            ("call",),
            registry=registry,
        ),
        admission_refused=Counter(
            "yuzu_gw_admission_refused",
            "Agent calls refused RESOURCE_EXHAUSTED with a retry hint, by call and reason.",
            ("call", "reason"),
            registry=registry,
        ),
        admission_pending=Gauge(
            "yuzu_gw_admission_pending",
            "Agent calls admitted and not yet finished, by call.",
            ("call",),
            registry=registry,
        ),
        admission_bound=Gauge(
            "yuzu_gw_admission_bound",
            "Agent calls admitted at once at the last decision (from the drain rate), by call.",
            ("call",),
            registry=registry,
        ),
        admission_hint=Histogram(
            "yuzu_gw_admission_hint_seconds",
            "grpc-retry-pushback-ms given with an admission refusal, in seconds, by call.",
            ("call",),
            buckets=_HINT_BUCKETS,
            registry=registry,
        ),
    )
    for call in Call:
        metrics.admission_admitted.labels(call.value)
        metrics.admission_pending.labels(call.value)
        metrics.admission_bound.labels(call.value)
        metrics.admission_hint.labels(call.value)
        for reason in ADMISSION_REFUSED_REASONS:
            metrics.admission_refused.labels(call.value, reason)
    for reason in REGISTER_REFUSED_REASONS:
        metrics.register_refused.labels(reason)
    for reason in HEARTBEAT_REJECTED_REASONS:
        metrics.heartbeat_rejected.labels(reason)
    metrics.heartbeat_session_mismatch.labels(SECURITY_EVENT)
    for reason in ADMISSION_REASONS:
        metrics.inventory_rejected.labels(reason)
    metrics.agents_current.set_function(agents_held)
    return metrics


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, AgentMetrics] = (
    weakref.WeakKeyDictionary()
)


def agent_metrics(registry: CollectorRegistry, agents_held: Callable[[], int]) -> AgentMetrics:
    """The families of `registry`, created (with their series at 0) on first use.
    `agents_held` is read at each scrape; a later call keeps the first one's."""
    metrics = _BY_REGISTRY.get(registry)
    if metrics is None:
        metrics = _BY_REGISTRY[registry] = _create(registry, agents_held)
    return metrics
