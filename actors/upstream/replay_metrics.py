"""The metric families of the heartbeat verdict and the registration replay (seed M31..M35).

- `yuzu_gw_heartbeat_verdict_dropped_total{reason}` (malformed, not_local, circuit_open,
  queue_full): verdict ids not queued, per id; counted by the heartbeat buffer (malformed, a
  long upstream mailbox) and by the upstream actor's replay lane (the rest);
- `yuzu_gw_heartbeat_unknown_truncated_total`: answers with the truncated flag set;
- `yuzu_gw_registration_replay_total`: every replay attempt, any outcome;
- `yuzu_gw_registration_replay_triggered_total{trigger}` (heartbeat, server_lost_state,
  notify_loss): a verdict that queued at least one session, a full replay started;
- `yuzu_gw_registration_replay_queue_depth`: the replay queue's length, read at scrape time
  from the running upstream actor (0 while none runs).

Every series exists at 0 from the start. One `ReplayMetrics` per registry: the two actors that
count share it, and a restarted actor finds its families again.

The verdict families live here, beside the replay lane, not beside the heartbeat buffer: a
verdict exists to queue sessions for a replay, and its drops count the ids that queue did not
take, most of them the replay core's decisions (not_local, circuit_open, queue_full). The buffer
only reads the server's answer; it counts its malformed ids, its long-mailbox drops and the
truncated answers into these families through the `Counts` its Args carry
(gateway/node/children/heartbeat.py builds them), so it never imports this module.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge

from actors.core import Count
from actors.core.replay_queue import REPLAYS, TRIGGERED, TRIGGERS
from actors.core.verdicts import DROP_REASONS, UNKNOWN_TRUNCATED, VERDICT_DROPPED
from actors.effects import count_into

__all__ = ["ReplayMetrics", "replay_metrics"]


@attrs.define(eq=False)
class ReplayMetrics:
    verdict_dropped: Counter
    unknown_truncated: Counter
    replays: Counter
    triggered: Counter
    queue_depth: Gauge

    def count(self, effect: Count) -> None:
        """Apply one `Count` effect of the verdict or replay core."""
        counters = {
            VERDICT_DROPPED: self.verdict_dropped,
            UNKNOWN_TRUNCATED: self.unknown_truncated,
            REPLAYS: self.replays,
            TRIGGERED: self.triggered,
        }
        count_into(counters, effect)

    def watch(self, depth: Callable[[], int] | None) -> None:
        """Read the queue depth from `depth` at scrape time (None: 0, no replay lane runs)."""
        if depth is None:
            self.queue_depth.set_function(lambda: 0.0)
        else:
            self.queue_depth.set_function(lambda: float(depth()))


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, ReplayMetrics] = (
    weakref.WeakKeyDictionary()
)


def _create(registry: CollectorRegistry) -> ReplayMetrics:
    metrics = ReplayMetrics(
        verdict_dropped=Counter(
            VERDICT_DROPPED,
            "Session ids of heartbeat verdicts not queued for a registration replay, by reason.",
            ("reason",),
            registry=registry,
        ),
        unknown_truncated=Counter(
            UNKNOWN_TRUNCATED,
            "BatchHeartbeat answers whose unknown session list the server truncated at 4096.",
            registry=registry,
        ),
        # The HELP text is the seed's.
        replays=Counter(
            REPLAYS,
            "Total registration replay attempts by the drip, any outcome",
            registry=registry,
        ),
        triggered=Counter(
            TRIGGERED,
            "Registration replays started, by trigger.",
            ("trigger",),
            registry=registry,
        ),
        queue_depth=Gauge(
            "yuzu_gw_registration_replay_queue_depth",
            "Sessions waiting in the registration replay queue.",
            registry=registry,
        ),
    )
    for reason in DROP_REASONS:
        metrics.verdict_dropped.labels(reason)
    metrics.unknown_truncated.inc(0)
    metrics.replays.inc(0)
    for trigger in TRIGGERS:
        metrics.triggered.labels(trigger)
    metrics.watch(None)
    return metrics


def replay_metrics(registry: CollectorRegistry) -> ReplayMetrics:
    """The families of `registry`, created (with their series at 0) on first use."""
    metrics = _BY_REGISTRY.get(registry)
    if metrics is None:
        metrics = _BY_REGISTRY[registry] = _create(registry)
    return metrics
