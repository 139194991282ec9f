"""The metric families of the management plane (gateway/mgmt/service.py).

- `yuzu_gw_mgmt_commands_total{outcome}`: SendCommand calls by how they ended: `completed`
  (every target answered terminally), `timeout` (the command's time ran out), `abandoned` (the
  operator went away first), `router_down` (the router ended with the command in flight:
  UNAVAILABLE), `unavailable` (no router running: UNAVAILABLE at once), `invalid` (empty
  command id: INVALID_ARGUMENT), `stalled` (the operator did not read the end within the grace:
  the stream was reset);
- `yuzu_gw_mgmt_command_responses_total{kind}`: responses put on operator streams, by kind
  (`agent`: a frame of the agent; the rest are terminal answers the gateway writes:
  not_connected, agent_disconnected, duplicate_command_id, stream_stuck, too_many_pending,
  timeout);
- `yuzu_gw_mgmt_command_progress_dropped_total`: RUNNING frames not queued for an operator
  stream that was not being read (its progress queue was full); terminal answers are never
  dropped;
- `yuzu_gw_mgmt_commands_in_flight`: SendCommand streams open now;
- `yuzu_gw_mgmt_watchers`: WatchEvents streams open now;
- `yuzu_gw_mgmt_watch_events_dropped_total`: agent events a slow watcher lost (its queue was
  full; the oldest queued event goes).

Every labelled series exists from the start at 0. An agent id, command id or session id is never
a label. One `MgmtMetrics` per node registry (prometheus refuses a name registered twice, and a
restarted root supervisor builds the management service again).
"""

from __future__ import annotations

import weakref
from typing import Literal

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge

from actors.router.api import RESPONSE_KINDS

__all__ = ["COMMAND_OUTCOMES", "CommandOutcome", "MgmtMetrics", "mgmt_metrics"]

CommandOutcome = Literal[
    "completed", "timeout", "abandoned", "router_down", "unavailable", "invalid", "stalled"
]
COMMAND_OUTCOMES: tuple[CommandOutcome, ...] = (
    "completed",
    "timeout",
    "abandoned",
    "router_down",
    "unavailable",
    "invalid",
    "stalled",
)


@attrs.frozen(eq=False)
class MgmtMetrics:
    commands: Counter
    responses: Counter
    progress_dropped: Counter
    in_flight: Gauge
    watchers: Gauge
    watch_dropped: Counter


def _create(registry: CollectorRegistry) -> MgmtMetrics:
    metrics = MgmtMetrics(
        commands=Counter(
            "yuzu_gw_mgmt_commands",
            "SendCommand calls by how they ended.",
            ("outcome",),
            registry=registry,
        ),
        responses=Counter(
            "yuzu_gw_mgmt_command_responses",
            "Responses put on SendCommand streams: agent frames, and the terminal answers the"
            " gateway writes, by kind.",
            ("kind",),
            registry=registry,
        ),
        progress_dropped=Counter(
            "yuzu_gw_mgmt_command_progress_dropped",
            "RUNNING frames not queued for an operator stream that was not being read.",
            registry=registry,
        ),
        in_flight=Gauge(
            "yuzu_gw_mgmt_commands_in_flight",
            "SendCommand streams open now.",
            registry=registry,
        ),
        watchers=Gauge(
            "yuzu_gw_mgmt_watchers",
            "WatchEvents streams open now.",
            registry=registry,
        ),
        watch_dropped=Counter(
            "yuzu_gw_mgmt_watch_events_dropped",
            "Agent events a slow WatchEvents stream lost (its queue was full).",
            registry=registry,
        ),
    )
    for outcome in COMMAND_OUTCOMES:
        metrics.commands.labels(outcome)
    for kind in RESPONSE_KINDS:
        metrics.responses.labels(kind)
    return metrics


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, MgmtMetrics] = (
    weakref.WeakKeyDictionary()
)


def mgmt_metrics(registry: CollectorRegistry) -> MgmtMetrics:
    """The families of `registry`, created (with their series at 0) on first use."""
    metrics = _BY_REGISTRY.get(registry)
    if metrics is None:
        metrics = _BY_REGISTRY[registry] = _create(registry)
    return metrics
