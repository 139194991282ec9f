"""Per-method request counts and latency of every RPC the listeners serve (docs/metrics.md,
"RPC metrics").

One wrapper at the listener level (`ServerRpcMetrics.instrument`, applied by the listener actor
to every route it serves, health and reflection included), no code in the handlers:

- `yuzu_gw_grpc_server_handled_total{grpc_type, grpc_service, grpc_method, grpc_code}`: calls
  ended, by the gRPC status they ended with;
- `yuzu_gw_grpc_server_handling_seconds{grpc_type, grpc_service, grpc_method}`: from the
  handler's start to its end. For a stream (Subscribe, WatchEvents, Health Watch) that is the
  stream's lifetime, not a latency.

The names and labels are those of go-grpc-prometheus (grpc_server_handled_total,
grpc_server_handling_seconds) under the gateway's prefix. Every label comes from a closed set:
the routed methods and the seventeen status codes; the series of every routed method and code
exist from the listener's start at 0. No label names an agent, a session or an address.

The figures are plain counters that a collector turns into the two families at scrape time: one
call costs a clock read at each end, a bisection of the buckets and three additions (about 1 us),
where a prometheus_client Counter and Histogram take a lock per update (about 6 us together on a
loaded host). Everything that updates or scrapes them runs on the node's one event loop.

The status is the one written on the wire: the status of a `GRPCError` the handler raised, else
the `grpc-status` of the trailers the handler wrote itself (a refusal with a retry hint, a
Subscribe's end, Health's NOT_FOUND), else OK. A call whose client went away is CANCELLED
(DEADLINE_EXCEEDED when its deadline had passed); an unexpected exception is UNKNOWN, as grpclib
answers it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Collection, Iterator
from typing import Any, Final

from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gateway.listeners.server import Routes

__all__ = [
    "BUCKETS",
    "GRPC_TYPES",
    "MethodStats",
    "RpcCollector",
    "ServerRpcMetrics",
    "server_rpc_metrics",
    "split_path",
]

# Seconds: a heartbeat's sub-millisecond answer to a command's minutes, and streams beyond.
BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
GRPC_TYPES: Final = {
    Cardinality.UNARY_UNARY: "unary",
    Cardinality.UNARY_STREAM: "server_stream",
    Cardinality.STREAM_UNARY: "client_stream",
    Cardinality.STREAM_STREAM: "bidi_stream",
}
_STATUS_HEADER = "grpc-status"
_BY_VALUE: Final = {str(status.value): status for status in Status}

MethodFunc = Callable[[Any], Awaitable[None]]


def split_path(path: str) -> tuple[str, str]:
    """`/pkg.Service/Method` -> (`pkg.Service`, `Method`)."""
    _, service, method = path.split("/", 2)
    return service, method


class _Trailers:
    """Stands in for one stream's `send_headers`, noting the grpc-status of its trailers."""

    __slots__ = ("send", "status")

    def __init__(self, send: Callable[..., Awaitable[None]]) -> None:
        self.send = send
        self.status: Status | None = None

    async def __call__(self, headers: list[tuple[str, str]], end_stream: bool = False) -> None:
        if end_stream:
            for name, value in reversed(headers):
                if name == _STATUS_HEADER:
                    self.status = _BY_VALUE.get(value, Status.UNKNOWN)
                    break
        await self.send(headers, end_stream=end_stream)


def _ended(stream: Any) -> Status:
    deadline = stream.deadline
    if deadline is not None and deadline.time_remaining() <= 0:
        return Status.DEADLINE_EXCEEDED
    return Status.CANCELLED


_CODES: Final = len(Status)  # the values run from 0 to 16
_LABELS: Final = ("grpc_type", "grpc_service", "grpc_method")
_BOUNDS: Final = (*(floatToGoString(bound) for bound in BUCKETS), "+Inf")


