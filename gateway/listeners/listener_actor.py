"""`ListenerActor`: one gRPC listener as a supervised actor.

- `init` loads the TLS files and binds the port: a listener that cannot do either fails its
  start, and at boot that refuses the boot (the supervisor's ordered start).
- The accept loop runs as the actor's worker; an accept error it cannot ride out crashes the
  actor and the supervisor restarts it (a fresh socket, the same port).
- `Suspend` closes the listen socket and `Resume` binds it again (the memory shedder and the
  planned stop use them); each answers with the `ListenerState` now in force. A resume that
  fails (the port was taken, no descriptors) leaves the listener suspended and says why; the
  caller retries.
- `Drain` sends every connection, established or to come, the graceful GOAWAY (NO_ERROR, the
  last stream id taken, debug data with the reason and a retry time; server.py, protocol.py):
  open streams run to their end, new streams are refused. The planned stop sends it right
  after `Suspend`, before the sessions end; it answers `Drained` with the connections told.
- With `overload_goaway` configured, the actor runs that policy (actors/core/overload_goaway.py)
  on one timer: at the high watermark it sends connections away at random down to the low one
  (the graceful GOAWAY `overloaded`, their Subscribes end UNAVAILABLE with the same retry time,
  drawn from the `overloaded` hint range) and closes those still open after the grace. A
  draining listener runs it no more: the planned stop tells every connection itself.
- The state is published in the protected table `listener:<name>` (row "state") for the
  `listeners` readiness check, which reads it without a message. The table dies with the
  actor, so a listener that crashed reads as not running until its successor is up.
- `terminate` closes the listen socket and every connection (GOAWAY, then close): listeners
  stop first in a planned stop, after the drain has had its time.
- With `extras` (the node's `ListenerExtras`), every route served is counted and timed
  (rpc_metrics.py), and a `Drain` turns the node's gRPC Health NOT_SERVING before the GOAWAY
  goes (grpc_health.py): only the planned stop drains.
"""

from __future__ import annotations

import errno
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from thespian.actors import WakeupMessage

from actors.core.overload_goaway import GRACE_S, Close, Effect, OverloadGoAway, SendAway
from actors.listeners.api import (
    RUNNING,
    STATE_ROW,
    SUSPENDED,
    ListenerState,
    Resume,
    State,
    Suspend,
    actor_name,
    table_name,
)
from gateway.config.listener_spec import ListenerSpec
from gateway.listeners.connection import ConnectionInfo
from gateway.listeners.extras import ListenerExtras
from gateway.listeners.metrics import ListenerMetrics
from gateway.listeners.retry_hint import OVERLOADED_HINT_MS
from gateway.listeners.server import HANDSHAKE_TIMEOUT_S, ListenerServer, Routes
from gateway.listeners.tls import TlsFilesUnusable
from supervisors.address import Address
from supervisors.messages import WorkerDone
from supervisors.process import Process
from supervisors.reason import ExitReason
from supervisors.table import Table

log = logging.getLogger("yuzu_gw.listeners")

_ACCEPT = "accept"
_OVERLOAD = "overload"
# Not for security: whom the overload go-away picks only has to be spread over the connections.
_RANDOM = random.Random()
OVERLOAD_ON_LOG = (
    "gRPC listener %s sends connections away at its high watermark: high %d, low %d"
    " (overload_goaway)"
)
OVERLOAD_LOG = (
    "gRPC listener %s holds %d connections, at or above its high watermark %d: sent %d away"
    " (GOAWAY overloaded, retry after %d to %d s) to bring it to the low watermark %d; closing"
    " them in %g s"
)


@attrs.frozen
class Drain:
    """The graceful GOAWAY on every connection (module doc). Each connection's retry time is
    drawn from `retry_after_ms` (low, high, both included)."""

    reason: str
    retry_after_ms: tuple[int, int]


@attrs.frozen
class Drained:
    """The answer to `Drain`: the connections the GOAWAY was sent on."""

    name: str
    connections: int


@attrs.frozen
class GetState:
    pass


@attrs.frozen(eq=False)
class ListenerArgs:
    spec: ListenerSpec
    routes: tuple[Routes, ...]
    metrics: ListenerMetrics
    # Told the table of each (re)started listener, for the readiness check.
    publish: Callable[[str, Table[str, ListenerState]], None]
    # Told the address actually bound (port 0 picks a free one, as tests do).
    on_bound: Callable[[str, tuple[str, int]], None] | None = None
    on_connection_closed: Callable[[ConnectionInfo], None] | None = None
    # Health, reflection (already in `routes`) and the RPC metrics; None in bare tests.
    extras: ListenerExtras | None = None
    # listener_handshake_timeout_ms, in seconds.
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S


