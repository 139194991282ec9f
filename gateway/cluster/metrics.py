"""`yuzu_gw_cluster_peers_resolved` and `yuzu_gw_cluster_peers_connected` (seed: "Gateway
Clustering"); both exist at 0 from the start, so a node serving alone shows 0, not nothing."""

from __future__ import annotations

import weakref

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["ClusterMetrics", "cluster_metrics"]


@attrs.frozen
class ClusterMetrics:
    resolved: Gauge
    connected: Gauge
    refused: Counter


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, ClusterMetrics] = (
    weakref.WeakKeyDictionary()
)


def cluster_metrics(registry: CollectorRegistry) -> ClusterMetrics:
    metrics = _BY_REGISTRY.get(registry)
    if metrics is None:
        metrics = _BY_REGISTRY[registry] = ClusterMetrics(
            Gauge(
                "yuzu_gw_cluster_peers_resolved",
                "Peer addresses the last discovery round resolved (this node excluded).",
                registry=registry,
            ),
            Gauge(
                "yuzu_gw_cluster_peers_connected",
                "Peers with an authenticated link up; the cluster's size is this + 1.",
                registry=registry,
            ),
            Counter(
                "yuzu_gw_cluster_auth_refused",
                "Inter-node links and calls refused: a peer's cookie proof was missing or wrong.",
                registry=registry,
            ),
        )
    return metrics
