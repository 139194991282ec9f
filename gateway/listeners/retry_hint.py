"""Retry hints: every refusal the gateway answers itself carries `grpc-retry-pushback-ms`, so
agents that honour it come back spread over a window instead of all at once (seed 003: refusals
that tell the client when to come back; issue 7 section 4).

The hint is drawn uniformly from the range of the refusal's kind, per refusal, so a fleet
refused at the same moment comes back spread over the whole range:

| kind | refusals | range |
| --- | --- | --- |
| `permits` | no upstream permit (`queue_full`, `deadline`) | 250 ms to 2 s |
| `restarting` | a process it needs is not running (upstream, router, registry) | 250 ms to 2 s |
| `connection_closing` | the agent's connection is going down (`connection_down`) | 250 ms to 2 s |
| `session_cap` | the per-connection session cap | 5 to 30 s |
| `breaker` | the circuit breaker is open (`circuit_open`) | 10 to 30 s |
| `stopping` | a planned stop (`stopping`) | 5 to 30 s |
| `overloaded` | an agent listener's overload go-away (docs/listeners.md) | 150 to 300 s |

grpclib refuses to send a `grpc-` key as metadata (the prefix is the transport's), so
`send_refusal` writes the trailers itself, exactly as grpclib's `send_trailing_metadata` would,
plus the hint. Handlers raise a `HintedRefusal` (a `GRPCError`: anything that does not know it
still answers the right status); the agent plane's `guarded` answers it with `send_refusal`.

Memory shedding refuses new connections at the socket (the listener stops accepting), before any
HTTP/2 exchange, so no status and no trailer can reach the agent there.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.metadata import encode_grpc_message
from grpclib.server import Stream

__all__ = [
    "BREAKER_HINT_MS",
    "CAPACITY_HINT_MS",
    "HINT_RANGES_MS",
    "OVERLOADED_HINT_MS",
    "PUSHBACK_HEADER",
    "SHORT_HINT_MS",
    "STOPPING_HINT_MS",
    "HintedRefusal",
    "RefusalKind",
    "pushback_ms",
    "send_refusal",
    "trailer",
]

PUSHBACK_HEADER = "grpc-retry-pushback-ms"


class RefusalKind(enum.Enum):
    PERMITS = "permits"
    RESTARTING = "restarting"
    CONNECTION_CLOSING = "connection_closing"
    SESSION_CAP = "session_cap"
    BREAKER = "breaker"
    STOPPING = "stopping"
    OVERLOADED = "overloaded"


# Seed 003, maxPendingHellos "250 ms to 2 s": a queue or a restart gap that clears in a second.
SHORT_HINT_MS = (250, 2_000)
# Seed 003, maxStreams "5 to 30 s": a bound that frees only as sessions end.
CAPACITY_HINT_MS = (5_000, 30_000)
# Seed 000, "Slow server": the breaker's backoff doubles from 10 s up to 30 s.
BREAKER_HINT_MS = (10_000, 30_000)
# A planned stop lasts up to shutdown_flush_budget_ms (20 s by default): come back after it,
# to this node restarted or to a peer, spread like a capacity refusal.
STOPPING_HINT_MS = (5_000, 30_000)
# Seed 001: a router at its high watermark sends members away "with a 5 minute retry time"; drawn
# from its second half, so a batch sent away together does not come back together.
OVERLOADED_HINT_MS = (150_000, 300_000)

HINT_RANGES_MS: Mapping[RefusalKind, tuple[int, int]] = {
    RefusalKind.PERMITS: SHORT_HINT_MS,
    RefusalKind.RESTARTING: SHORT_HINT_MS,
    RefusalKind.CONNECTION_CLOSING: SHORT_HINT_MS,
    RefusalKind.SESSION_CAP: CAPACITY_HINT_MS,
    RefusalKind.BREAKER: BREAKER_HINT_MS,
    RefusalKind.STOPPING: STOPPING_HINT_MS,
    RefusalKind.OVERLOADED: OVERLOADED_HINT_MS,
}

# Not for security: the jitter only has to differ between refusals.
_RANDOM = random.Random()


def pushback_ms(kind: RefusalKind, rng: random.Random) -> int:
    """The hint for one refusal: uniform over the kind's range, both ends included."""
    low, high = HINT_RANGES_MS[kind]
    return rng.randint(low, high)


def trailer(kind: RefusalKind, rng: random.Random = _RANDOM) -> tuple[str, str]:
    """The trailing-metadata pair of one refusal."""
    return PUSHBACK_HEADER, str(pushback_ms(kind, rng))


class HintedRefusal(GRPCError):
    """UNAVAILABLE with a retry hint: raise it where the gateway refuses a call itself."""

    def __init__(self, kind: RefusalKind, details: str, rng: random.Random = _RANDOM) -> None:
        super().__init__(Status.UNAVAILABLE, details)
        self.kind = kind
        self.trailer = trailer(kind, rng)


async def send_refusal(stream: Stream[Any, Any], refusal: HintedRefusal) -> None:
    """End the call with the refusal's status, details and hint (grpclib 0.4's trailers: a
    trailers-only response when nothing was sent yet; the stream is reset after, as grpclib
    does for a non-OK status)."""
    if stream._send_trailing_metadata_done:
        return
    h2_stream = stream._stream
    headers: list[tuple[str, str]] = []
    if not stream._send_initial_metadata_done:
        headers += [(":status", "200"), ("content-type", stream._content_type)]
    headers.append(("grpc-status", str(refusal.status.value)))
    if refusal.message is not None:
        headers.append(("grpc-message", encode_grpc_message(refusal.message)))
    headers.append(refusal.trailer)
    await h2_stream.send_headers(headers, end_stream=True)
    stream._send_trailing_metadata_done = True
    if h2_stream.closable:
        h2_stream.reset_nowait()