class MethodStats:
    """One method's figures: calls by status, the histogram's buckets and sum."""

    __slots__ = ("buckets", "codes", "labels", "sum")

    def __init__(self, labels: tuple[str, str, str]) -> None:
        self.labels = labels
        self.codes = [0] * _CODES
        self.buckets = [0] * len(_BOUNDS)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0

    def observe(self, seconds: float, status: Status) -> None:
        self.buckets[bisect_left(BUCKETS, seconds)] += 1
        self.sum += seconds
        self.codes[status.value] += 1


class RpcCollector(Collector):
    """The handled counter and the handling histogram of one side (server or client)."""

    def __init__(self, side: str, handled_help: str, handling_help: str) -> None:
        self.handled = f"yuzu_gw_grpc_{side}_handled"
        self.handling = f"yuzu_gw_grpc_{side}_handling_seconds"
        self.handled_help = handled_help
        self.handling_help = handling_help
        self.methods: dict[tuple[str, Cardinality], MethodStats] = {}

    def method(self, path: str, cardinality: Cardinality) -> MethodStats:
        """The figures of one method (made at 0 on the first call, then shared)."""
        key = (path, cardinality)
        stats = self.methods.get(key)
        if stats is None:
            stats = self.methods[key] = MethodStats((GRPC_TYPES[cardinality], *split_path(path)))
        return stats

    def collect(self) -> Iterator[Metric]:
        handled = CounterMetricFamily(
            self.handled, self.handled_help, labels=[*_LABELS, "grpc_code"]
        )
        handling = HistogramMetricFamily(self.handling, self.handling_help, labels=list(_LABELS))
        for stats in list(self.methods.values()):
            for status in Status:
                handled.add_metric([*stats.labels, status.name], stats.codes[status.value])
            cumulative = list(itertools.accumulate(stats.buckets))
            handling.add_metric(
                list(stats.labels), list(zip(_BOUNDS, cumulative, strict=True)), stats.sum
            )
        yield handled
        yield handling


class ServerRpcMetrics:
    """The listeners' families, once per node registry (`server_rpc_metrics`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.collector = RpcCollector(
            "server",
            "RPCs the gateway's listeners served, by method and the gRPC status they ended with.",
            "Time from an RPC's start to its end on the gateway's listeners, by method (for a"
            " stream, its lifetime).",
        )
        registry.register(self.collector)

    def instrument(self, routes: Collection[Routes]) -> tuple[Routes, ...]:
        """`routes` with every method counted and timed (module doc)."""
        return tuple(
            Routes({path: self._metered(path, h) for path, h in r.__mapping__().items()})
            for r in routes
        )

    def _metered(self, path: str, handler: Handler) -> Handler:
        observe = self.collector.method(path, handler.cardinality).observe
        func: MethodFunc = handler.func
        clock = time.perf_counter

        async def metered(stream: Any) -> None:
            start = clock()
            h2_stream = stream._stream
            trailers = _Trailers(h2_stream.send_headers)
            h2_stream.send_headers = trailers
            status = Status.OK
            try:
                await func(stream)
            except GRPCError as error:
                status = error.status
                raise
            except (asyncio.CancelledError, StreamTerminatedError):
                status = _ended(stream)
                raise
            except Exception:
                status = Status.UNKNOWN
                raise
            else:
                if trailers.status is not None:
                    status = trailers.status
            finally:
                # The stream and the stand-in point at each other: undone here, so the stream
                # goes when grpclib lets go of it, not at a garbage collection. What grpclib
                # writes after the handler (OK, or an error's trailers) is known without it.
                del h2_stream.send_headers
                observe(clock() - start, status)

        return handler._replace(func=metered)


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, ServerRpcMetrics] = (
    weakref.WeakKeyDictionary()
)


def server_rpc_metrics(registry: CollectorRegistry) -> ServerRpcMetrics:
    """The node's families (created on the first call for a registry)."""
    metrics = _METRICS.get(registry)
    if metrics is None:
        metrics = _METRICS[registry] = ServerRpcMetrics(registry)
    return metrics
