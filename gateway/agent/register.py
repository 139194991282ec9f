"""Register: a request process (seed: "Register Proxy", "Per-connection session cap",
"Client addresses behind a proxy", "Known limits"; SPEC_INDEX REG-01..REG-21, PEND-01..PEND-05).

In the seed's order, each step before the next:

1. The agent id: empty, missing or over 256 bytes (bytes, not characters; exactly 256 is
   accepted; bytes as received, so also when the request's text is not valid UTF-8, read
   leniently) is INVALID_ARGUMENT at once, with a warn-limited WARN giving the size only and
   `yuzu_gw_register_refused_total{reason="agent_id_length"}`. Nothing else has happened yet:
   no peer handling, no reservation, no upstream call.
2. Origin attribution: `gateway_observed_peer` is overwritten with the address the listener
   decided for the call (a bare IP, or empty for "not observed"); the agent's value is dropped.
3. The peer address kept for the session (pending row, owner, notifications) is that address
   sanitised (`sanitise_peer_addr`), or `unknown` when not observed; it is not sent upstream.
   A request that would go upstream over the server's 4194304-byte limit, or whose text is not
   valid UTF-8 (seed: "Known limits": answered INTERNAL, breaker-neutral), is refused INTERNAL
   here (counted as an encode error).
   Then the storm bound (gateway/agent/admission.py): past it, RESOURCE_EXHAUSTED with a
   grpc-retry-pushback-ms sized from the node's drain rate, before anything below happens.
4. A slot on this connection (`reserve_slot`): atomic with the cap, in-flight reservations
   counted. Cap: UNAVAILABLE. The block releases the slot on every path that does not commit,
   a cancelled call included, without awaiting anything.
5. ProxyRegister through `UpstreamCalls` (a `register` permit, the breaker, the agent's
   deadline less the handler margin, at most upstream_rpc_timeout_ms as grpc-timeout). A
   cancelled agent call frees its permit at once; a call already sent runs on.
6. An accepted answer with a session id commits the pending row under the same-agent rule;
   superseded: UNAVAILABLE "Registration superseded by a newer registration".
7. The server's answer is relayed verbatim, accepted=false included (no row then).
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from google.protobuf.message import Message
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from actors.core.admission import Call
from actors.core.breaker import Lane
from actors.core.heartbeat_sanitise import lenient_class
from actors.core.notify_store import log_text, sanitise_peer_addr
from actors.core.permits import Caller
from actors.registry.api import SUPERSEDED_DETAILS
from actors.registry.registration import RegistryUnavailable, SlotRefused, reserve_slot
from actors.upstream.api import PROXY_REGISTER, UpstreamCallError, UpstreamRefused
from gateway.agent.lenient import Undecoded
from gateway.agent.plane import (
    AgentPlane,
    conn_key,
    loosened,
    receive,
    refuse_oversize,
    undecodable,
)
from gateway.agent.status import (
    AGENT_ID_DETAILS,
    internal,
    session_refused,
    unavailable,
    upstream_failed,
    upstream_refused,
)
from gateway.listeners.connection import current_call
from protos.yuzu.agent.v1 import agent_pb2

__all__ = [
    "MAX_AGENT_ID_BYTES",
    "REGISTRY_UNAVAILABLE_LOG",
    "UNOBSERVED_PEER",
    "proxy_call",
    "register",
    "remaining_s",
]

log = logging.getLogger("yuzu_gw.agent")

M = TypeVar("M", bound=Message)

# The server's own bound (kMaxAgentIdLength): refusing here gives the agent the same status
# class without an upstream call, and keeps a wrong request away from the breaker.
MAX_AGENT_ID_BYTES = 256
# A Register with text that is not valid UTF-8, read for its agent id's size.
_LENIENT_REQUEST: Any = lenient_class(agent_pb2.RegisterRequest.DESCRIPTOR)
# What the session keeps as its peer when the listener had no observation (seed: peer_addr is
# "unknown when the listener had no observation for the registration").
UNOBSERVED_PEER = "unknown"
# The seed's safe-call warning (L53): the class of the failure only (noproc, timeout, other).
REGISTRY_UNAVAILABLE_LOG = "Register: the registry call failed ({cls}); answered INTERNAL"


def remaining_s(stream: Stream[object, object]) -> float | None:
    """What is left of the agent's grpc-timeout; None when it sent none."""
    deadline = stream.deadline
    return None if deadline is None else deadline.time_remaining()


