"""The metric families of the upstream call path: permits (the `upstream_regulator` actor), the
circuit breaker and RPC errors (the `upstream` actor), and the `upstream` actor's two lanes that
take no permit: held stream-status notifications and Guardian forwards.

Names and labels follow the seed ("Upstream call permits", "How the gateway sizes its upstream
calls", "Known limits"; SPEC_INDEX M09-M16). The seed gives no name for the breaker's own
families (the Erlang gateway registers them in yuzu_gw_telemetry.erl, which the seed does not
quote), so `yuzu_gw_upstream_circuit_breaker_*` are this rebuild's names. The notification
families are the seed's (SPEC_INDEX M19-M30; their names and label values come from the store's
core, actors/core/notify_store.py). The seed names no Guardian family: `yuzu_gw_upstream_guardian_*`
are this rebuild's.

Gauges that describe an actor's state (held notifications, sends in flight) are read at scrape
time through a function the running actor installs (`NotifyMetrics.watch`), so a scrape never
sees a stale value; a stopped actor installs zeros ("the current upstream process only").

One `UpstreamMetrics` per registry: a restarted actor must find its families again, because
registering a name twice in one registry raises. The values therefore outlive an actor restart;
the actor that starts sets the gauges it owns.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from actors.core import Count
from actors.core import notify_store as ns
from actors.core.breaker import State
from actors.effects import count_into

__all__ = [
    "GUARDIAN_DROP_REASONS",
    "GUARDIAN_OUTCOMES",
    "HELD_CLASSES",
    "LIMIT_CLASSES",
    "PRESEEDED_RPC_ERRORS",
    "REFUSAL_REASONS",
    "RPC_NAMES",
    "TRANSITIONS",
    "WAITING_CLASSES",
    "GuardianMetrics",
    "NotifyMetrics",
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
REFUSAL_REASONS = ("queue_full", "deadline", "stopping")

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

# Guardian forwards dropped before they were sent: the breaker is open, or all 50 slots are busy.
GUARDIAN_DROP_REASONS = ("circuit_open", "at_capacity")
# How a sent Guardian forward ended: the server answered acknowledged=true or false, or the call
# failed (the failure's code is in yuzu_gw_upstream_rpc_errors_total{rpc_name="guardian"}).
GUARDIAN_OUTCOMES = ("acknowledged", "unacknowledged", "failed")

# The counter families of the notification store, with their label names in the order the core's
# `Count` effects give the label values, and their help text.
_NOTIFY_COUNTERS: dict[str, tuple[tuple[str, ...], str]] = {
    ns.COALESCED: ((), "Held stream-status notifications replaced by a newer one for their key."),
    ns.REQUEUED: ((), "Failed stream-status notification sends held again at the head."),
    ns.DROPPED: (
        ("reason",),
        "Stream-status notifications refused admission to the held store (at the cap).",
    ),
    ns.LOST: (
        ("event", "reason"),
        "Stream-status notifications definitively not delivered, by event and reason.",
    ),
    ns.UNACKNOWLEDGED: (
        ("event",),
        "NotifyStreamStatus answers with acknowledged=false (the server did not record it).",
    ),
    ns.UNACKED_ENDED: (("outcome",), "Ends of a resend wait for an unrecorded notification."),
}

# Permit waits run from nothing (a free permit) to the 25 s queue deadline.
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0)


def rpc_name(method: str) -> str:
    """The rpc_name label of a method path (`/yuzu.gateway.v1.GatewayUpstream/ProxyRegister`)."""
    short = method.rsplit("/", 1)[-1]
    return RPC_NAMES.get(short, short.lower())


def _zero() -> float:
    return 0.0


@attrs.frozen(eq=False)
class NotifyMetrics:
    """The held-notification families (SPEC_INDEX M19-M30)."""

    counters: dict[str, Counter]
    pending: Gauge
    inflight: Gauge
    pending_hwm: Gauge
    pending_max: Gauge
    unacked_keys: Gauge
    unacked_slow_keys: Gauge

    def count(self, effect: Count) -> None:
        """Carry out a `Count` effect of the store."""
        count_into(self.counters, effect)

    def watch(self, gauges: Callable[[], ns.Gauges] | None) -> None:
        """Read the gauges from `gauges()` at every scrape; None (the actor stopped): zeros."""
        fields: tuple[tuple[Gauge, Callable[[ns.Gauges], int]], ...] = (
            (self.pending, lambda g: g.pending),
            (self.inflight, lambda g: g.inflight),
            (self.pending_hwm, lambda g: g.pending_hwm),
            (self.pending_max, lambda g: g.pending_max),
            (self.unacked_keys, lambda g: g.unacked_keys),
            (self.unacked_slow_keys, lambda g: g.unacked_slow_keys),
        )
        for gauge, field in fields:
            if gauges is None:
                gauge.set_function(_zero)
            else:
                gauge.set_function(lambda field=field: float(field(gauges())))


@attrs.frozen(eq=False)
class GuardianMetrics:
    """The Guardian forward lane (this rebuild's names; the seed names none)."""

    inflight: Gauge
    dropped: Counter
    forwarded: Counter

    def watch(self, inflight: Callable[[], int] | None) -> None:
        if inflight is None:
            self.inflight.set_function(_zero)
        else:
            self.inflight.set_function(lambda: float(inflight()))


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
    notify: NotifyMetrics
    guardian: GuardianMetrics

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
        notify=_notify(registry),
        guardian=_guardian(registry),
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


def _gauge(registry: CollectorRegistry, name: str, doc: str) -> Gauge:
    gauge = Gauge(name, doc, registry=registry)
    gauge.set_function(_zero)
    return gauge


def _notify(registry: CollectorRegistry) -> NotifyMetrics:
    counters = {
        family: Counter(family, doc, labels, registry=registry)
        for family, (labels, doc) in _NOTIFY_COUNTERS.items()
    }
    metrics = NotifyMetrics(
        counters=counters,
        pending=_gauge(
            registry,
            "yuzu_gw_upstream_notify_pending",
            "Held stream-status notification keys (this upstream actor only).",
        ),
        inflight=_gauge(
            registry,
            "yuzu_gw_upstream_notify_inflight",
            "NotifyStreamStatus sends in flight, resends and the probe included.",
        ),
        pending_hwm=_gauge(
            registry,
            "yuzu_gw_upstream_notify_pending_hwm",
            "Most stream-status notification keys held at once over the last 1 to 2 minutes.",
        ),
        pending_max=_gauge(
            registry,
            "yuzu_gw_upstream_notify_pending_max",
            "The held stream-status notification cap in force (notify_pending_max).",
        ),
        unacked_keys=_gauge(
            registry,
            "yuzu_gw_upstream_notify_unacked_keys",
            "Sessions whose unrecorded notification waits for a resend.",
        ),
        unacked_slow_keys=_gauge(
            registry,
            "yuzu_gw_upstream_notify_unacked_slow_keys",
            "Of those, the sessions in the slow resend phase.",
        ),
    )
    # Created at 0 so an absent series never has to mean "none yet" (the seed pre-creates
    # dropped{at_capacity} and dropped{unknown}; the core lists the rest).
    for family, labels in ns.INITIAL_SERIES:
        counter = counters[family]
        if labels:
            counter.labels(*(value for _, value in labels))
    return metrics


def _guardian(registry: CollectorRegistry) -> GuardianMetrics:
    metrics = GuardianMetrics(
        inflight=_gauge(
            registry,
            "yuzu_gw_upstream_guardian_inflight",
            "ForwardGuardianMessage calls in flight (at most 50).",
        ),
        dropped=Counter(
            "yuzu_gw_upstream_guardian_dropped_total",
            "Guardian frames not forwarded: the breaker was open or all 50 slots were busy.",
            ("reason",),
            registry=registry,
        ),
        forwarded=Counter(
            "yuzu_gw_upstream_guardian_forwarded_total",
            "Guardian frames sent upstream, by how the call ended.",
            ("outcome",),
            registry=registry,
        ),
    )
    for reason in GUARDIAN_DROP_REASONS:
        metrics.dropped.labels(reason)
    for outcome in GUARDIAN_OUTCOMES:
        metrics.forwarded.labels(outcome)
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
