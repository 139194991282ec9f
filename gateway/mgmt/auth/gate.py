"""The per-stream check of a management listener and the guard that puts it in front of every
ManagementService method.

    gate = PeerGate(policy, board, metrics)
    routes = gate.guard(spec, routes)      # what the listener serves

On a judged listener (the ManagementService over TLS, `boot.is_judged`) each routed method of
the ManagementService is wrapped: before the handler runs, the gate reads the peer certificate
the connection captured at its handshake (decoded once per connection, then cached until the
connection closes), decides with the pins the watcher last published (an attribute read, no
message, no file), counts the outcome, and refuses with UNAUTHENTICATED. The request message is
never read for a refused stream. Server reflection, where `grpc_reflection` serves it there, is
guarded the same way: only an authorised peer may list and describe the services. Other services
of a combined listener are left alone, and so is `grpc.health.v1.Health`, answered before
authorisation on purpose: a probe has no server certificate, and the answer is one status per
service name the caller already knows (docs/health.md). A plaintext listener is not judged.

A refusal is logged at WARNING by reason only, at most once a minute per reason with the count
held back: every holder of a certificate from the install CA reaches this check, so a line per
stream (or one naming the certificate) would hand such a peer a lever on the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import attrs
from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError

from actors.core.warn_limit import WarnLimiter
from gateway.config.certs import PeerCert, read_peer
from gateway.config.listener_spec import MGMT_SERVICE, ListenerSpec
from gateway.config.mgmt_auth_boot import is_judged
from gateway.listeners.connection import ConnectionInfo, current_call
from gateway.listeners.grpc_health import REFLECTION_PREFIXES
from gateway.listeners.server import Routes
from gateway.mgmt.auth.decide import Admitted, Decision, Policy, Rejected, decide
from gateway.mgmt.auth.metrics import MgmtAuthMetrics
from gateway.mgmt.auth.reasons import Reason

__all__ = ["REFUSED_MESSAGE", "PeerGate", "PinBoard"]

log = logging.getLogger("yuzu_gw.mgmt_auth")

# What the peer is told: the reason is on the gateway's metrics and log, not on the wire.
REFUSED_MESSAGE = "management peer not authorized"
# One line per reason per minute (the count held back rides on the next line).
_LOG_INTERVAL_S = 60.0
# What the gate guards: the ManagementService and reflection (Health is never guarded).
_GUARDED = (f"/{MGMT_SERVICE}/", *REFLECTION_PREFIXES)

MethodFunc = Callable[[Any], Awaitable[None]]


@attrs.define
class PinBoard:
    """Where the watcher publishes the pins and the per-stream check reads them. Created with
    the tree, so it outlives a restarted watcher."""

    pins: frozenset[bytes] = frozenset()


class PeerGate:
    def __init__(
        self,
        policy: Policy,
        board: PinBoard,
        metrics: MgmtAuthMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.board = board
        self.metrics = metrics
        self._clock = clock
        self._limiter = WarnLimiter(_LOG_INTERVAL_S)
        # Connection key -> the decoded peer certificate, until the connection closes.
        self._peers: dict[int, PeerCert | None] = {}

    # -- the check ----------------------------------------------------------------------------

    def check(self, conn: ConnectionInfo) -> Decision:
        """Decide one stream of `conn`, count it, log a refusal (rate-limited). Never raises:
        a failure of the check itself refuses `internal_error`."""
        try:
            decision = decide(self._peer(conn), self.policy, self.board.pins)
        except Exception as exc:
            log.error("management peer check failed (%s); stream refused", type(exc).__name__)
            decision = Rejected(Reason.INTERNAL_ERROR)
        if isinstance(decision, Admitted):
            self.metrics.admitted.labels(decision.method.value).inc()
        else:
            self.metrics.rejected.labels(decision.reason.value).inc()
            suffix = self._limiter.admit(decision.reason, self._clock())
            if suffix is not None:
                log.warning(
                    "management peer refused: %s (UNAUTHENTICATED; docs/mgmt-auth.md)%s",
                    decision.reason.value,
                    suffix,
                )
        return decision

    def _peer(self, conn: ConnectionInfo) -> PeerCert | None:
        key = conn.key
        if key in self._peers:
            return self._peers[key]
        peer = read_peer(conn.peer_cert())
        if conn.open:
            self._peers[key] = peer
            conn.on_close(self._forget)
        return peer

    def _forget(self, conn: ConnectionInfo) -> None:
        self._peers.pop(conn.key, None)

    # -- the guard ----------------------------------------------------------------------------

    def guard(self, spec: ListenerSpec, routes: Collection[Routes]) -> tuple[Routes, ...]:
        """`routes` with every ManagementService and reflection method checked first, on a
        judged listener; unchanged on any other."""
        if not is_judged(spec):
            return tuple(routes)
        return tuple(
            Routes(
                {
                    path: self._guarded(handler) if path.startswith(_GUARDED) else handler
                    for path, handler in r.__mapping__().items()
                }
            )
            for r in routes
        )

    def _guarded(self, handler: Handler) -> Handler:
        func: MethodFunc = handler.func

        async def checked(stream: Any) -> None:
            if isinstance(self.check(current_call().connection), Rejected):
                raise GRPCError(Status.UNAUTHENTICATED, REFUSED_MESSAGE)
            await func(stream)

        return handler._replace(func=checked)