class ListenerActor(Process):
    def init(self, args: ListenerArgs) -> None:
        self.spec = args.spec
        self.extras = args.extras
        routes = args.routes if args.extras is None else args.extras.metrics.instrument(args.routes)
        try:
            self.server = ListenerServer(
                args.spec,
                routes,
                args.metrics,
                args.on_connection_closed,
                handshake_timeout_s=args.handshake_timeout_s,
            )
        except TlsFilesUnusable as exc:
            # The crash reason carries the class only; this line says which file.
            log.error("%s", exc)
            raise
        try:
            self.address = self.server.bind()
        except OSError as exc:
            log.error(
                "gRPC listener %s cannot listen on %s:%d: %s",
                self.spec.name,
                self.spec.ip,
                self.spec.port,
                errno.errorcode.get(exc.errno or 0, "error").lower(),
            )
            raise
        self.table: Table[str, ListenerState] = self.new_table(table_name(self.spec.name))
        self._publish(RUNNING)
        args.publish(self.spec.name, self.table)
        if args.on_bound is not None:
            args.on_bound(actor_name(self.spec.name), self.address)
        self.run_worker(self.server.serve(), _ACCEPT)
        log.info(
            "gRPC listener %s listening on %s", self.spec.name, describe(self.spec, self.address)
        )
        marks = self.spec.overload_goaway
        self.overload = OverloadGoAway(marks) if marks is not None else None
        if marks is not None:
            log.info(OVERLOAD_ON_LOG, self.spec.name, marks.high, marks.low)
            self._overload_tick()
        if self.spec.tls is None and self.spec.serves_agent and not _loopback(self.spec.ip):
            log.warning(
                "gRPC listener %s is plaintext on %s: do not expose it to an untrusted network"
                " (docs/listeners.md 'TLS posture')",
                self.spec.name,
                self.spec.ip,
            )

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        match msg:
            case Suspend():
                self.send(sender, self._suspend())
            case Resume():
                self.send(sender, self._resume())
            case Drain(reason=reason, retry_after_ms=retry_after_ms):
                self.send(sender, self._drain(reason, retry_after_ms))
            case GetState():
                self.send(sender, self.table[STATE_ROW])
            case WakeupMessage(payload=payload) if payload == _OVERLOAD:
                self._overload_tick()
            case WorkerDone(tag=tag, error=error) if tag == _ACCEPT and error is not None:
                # The accept loop met an error it cannot ride out: restart with a new socket.
                raise error
            case _:
                pass

    def _suspend(self) -> ListenerState:
        if self.server.accepting:
            self.server.suspend()
            log.info(
                "gRPC listener %s suspended: listen socket closed, %d connection(s) kept",
                self.spec.name,
                self.server.connections,
            )
        return self._publish(SUSPENDED)

    def _resume(self) -> ListenerState:
        if self.server.accepting:
            return self._publish(RUNNING)
        try:
            self.address = self.server.bind()
        except OSError as exc:
            reason = errno.errorcode.get(exc.errno or 0, "error").lower()
            # The caller retries and owns the rate of its log lines; this one is debug.
            log.debug("gRPC listener %s could not resume: %s", self.spec.name, reason)
            return attrs.evolve(self.table[STATE_ROW], error=reason)
        self.run_worker(self.server.serve(), _ACCEPT)
        log.info("gRPC listener %s resumed on %s:%d", self.spec.name, *self.address)
        return self._publish(RUNNING)

    def _drain(self, reason: str, retry_after_ms: tuple[int, int]) -> Drained:
        if self.extras is not None:
            self.extras.board.stop_serving()
        told = self.server.drain(reason, retry_after_ms)
        log.info(
            "gRPC listener %s draining (%s): GOAWAY sent on %d connection(s); new streams"
            " refused, open ones run to their end",
            self.spec.name,
            reason,
            told,
        )
        return Drained(self.spec.name, told)

    def _overload_tick(self) -> None:
        assert self.overload is not None
        if self.server.draining:
            return  # the planned stop's drain has told every connection; the timer ends here
        now = self.now()
        self._overload_effects(self.overload.tick(now, self.server.live_keys(), _RANDOM))
        self.wakeupAfter(self.overload.wakeup_in(now), _OVERLOAD)

    def _overload_effects(self, effects: list[Effect]) -> None:
        assert self.overload is not None
        for effect in effects:
            match effect:
                case SendAway(connections=keys, counted=counted):
                    told = sum(self.server.send_away(key, OVERLOADED_HINT_MS) for key in keys)
                    low_ms, high_ms = OVERLOADED_HINT_MS
                    log.warning(
                        OVERLOAD_LOG,
                        self.spec.name,
                        counted,
                        self.overload.marks.high,
                        told,
                        low_ms // 1000,
                        high_ms // 1000,
                        self.overload.marks.low,
                        GRACE_S,
                    )
                case Close(connections=keys):
                    for key in keys:
                        self.server.close_connection(key)

    def _publish(self, state: State) -> ListenerState:
        row = ListenerState(self.spec.name, state, self.address, self.spec.serves_agent)
        self.table.insert(STATE_ROW, row)
        return row

    def terminate(self, reason: ExitReason) -> None:
        self.server.close()

    def format_status(self) -> Mapping[str, Any]:
        return {
            "listener": self.spec.name,
            "state": RUNNING if self.server.accepting else SUSPENDED,
            "draining": self.server.draining,
            "sent_away_leaving": 0 if self.overload is None else self.overload.leaving,
            "port": self.address[1],
            "connections": self.server.connections,
            "max_connections": self.spec.limits.max_connections,
        }


def _loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip == "::1"


def describe(spec: ListenerSpec, address: tuple[str, int]) -> str:
    """One line of posture for the start log: never a path."""
    if spec.tls is None:
        tls = "plaintext"
    elif spec.tls.verify == "verify_none":
        tls = "one-way TLS"
    elif spec.tls.fail_if_no_peer_cert:
        tls = "mutual TLS"
    else:
        tls = "TLS, client certificate requested not required"
    origin = spec.origin.mode.value
    if spec.origin.mode.value != "transport":
        origin += f" ({len(spec.origin.sources)} source(s))"
    services = ", ".join(service for service, _ in spec.services) or "no services"
    return (
        f"{address[0]}:{address[1]} ({tls}, origin {origin}, max_connections"
        f" {spec.limits.max_connections}, max_concurrent_streams"
        f" {spec.http2.max_concurrent_streams}; {services})"
    )
