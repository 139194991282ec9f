"""Messages the `upstream` actor takes from the agent plane (tell, fire and forget).

What a restarted agent owner asks of the `upstream` actor while it recovers its session, and
the answers (seed: "When an agent's owner process crashes", step 3; docs/owner-recovery.md).

    owner -> upstream   SettleDisconnected(notify)    the predecessor's DISCONNECTED
    upstream -> owner   DisconnectSettled              it was delivered, refused or lost
    owner -> upstream   PresentSession(...)            ProxyRegister with the session id
    upstream -> owner   SessionPresented               the server's answer, or why none

The contract between the upstream channel and its callers.

A call either returns the decoded response or raises `UpstreamCallError`, whose `kind`
(and `status` for a gRPC status) is what the circuit breaker classifies
(`actors.core.breaker.classify`). `detail` is safe to log: it never holds request or
response contents, certificate paths of key files, or metadata values.

The GatewayUpstream methods the gateway calls (gRPC routes on the full path).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, Protocol, TypeVar

import attrs
from google.protobuf.message import Message

from actors.core.breaker import ResultKind
from actors.core.notify_store import Event, SettledOutcome
from protos.yuzu.agent.v1 import agent_pb2


@attrs.frozen
class Notify:
    """Hold and send a stream-status notification (NotifyStreamStatus)."""

    agent_id: str
    session_id: str = attrs.field(repr=False)
    stream_home_id: str
    event: Event
    peer_addr: str = attrs.field(repr=False)


@attrs.frozen
class ForwardGuardian:
    """Forward an unsolicited `__guard__` frame upstream with the gateway-asserted agent id
    (at most 50 in flight; dropped while the breaker is open)."""

    agent_id: str
    response: agent_pb2.CommandResponse = attrs.field(repr=False)


@attrs.frozen
class SettleDisconnected:
    """Hold and send `notify` (a DISCONNECTED) like any notification, after ending every resend
    of the session (a refused notice of the predecessor is not sent again: counted
    unacked_ended{superseded}); answer `DisconnectSettled` when it settles."""

    notify: Notify


@attrs.frozen
class DisconnectSettled:
    session_id: str = attrs.field(repr=False)
    outcome: SettledOutcome


@attrs.frozen
class PresentSession:
    """ProxyRegister `request` with `session_id` in x-yuzu-session-id (the replay permits, the
    breaker, upstream_rpc_timeout_ms); answer `SessionPresented`."""

    session_id: str = attrs.field(repr=False)
    agent_id: str
    request: agent_pb2.RegisterRequest = attrs.field(repr=False)


@attrs.frozen
class SessionPresented:
    """`accepted`: the server adopted the session. Otherwise `details` ends the agent's stream
    (UNAVAILABLE) and `reason` is the counted cause (`not_accepted`, `superseded`, `failed`,
    `stopping`)."""

    session_id: str = attrs.field(repr=False)
    accepted: bool
    details: str = ""
    reason: str = ""


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


SERVICE: Final = "yuzu.gateway.v1.GatewayUpstream"


PROXY_REGISTER: Final = f"/{SERVICE}/ProxyRegister"


BATCH_HEARTBEAT: Final = f"/{SERVICE}/BatchHeartbeat"


PROXY_INVENTORY: Final = f"/{SERVICE}/ProxyInventory"


NOTIFY_STREAM_STATUS: Final = f"/{SERVICE}/NotifyStreamStatus"


FORWARD_GUARDIAN_MESSAGE: Final = f"/{SERVICE}/ForwardGuardianMessage"


# The metadata key that presents a session on a replay or an owner recovery (WIRE.md).
SESSION_ID_METADATA: Final = "x-yuzu-session-id"
