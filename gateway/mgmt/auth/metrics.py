"""The metric families of management peer authorisation and of the certificate watcher (seed
M48-M53):

- `yuzu_gw_mgmt_auth_rejected_total{reason}`: a management stream refused; every reason of the
  closed set exists at 0 from start;
- `yuzu_gw_mgmt_auth_admitted_total{method}`: a stream let in, by `identity` or `pin` (both at 0
  from start);
- `yuzu_gw_mgmt_auth_pin_unresolved_total`: one per configured pin that has never resolved, on
  every watcher refresh;
- `yuzu_gw_mgmt_pin_rotated_timestamp_seconds`: when a pin file last published a different key;
  0 until then;
- `yuzu_gw_cert_expiry_timestamp_seconds{role,name}`: the earliest notAfter of the file(s);
- `yuzu_gw_cert_file_readable{role,name}`: 1 while the latest read parsed, else 0.

One `MgmtAuthMetrics` per registry, so a restarted gateway_sup or watcher finds its families
again (registering a name twice in one registry raises).
"""

from __future__ import annotations

import contextlib
import weakref

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.mgmt.auth.reasons import Method, Reason
from gateway.mgmt.auth.watch import SetGauges

__all__ = ["MgmtAuthMetrics", "mgmt_auth_metrics"]

REJECTED = "yuzu_gw_mgmt_auth_rejected_total"
ADMITTED = "yuzu_gw_mgmt_auth_admitted_total"
PIN_UNRESOLVED = "yuzu_gw_mgmt_auth_pin_unresolved_total"
PIN_ROTATED = "yuzu_gw_mgmt_pin_rotated_timestamp_seconds"
CERT_EXPIRY = "yuzu_gw_cert_expiry_timestamp_seconds"
CERT_READABLE = "yuzu_gw_cert_file_readable"


@attrs.define
class MgmtAuthMetrics:
    rejected: Counter
    admitted: Counter
    pin_unresolved: Counter
    pin_rotated: Gauge
    cert_expiry: Gauge
    cert_readable: Gauge

    def set_gauges(self, effect: SetGauges) -> None:
        self.cert_readable.labels(effect.role, effect.name).set(1 if effect.readable else 0)
        if effect.expiry is not None:
            self.cert_expiry.labels(effect.role, effect.name).set(effect.expiry)
        else:
            # No series: never readable, or a notAfter that cannot be read (expiry unknown).
            with contextlib.suppress(KeyError):
                self.cert_expiry.remove(effect.role, effect.name)


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, MgmtAuthMetrics] = (
    weakref.WeakKeyDictionary()
)


def _create(registry: CollectorRegistry) -> MgmtAuthMetrics:
    metrics = MgmtAuthMetrics(
        rejected=Counter(
            REJECTED,
            "Management streams refused by peer authorization, by reason (a closed set).",
            ("reason",),
            registry=registry,
        ),
        admitted=Counter(
            ADMITTED,
            "Management streams admitted by peer authorization, by method (identity or pin).",
            ("method",),
            registry=registry,
        ),
        pin_unresolved=Counter(
            PIN_UNRESOLVED,
            "Configured management pins that have never resolved, added on every watcher"
            " refresh (a typo'd fingerprint, a pin file never readable).",
            registry=registry,
        ),
        pin_rotated=Gauge(
            PIN_ROTATED,
            "Unix time at which a cert_file pin last published a different key; 0 until then.",
            registry=registry,
        ),
        cert_expiry=Gauge(
            CERT_EXPIRY,
            "Earliest notAfter of a configured certificate file, in Unix seconds.",
            ("role", "name"),
            registry=registry,
        ),
        cert_readable=Gauge(
            CERT_READABLE,
            "1 while the latest read of a configured certificate file parsed as PEM"
            " certificates, else 0.",
            ("role", "name"),
            registry=registry,
        ),
    )
    for reason in Reason:
        metrics.rejected.labels(reason.value)
    for method in Method:
        metrics.admitted.labels(method.value)
    return metrics


def mgmt_auth_metrics(registry: CollectorRegistry) -> MgmtAuthMetrics:
    """The families of `registry`, created (and pre-seeded) on first use."""
    metrics = _BY_REGISTRY.get(registry)
    if metrics is None:
        metrics = _BY_REGISTRY[registry] = _create(registry)
    return metrics
