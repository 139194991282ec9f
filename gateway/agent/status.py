"""Which gRPC status the agent plane answers for each refusal (SPEC_INDEX section 4).

The rule of the seed: a refusal the gateway makes itself, where the agent should simply come
back (a cap, an open breaker, a full permit queue, a deadline, a planned stop, an upstream that
could not be reached), is UNAVAILABLE; a registry that cannot be reached, a server status and
any other failure are INTERNAL. The agent re-registers on any non-OK status either way; the
distinction is for operators and for agents that honour UNAVAILABLE as "retry elsewhere".
Those UNAVAILABLE refusals carry a retry hint, `grpc-retry-pushback-ms`
(gateway/listeners/retry_hint.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from actors.core.breaker import ResultKind
from actors.upstream.api import RefusalReason, UpstreamCallError, UpstreamRefused
from gateway.listeners.retry_hint import HintedRefusal, RefusalKind

__all__ = [
    "AGENT_ID_DETAILS",
    "EXECUTE_COMMAND_DETAILS",
    "internal",
    "not_found",
    "session_refused",
    "unavailable",
    "upstream_failed",
    "upstream_refused",
]

# S01: the message names the rule, never the id.
AGENT_ID_DETAILS = "agent_id length exceeds 256 bytes or is empty"
EXECUTE_COMMAND_DETAILS = "Use Subscribe for command delivery"

# The call never reached the server, or no answer came back: the server's state is unknown and
# the agent should come back (the seed's upstream_unavailable, answered UNAVAILABLE since
# #5695). A server status, an encoding failure and an exception are INTERNAL (S10, S11, S13).
_UNREACHED = frozenset(
    {ResultKind.TRANSPORT, ResultKind.TIMEOUT, ResultKind.TLS, ResultKind.TOO_MANY_STREAMS}
)


# The retry hint of each upstream refusal (the call was never sent).
_UPSTREAM_HINTS: Mapping[RefusalReason, RefusalKind] = {
    "circuit_open": RefusalKind.BREAKER,
    "queue_full": RefusalKind.PERMITS,
    "deadline": RefusalKind.PERMITS,
    "stopping": RefusalKind.STOPPING,
    "unavailable": RefusalKind.RESTARTING,
}


def unavailable(details: str) -> GRPCError:
    return GRPCError(Status.UNAVAILABLE, details)


def internal(details: str) -> GRPCError:
    return GRPCError(Status.INTERNAL, details)


def not_found(details: str) -> GRPCError:
    return GRPCError(Status.NOT_FOUND, details)


def upstream_failed(error: UpstreamCallError, method: str) -> GRPCError:
    """A failed ProxyRegister / ProxyInventory. The details name the kind only: a server's
    message could echo the request back."""
    if error.kind in _UNREACHED:
        return unavailable(f"Upstream {method} failed: {error.kind.value}")
    return internal(f"Upstream {method} failed: {error.kind.value}")


def upstream_refused(refused: UpstreamRefused, method: str) -> HintedRefusal:
    """A ProxyRegister / ProxyInventory the gateway did not send: come back after the hint."""
    kind = _UPSTREAM_HINTS[refused.reason]
    return HintedRefusal(kind, f"Upstream {method} failed: {refused.reason}")


def session_refused(method: str, reason: str) -> HintedRefusal:
    """No session slot on this connection (Register's reservation, Subscribe's take): the cap,
    or the connection going down."""
    kind = RefusalKind.SESSION_CAP if reason == "cap" else RefusalKind.CONNECTION_CLOSING
    return HintedRefusal(kind, f"{method} refused: {reason}")
