"""What a restarted agent owner asks of the `upstream` actor while it recovers its session, and
the answers (seed: "When an agent's owner process crashes", step 3; docs/owner-recovery.md).

    owner -> upstream   SettleDisconnected(notify)    the predecessor's DISCONNECTED
    upstream -> owner   DisconnectSettled              it was delivered, refused or lost
    owner -> upstream   PresentSession(...)            ProxyRegister with the session id
    upstream -> owner   SessionPresented               the server's answer, or why none
"""

from __future__ import annotations

import attrs

from actors.core.notify_store import SettledOutcome
from actors.upstream.api import Notify
from protos.yuzu.agent.v1 import agent_pb2

__all__ = ["DisconnectSettled", "PresentSession", "SessionPresented", "SettleDisconnected"]


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
