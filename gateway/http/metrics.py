"""The node's own families on `/metrics`: what build runs, and each readiness check.

- `yuzu_gw_build_info{version, python, grpclib, protobuf}` is always 1: the labels say which
  release and which libraries answer (join it to other series with `* on(instance)
  group_left(version)`).
- `yuzu_gw_readiness_check{check}` is 1 while the `/readyz` check of that name passes, else 0,
  read at each scrape from the same checks `/readyz` evaluates (they read published state and
  never call an actor, so a scrape cannot stall on a busy actor). A check registered later
  appears from the next scrape on.

Both are collectors registered once per node registry.
"""

from __future__ import annotations

import importlib.metadata
import platform
import weakref
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from actors.node.api import Readiness

__all__ = ["BUILD_INFO", "READINESS_CHECK_FAMILY", "register_node_metrics"]

BUILD_INFO = "yuzu_gw_build_info"
READINESS_CHECK_FAMILY = "yuzu_gw_readiness_check"
# The distribution this gateway is installed as, and the libraries the build info names.
DISTRIBUTION = "yuzu-gateway"
LIBRARIES = ("grpclib", "protobuf")
UNKNOWN = "unknown"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN  # run from a checkout that was never installed


class _BuildInfo(Collector):
    def __init__(self) -> None:
        # Read once: the installed versions do not change while the process runs.
        self.labels = {
            "version": _version(DISTRIBUTION),
            "python": platform.python_version(),
            **{library: _version(library) for library in LIBRARIES},
        }

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            BUILD_INFO,
            "Always 1: the gateway's version and the Python, grpclib and protobuf it runs on.",
            labels=list(self.labels),
        )
        family.add_metric(list(self.labels.values()), 1)
        yield family


class _ReadinessChecks(Collector):
    def __init__(self, readiness: Readiness) -> None:
        self.readiness = readiness

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            READINESS_CHECK_FAMILY,
            "1 while the /readyz check of that name passes, else 0 (docs/health.md).",
            labels=["check"],
        )
        for name, ok in sorted(self.readiness.evaluate().items()):
            family.add_metric([name], 1 if ok else 0)
        yield family


_REGISTERED: weakref.WeakSet[CollectorRegistry] = weakref.WeakSet()


def register_node_metrics(registry: CollectorRegistry, readiness: Readiness) -> None:
    """Once per node registry (a second call is a no-op)."""
    if registry in _REGISTERED:
        return
    _REGISTERED.add(registry)
    registry.register(_BuildInfo())
    registry.register(_ReadinessChecks(readiness))
