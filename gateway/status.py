"""Which gRPC status the agent plane answers for each refusal (SPEC_INDEX section 4).

The rule of the seed: a refusal the gateway makes itself, where the agent should simply come
back (a cap, an open breaker, a full permit queue, a deadline, a planned stop, an upstream that
could not be reached), is UNAVAILABLE; a registry that cannot be reached, a server status and
any other failure are INTERNAL. The agent re-registers on any non-OK status either way; the
distinction is for operators and for agents that honour UNAVAILABLE as "retry elsewhere".
"""

from __future__ import annotations

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from actors.core.breaker import ResultKind
from gateway.upstream.api import UpstreamCallError

__all__ = [
    "AGENT_ID_DETAILS",
    "EXECUTE_COMMAND_DETAILS",
    "internal",
    "not_found",
    "unavailable",
    "upstream_failed",
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
