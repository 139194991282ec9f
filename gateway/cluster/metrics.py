"""The cluster's metrics (seed: "Gateway Clustering"; docs/cluster.md, "Metrics"): membership,
refusals, the agent directory, the forwarded commands and the nodes left undialled. All exist
at 0 from the start, so a node serving alone shows 0, not nothing."""

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
    directory_agents: Gauge
    unreachable_peers: Gauge
    forwards: Counter
    forwarded_targets: Counter
    undialled: Gauge


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
            Gauge(
                "yuzu_gw_cluster_directory_agents",
                "Agents the directory places on a reachable peer (this node's own excluded).",
                registry=registry,
            ),
            Gauge(
                "yuzu_gw_cluster_unreachable_peers",
                "Peers whose link went down and whose agents are remembered as unavailable.",
                registry=registry,
            ),
            Counter(
                "yuzu_gw_cluster_forwards",
                "Forwarded-command frames sent to peers (one per peer that holds targets).",
                registry=registry,
            ),
            Counter(
                "yuzu_gw_cluster_forwarded_targets",
                "Targets named in forwarded-command frames (each sent to its holder only).",
                registry=registry,
            ),
            Gauge(
                "yuzu_gw_cluster_undialled_nodes",
                "Nodes their hosts advertise that this node does not dial (a seed list that"
                " names some nodes of a host as host:port and leaves others out).",
                registry=registry,
            ),
        )
    return metrics
