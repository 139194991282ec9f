"""The metric families of the upstream call path: permits (the `upstream_regulator` actor) and
the circuit breaker and RPC errors (the `upstream` actor).

Names and labels follow the seed ("Upstream call permits", "How the gateway sizes its upstream
calls", "Known limits"; SPEC_INDEX M09-M16). The seed gives no name for the breaker's own
families (the Erlang gateway registers them in yuzu_gw_telemetry.erl, which the seed does not
quote), so `yuzu_gw_upstream_circuit_breaker_*` are this rebuild's names.

One `UpstreamMetrics` per registry: a restarted actor must find its families again, because
registering a name twice in one registry raises. The values therefore outlive an actor restart;
the actor that starts sets the gauges it owns.
"""

from __future__ import annotations

import weakref

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from actors.core.breaker import State

__all__ = [
    "HELD_CLASSES",
    "LIMIT_CLASSES",
    "PRESEEDED_RPC_ERRORS",
    "REFUSAL_REASONS",
    "RPC_NAMES",
    "TRANSITIONS",
    "WAITING_CLASSES",
    "UpstreamMetrics",
    "rpc_name",
    "upstream_metrics",
]

# Permit classes. Held permits are counted per pool (a replay holds a register permit, so it is
# inside class="register"); waiters per caller kind, because a waiting replay is not a waiting
# agent (it waits behind live registrations by design); limits per pool plus the replay cap.
HELD_CLASSES = ("register", "inventory")
WAITING_CLASSES = ("register", "inventory", "replay")
LIMIT_CLASSES = ("register", "inventory", "replay")
REFUSAL_REASONS = ("queue_full", "deadline")

# rpc_name label values (SPEC_INDEX M16) by GatewayUpstream method.
RPC_NAMES = {
    "ProxyRegister": "register",
    "ProxyInventory": "inventory",
    "NotifyStreamStatus": "notify_stream",
    "ForwardGuardianMessage": "guardian",
    "BatchHeartbeat": "batch_heartbeat",
}
# Seed: "The encode series is pre-seeded to 0 for register, inventory, notify_stream and
# guardian, and exception for those four plus batch_heartbeat", so the alerts on them have a
# series to compare against before the first error.
PRESEEDED_RPC_ERRORS = tuple(
    [("encode", name) for name in ("register", "inventory", "notify_stream", "guardian")]
    + [
        ("exception", name)
        for name in ("register", "inventory", "notify_stream", "guardian", "batch_heartbeat")
    ]
)
TRANSITIONS = (
    (State.CLOSED, State.OPEN),
    (State.OPEN, State.HALF_OPEN),
    (State.HALF_OPEN, State.CLOSED),
    (State.HALF_OPEN, State.OPEN),
)

# Permit waits run from nothing (a free permit) to the 25 s queue deadline.
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0)


def rpc_name(method: str) -> str:
    """The rpc_name label of a method path (`/yuzu.gateway.v1.GatewayUpstream/ProxyRegister`)."""
    short = method.rsplit("/", 1)[-1]
    return RPC_NAMES.get(short, short.lower())


@attrs.frozen(eq=False)
class UpstreamMetrics:
    permits_held: Gauge
    permits_waiting: Gauge
    permit_wait_seconds: Histogram
    permit_refused: Counter
    calls_dropped: Counter
    permit_limit: Gauge
    rpc_errors: Counter
    breaker_state: Gauge
    breaker_transitions: Counter

    def set_breaker_state(self, state: State) -> None:
        for each in State:
            self.breaker_state.labels(state=each.value).set(1 if each is state else 0)


def _create(registry: CollectorRegistry) -> UpstreamMetrics:
    metrics = UpstreamMetrics(
        permits_held=Gauge(
            "yuzu_gw_upstream_permits_held",
            "Upstream permits held, by pool (a replay holds a register permit).",
            ("class",),
            registry=registry,
        ),
        permits_waiting=Gauge(
            "yuzu_gw_upstream_permits_waiting",
            "Requests waiting for an upstream permit, by caller kind.",
            ("class",),
            registry=registry,
        ),
        permit_wait_seconds=Histogram(
            "yuzu_gw_upstream_permit_wait_seconds",
            "Time a granted request waited for its upstream permit.",
            buckets=_WAIT_BUCKETS,
            registry=registry,
        ),
        permit_refused=Counter(
            "yuzu_gw_upstream_permit_refused_total",
            "Permit requests refused (answered UNAVAILABLE), by reason.",
            ("reason",),
            registry=registry,
        ),
        calls_dropped=Counter(
            "yuzu_gw_upstream_calls_dropped_total",
            "Requests whose deadline passed while they waited for a permit; never sent.",
            registry=registry,
        ),
        permit_limit=Gauge(
            "yuzu_gw_upstream_permit_limit",
            "Upstream permits in force after sizing from the server's stream limit.",
            ("class",),
            registry=registry,
        ),
        rpc_errors=Counter(
            "yuzu_gw_upstream_rpc_errors_total",
            "Upstream RPC errors by code (a gRPC status name or a local kind) and RPC.",
            ("code", "rpc_name"),
            registry=registry,
        ),
        breaker_state=Gauge(
            "yuzu_gw_upstream_circuit_breaker_state",
            "1 for the circuit breaker's current state, 0 for the others.",
            ("state",),
            registry=registry,
        ),
        breaker_transitions=Counter(
            "yuzu_gw_upstream_circuit_breaker_transitions_total",
            "Circuit breaker transitions.",
            ("from", "to"),
            registry=registry,
        ),
    )
    for cls in HELD_CLASSES:
        metrics.permits_held.labels(cls).set(0)
    for cls in WAITING_CLASSES:
        metrics.permits_waiting.labels(cls).set(0)
    for reason in REFUSAL_REASONS:
        metrics.permit_refused.labels(reason)
    for code, name in PRESEEDED_RPC_ERRORS:
        metrics.rpc_errors.labels(code, name)
    for previous, current in TRANSITIONS:
        metrics.breaker_transitions.labels(previous.value, current.value)
    metrics.set_breaker_state(State.CLOSED)
    return metrics


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, UpstreamMetrics] = (
    weakref.WeakKeyDictionary()
)


def upstream_metrics(registry: CollectorRegistry) -> UpstreamMetrics:
    """The families of `registry`, created (with their pre-seeded series) on first use."""
    metrics = _BY_REGISTRY.get(registry)
    if metrics is None:
        metrics = _BY_REGISTRY[registry] = _create(registry)
    return metrics
