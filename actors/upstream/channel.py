"""The contract between the upstream channel and its callers.

A call either returns the decoded response or raises `UpstreamCallError`, whose `kind`
(and `status` for a gRPC status) is what the circuit breaker classifies
(`actors.core.breaker.classify`). `detail` is safe to log: it never holds request or
response contents, certificate paths of key files, or metadata values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from google.protobuf.message import Message

from actors.core.breaker import ResultKind

M = TypeVar("M", bound=Message)


class UpstreamCallError(Exception):
    def __init__(self, kind: ResultKind, status: int | None = None, detail: str = "") -> None:
        super().__init__(
            f"{kind.value}"
            + (f" {status}" if status is not None else "")
            + (f": {detail}" if detail else "")
        )
        self.kind = kind
        self.status = status
        self.detail = detail


class Channel(Protocol):
    """One named upstream channel (`default_channel`)."""

    name: str

    async def unary(
        self,
        method: str,
        request: Message,
        response_type: type[M],
        *,
        timeout: float,
        metadata: Mapping[str, str] | None = None,
    ) -> M:
        """Send one unary call on the next live connection (round robin). `timeout`
        (seconds) covers waiting for a connection too and is sent as `grpc-timeout`."""
        ...

    def server_max_streams(self) -> int:
        """The sum of SETTINGS_MAX_CONCURRENT_STREAMS over live connections; 0 = unknown
        or no limit declared."""
        ...

    def add_settings_listener(self, listener: Callable[[int], None]) -> None:
        """Called with the new total whenever it changes."""
        ...

    def tls_files_usable(self) -> bool:
        """False while the latest connection attempt failed on unusable TLS files (the
        `upstream_tls_files` readiness check)."""
        ...