async def register(
    plane: AgentPlane, stream: Stream[agent_pb2.RegisterRequest, agent_pb2.RegisterResponse]
) -> None:
    received = await receive(stream)
    if isinstance(received, Undecoded):
        # Text that is not valid UTF-8: the agent id bound still comes first (step 1).
        loose = loosened(plane, received, _LENIENT_REQUEST, Lane.REGISTER, PROXY_REGISTER)
        _check_agent_id(plane, len(loose.info.agent_id))
        raise undecodable(plane, Lane.REGISTER, PROXY_REGISTER)
    request = received
    agent_id = request.info.agent_id
    _check_agent_id(plane, len(agent_id.encode("utf-8")))

    origin = _origin()
    request.gateway_observed_peer = origin
    peer = _session_peer(plane, agent_id, origin)
    plugins = tuple(plugin.name for plugin in request.info.plugins)
    refuse_oversize(plane, request, Lane.REGISTER, PROXY_REGISTER)
    # Past the storm bound: refused with a hint before any reservation, permit or upstream call.
    with plane.admitted(Call.REGISTER):
        response = await _registered(plane, stream, request, peer, plugins)
        await stream.send_message(response)


async def _registered(
    plane: AgentPlane,
    stream: Stream[agent_pb2.RegisterRequest, agent_pb2.RegisterResponse],
    request: agent_pb2.RegisterRequest,
    peer: str,
    plugins: tuple[str, ...],
) -> agent_pb2.RegisterResponse:
    """Steps 4 to 7: the slot, ProxyRegister, the pending row; the answer to relay."""
    agent_id = request.info.agent_id
    try:
        async with reserve_slot(plane.runtime, conn_key(), agent_id) as slot:
            response = await proxy_call(
                plane,
                stream,
                request,
                agent_pb2.RegisterResponse,
                caller=Caller.REGISTER,
                method=PROXY_REGISTER,
                rpc="Register",
                warn_kind="register_upstream",
            )
            if response.accepted and response.session_id:
                committed = await slot.commit(response.session_id, peer, plugins, request)
                if not committed:
                    # The registry logged the INFO line (no request, no agent id).
                    raise unavailable(SUPERSEDED_DETAILS)
    except SlotRefused as refused:
        # cap, or a connection already going down: either way the agent comes back.
        raise session_refused("Register", refused.reason) from None
    except RegistryUnavailable as unavailable_registry:
        # S09: a registry that cannot be reached (or a row lost with its restart). L53: one
        # line a second for the called process, naming only the class of the failure.
        plane.warn(
            "registry_call", REGISTRY_UNAVAILABLE_LOG.format(cls=unavailable_registry.exit_class)
        )
        raise internal("Register failed: registry_unavailable") from None
    return response


def _check_agent_id(plane: AgentPlane, size: int) -> None:
    """Step 1: the agent id's size in bytes, as received."""
    if not 0 < size <= MAX_AGENT_ID_BYTES:
        plane.metrics.register_refused.labels("agent_id_length").inc()
        plane.warn(
            "register_agent_id",
            f"Register refused: the agent id is empty or longer than 256 bytes (size {size} bytes)",
        )
        raise GRPCError(Status.INVALID_ARGUMENT, AGENT_ID_DETAILS)


def _origin() -> str:
    try:
        return current_call().origin
    except LookupError:
        return ""


def _session_peer(plane: AgentPlane, agent_id: str, origin: str) -> str:
    """The address kept for the session: valid UTF-8 of at most 255 bytes (REG-17)."""
    raw = origin or UNOBSERVED_PEER
    peer = sanitise_peer_addr(raw)
    if peer != raw:
        plane.warn(
            "register_peer",
            f"Register from agent {log_text(agent_id)}: the peer address was replaced or cut to"
            f" fit (original size {len(raw.encode('utf-8', 'surrogateescape'))} bytes)",
        )
    return peer


async def proxy_call(
    plane: AgentPlane,
    stream: Stream[Any, Any],
    request: Message,
    response_type: type[M],
    *,
    caller: Caller,
    method: str,
    rpc: str,
    warn_kind: str,
) -> M:
    """One proxied call under the agent's remaining deadline. A refusal before sending
    (circuit_open, queue_full, deadline, stopping, unavailable: come back later) and a failed
    call are each logged through the plane's limiter and answered with their status."""
    try:
        return await plane.calls.call(
            caller, method, request, response_type, grpc_timeout_s=remaining_s(stream)
        )
    except UpstreamRefused as refused:
        plane.warn(warn_kind, f"Upstream {rpc} failed: {refused.reason}")
        raise upstream_refused(refused, rpc) from None
    except UpstreamCallError as error:
        plane.warn(warn_kind, f"Upstream {rpc} failed: {error}")
        raise upstream_failed(error, rpc) from None
