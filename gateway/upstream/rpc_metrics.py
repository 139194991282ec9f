"""Per-method request counts and latency of every call the gateway makes to the server
(docs/metrics.md, "RPC metrics").

Every upstream call (ProxyRegister, ProxyInventory, BatchHeartbeat, NotifyStreamStatus,
ForwardGuardianMessage, whichever lane sends it) goes out through one grpclib stream of a
`SlotChannel` (grpclib_glue.py), which hands it to `metered` here:

- `yuzu_gw_grpc_client_handled_total{grpc_type, grpc_service, grpc_method, grpc_code}`: calls
  ended, by gRPC status;
- `yuzu_gw_grpc_client_handling_seconds{grpc_type, grpc_service, grpc_method}`: from the request's
  headers to the call's end.

A call is counted once it has a connection and is sent: one refused before that (no permit, the
breaker open, no live connection, past the server's stream limit) is in the refusal counters
instead (docs/upstream-breaker-and-permits.md). The code is the server's status, or what a gRPC
client reports for a failure of its own: DEADLINE_EXCEEDED for the call's deadline, UNAVAILABLE
for a lost connection, a reset stream or a TLS failure, RESOURCE_EXHAUSTED for a response over
max_receive_message_bytes, an HTTP status by gRPC's mapping, INTERNAL otherwise, CANCELLED when
the caller went away. The local kinds stay in `yuzu_gw_upstream_rpc_errors_total`.

The families are the process's, not the node registry's: the connections that make the calls are
built below the node's context. Each node registry exports them (`export`); a node runs alone in
its process (the release supervisor starts one process per node), so that is the node's count;
two nodes in one test process both show the sum.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from types import TracebackType
from typing import Any, Final

from grpclib.client import Stream
from grpclib.const import Cardinality, Status
from prometheus_client import CollectorRegistry

from actors.core.breaker import ResultKind
from actors.upstream.api import UpstreamCallError
from gateway.listeners.rpc_metrics import MethodStats, RpcCollector
from gateway.upstream.failures import ResponseTooLargeError, call_error

__all__ = ["CLIENT", "MeteredCall", "client_code", "export", "method_series"]

CLIENT: Final = RpcCollector(
    "client",
    "Calls the gateway made to the server, by method and the gRPC status they ended with.",
    "Time from a call's request to its end, for the gateway's calls to the server, by method.",
)
# gRPC's mapping of an HTTP status that is not 200 (doc/http-grpc-status-mapping.md).
_HTTP: Final = {
    "400": Status.INTERNAL,
    "401": Status.UNAUTHENTICATED,
    "403": Status.PERMISSION_DENIED,
    "404": Status.UNIMPLEMENTED,
    "429": Status.UNAVAILABLE,
    "502": Status.UNAVAILABLE,
    "503": Status.UNAVAILABLE,
    "504": Status.UNAVAILABLE,
}
_LOCAL: Final = {
    ResultKind.TIMEOUT: Status.DEADLINE_EXCEEDED,
    ResultKind.TRANSPORT: Status.UNAVAILABLE,
    ResultKind.TLS: Status.UNAVAILABLE,
}


def client_code(error: BaseException | None) -> Status:
    """The gRPC status a call that ended with `error` (None: answered) is counted under."""
    if error is None:
        return Status.OK
    if isinstance(error, asyncio.CancelledError):
        return Status.CANCELLED
    if isinstance(error, ResponseTooLargeError):
        return Status.RESOURCE_EXHAUSTED
    failure: UpstreamCallError = call_error(error)
    if failure.kind is ResultKind.STATUS and failure.status is not None:
        try:
            return Status(failure.status)
        except ValueError:
            return Status.UNKNOWN
    if failure.kind is ResultKind.HTTP:
        return _HTTP.get(failure.detail.rpartition(" ")[2], Status.UNKNOWN)
    return _LOCAL.get(failure.kind, Status.INTERNAL)


class MeteredCall:
    """`async with` around one grpclib client stream: times it and counts how it ended."""

    __slots__ = ("series", "start", "stream")

    def __init__(self, stream: Stream[Any, Any], series: MethodStats) -> None:
        self.stream = stream
        self.series = series
        self.start = 0.0

    async def __aenter__(self) -> Stream[Any, Any]:
        self.start = time.perf_counter()
        try:
            return await self.stream.__aenter__()
        except BaseException as error:
            self._ended(error)
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.stream.__aexit__(exc_type, exc, tb)
        except BaseException as error:
            self._ended(error)
            raise
        self._ended(exc)

    def _ended(self, error: BaseException | None) -> None:
        self.series.observe(time.perf_counter() - self.start, client_code(error))


_EXPORTED: weakref.WeakSet[CollectorRegistry] = weakref.WeakSet()


def method_series(path: str, cardinality: Cardinality) -> MethodStats:
    return CLIENT.method(path, cardinality)


def export(registry: CollectorRegistry, methods: tuple[str, ...]) -> None:
    """Export the families on a node's registry (once per registry), with the series of each
    of `methods` (unary paths) made now at 0."""
    for path in methods:
        CLIENT.method(path, Cardinality.UNARY_UNARY)
    if registry not in _EXPORTED:
        _EXPORTED.add(registry)
        # One collector may sit in several registries: each scrape reads the same figures.
        registry.register(CLIENT)
