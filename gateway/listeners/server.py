"""One listener's sockets: bind, accept, the PROXY header, TLS, and the connection ceiling.

grpclib's `Server` is used for what it assembles (the method table, the codecs, the event
dispatch, the HTTP/2 configuration) but not for its sockets: `Server.start` leaves accepting
to asyncio, which can neither stop accepting at `max_connections` nor read a PROXY header
before a TLS handshake. So:

- `bind()` opens the listen socket (SO_REUSEADDR, and SO_REUSEPORT when `YUZU_GW_REUSEPORT=1`,
  which the release supervisor sets on each node of a multi-node host so that they share the
  port, the kernel pinning each connection to one node; docs/multinode.md) with a backlog of
  4096 (seed: "the gateway asks for a listen backlog of 4096").
- `serve()` runs the accept loop: a readiness callback on the listen socket that accepts in
  the callback itself, as asyncio's own server does, up to `acceptors` x ACCEPTS_PER_ACCEPTOR
  connections a wake (at the manual's 32, the whole backlog), so the kernel's queue empties at
  each turn of the loop however long the turn is under the work already admitted (a cold wave
  of 10,000 agents overflowed a queue drained 32 at a time: their SYNs retransmitted past the
  clients' connect time-out, issue 19). At `max_connections` (connections being set up
  included) it stops accepting: new connections wait in the kernel's backlog while established
  ones are unaffected, as Ranch does; a freed slot resumes it.
- Each accepted socket is set up in its own short task: the PROXY header (about 1 s, then the
  connection is closed), the TLS handshake, then grpclib's HTTP/2 protocol, all of it, the
  client's HTTP/2 preface and first SETTINGS included, within `listener_handshake_timeout_ms`
  of the accept (10 s by default): a connection that sends nothing, or half a preface, would
  otherwise hold a slot of `max_connections` until the idle timeout. Each connection closed
  before HTTP/2 started is counted by reason (`yuzu_gw_listener_handshake_failed_total`).
- `suspend()` closes the listen socket: a new connection is refused at once and ones the
  kernel had queued are reset; established connections are untouched. `bind()` again resumes
  on the same port. `close()` also ends every connection.
- `drain()` sends the graceful GOAWAY (`ListenerProtocol.go_away`) on every established
  connection, and on each one established after it, for as long as the listener lives: open
  streams run to their end, new streams are refused. Each connection's debug data carries its
  own retry time, drawn from the range given, so a fleet told together comes back spread.
- `send_away()` is the overload go-away of one connection (the listener actor's policy,
  actors/core/overload_goaway.py): the graceful GOAWAY `overloaded`, then its Subscribes are
  told (`ConnectionInfo.sent_away`) and end UNAVAILABLE with the same retry time;
  `close_connection()` closes it when its grace has passed.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
import socket
import ssl
from collections.abc import Callable, Collection, KeysView

from grpclib.config import Configuration
from grpclib.const import Handler as MethodHandler
from grpclib.server import Server
from h2.errors import ErrorCodes

from gateway.config.listener_spec import ListenerSpec
from gateway.config.origin_sources import Mode
from gateway.listeners.connection import ConnectionInfo, next_key
from gateway.listeners.metrics import (
    BAD_PROXY_HEADER,
    GRACE_ENDED,
    LISTENER_STOPPED,
    OVERLOADED,
    PEER_CLOSED,
    PROXY_HEADER_TIMEOUT,
    TLS_FAILED,
    TLS_TIMEOUT,
    ListenerMetrics,
)
from gateway.listeners.origin import Claim, peer_address
from gateway.listeners.protocol import ConnectionPolicy, ListenerHandler, ListenerProtocol
from gateway.listeners.proxy_header import (
    V1_MAX,
    V1_PREFIX,
    V2_FIXED,
    ProxyHeader,
    ProxyHeaderError,
    parse_v1,
    parse_v2,
    v2_length,
    version_of,
)
from gateway.listeners.tls import server_context

log = logging.getLogger("yuzu_gw.listeners")

BACKLOG = 4096
# Set to 1 by the release supervisor on every node of a multi-node host (rel/yuzu_gw start
# --nodes N): the nodes share the listener ports. Unset, a second node on the port fails to
# bind rather than silently taking part of the connections.
REUSEPORT_VAR = "YUZU_GW_REUSEPORT"
PROXY_HEADER_TIMEOUT_S = 1.0
# listener_handshake_timeout_ms's default (gateway/config/keys/listeners.py), for bare tests.
HANDSHAKE_TIMEOUT_S = 10.0
# Out of descriptors (or kernel memory): the socket stays readable, so accepting again at
# once would spin. Ranch sleeps too.
_ACCEPT_RETRY_S = 0.1
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# A connection that died between the kernel's accept and ours: nothing to do but go on.
_TRANSIENT = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR})
_EXHAUSTED_LOG_INTERVAL_S = 60.0
# How many connections each of the listener's `acceptors` takes in one wake of the accept loop:
# at the manual's 32 acceptors, the backlog (4096), so that one wake can empty the kernel's
# queue, as asyncio's server (up to its backlog) and libuv's (until the queue is empty) do.
ACCEPTS_PER_ACCEPTOR = 128
# Not for security: the retry times only have to differ between connections.
_RANDOM = random.Random()


class Routes:
    """The routes of one service on a listener, in grpclib's servable shape."""

    def __init__(self, mapping: dict[str, MethodHandler]) -> None:
        self._mapping = mapping

    def __mapping__(self) -> dict[str, MethodHandler]:
        return self._mapping


class _Core(Server):
    """grpclib's Server minus its sockets: one protocol per connection we accepted."""

    def protocol(
        self,
        policy: ConnectionPolicy,
        info: ConnectionInfo,
        claim: Claim | None,
        *,
        handshake_deadline: float,
        on_made: Callable[[ListenerProtocol], None],
        on_lost: Callable[[ListenerProtocol], None],
    ) -> ListenerProtocol:
        # Not added to grpclib's own set of handlers, which only its `close()` (never called:
        # the listener ends its connections itself, `_live`) reads, and which it sweeps every 10
        # connections: a walk of every connection, O(n^2) over a 10,000-agent wave.
        handler = ListenerHandler(
            self._mapping, self._codec, self._status_details_codec, self.__dispatch__
        )
        return ListenerProtocol(
            handler,
            self._config,
            self._h2_config,
            policy=policy,
            info=info,
            claim=claim,
            handshake_deadline=handshake_deadline,
            on_made=on_made,
            on_lost=on_lost,
        )


class ListenerServer:
    def __init__(
        self,
        spec: ListenerSpec,
        routes: Collection[Routes],
        metrics: ListenerMetrics,
        on_connection_closed: Callable[[ConnectionInfo], None] | None = None,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
    ) -> None:
        self.spec = spec
        self.policy = ConnectionPolicy.of(spec, metrics, handshake_timeout_s)
        # Reads the certificate files: a listener that cannot load them does not start.
        self._ssl: ssl.SSLContext | None = (
            server_context(spec.tls, spec.name) if spec.tls is not None else None
        )
        self._core = _Core(
            list(routes),
            config=Configuration(
                http2_connection_window_size=self.policy.window,
                http2_stream_window_size=self.policy.window,
            ),
        )
        self._on_connection_closed = on_connection_closed
        self._port = spec.port
        self._sock: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        # The accept loop's state while `serve` runs: its loop, the socket whose readiness it
        # watches (None while paused: at the ceiling, or waiting out EMFILE), the retry timer,
        # and the future `serve` awaits (an unexpected accept error ends it).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watched: socket.socket | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._serving: asyncio.Future[None] | None = None
        self._per_wake = spec.acceptors * ACCEPTS_PER_ACCEPTOR
        self._count = 0
        self._setups: set[asyncio.Task[None]] = set()
        # Established connections by key (ConnectionInfo.key).
        self._live: dict[int, ListenerProtocol] = {}
        # (reason, retry range in ms) once `drain` was called.
        self._draining: tuple[str, tuple[int, int]] | None = None
        self._exhausted_logged_at = -_EXHAUSTED_LOG_INTERVAL_S
        self.address: tuple[str, int] | None = None

    # -- state ----------------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        return self._sock is not None

    @property
    def connections(self) -> int:
        """Connections holding a slot: being set up or established."""
        return self._count

    def live(self) -> list[ListenerProtocol]:
        return list(self._live.values())

    def live_keys(self) -> KeysView[int]:
        """The established connections' keys, set-like (the overload policy reads it)."""
        return self._live.keys()

    @property
    def draining(self) -> bool:
        return self._draining is not None

    # -- the graceful GOAWAY --------------------------------------------------------------

    def drain(self, reason: str, retry_after_ms: tuple[int, int]) -> int:
        """The graceful GOAWAY on every established connection and on each one established
        from now on (module doc); returns how many connections it was sent on now."""
        self._draining = (reason, retry_after_ms)
        return sum(self._go_away(protocol) for protocol in list(self._live.values()))

    def _go_away(self, protocol: ListenerProtocol) -> bool:
        assert self._draining is not None
        reason, (low, high) = self._draining
        return protocol.go_away(reason, _RANDOM.randint(low, high))

    def send_away(self, key: int, retry_after_ms: tuple[int, int]) -> bool:
        """The overload go-away of connection `key` (module doc), its retry time drawn from
        `retry_after_ms`; False when it is gone or was told to go already."""
        protocol = self._live.get(key)
        if protocol is None:
            return False
        retry_ms = _RANDOM.randint(*retry_after_ms)
        if not protocol.go_away(OVERLOADED, retry_ms):
            return False
        protocol.info.sent_away(retry_ms)
        return True

    def close_connection(self, key: int) -> None:
        """GOAWAY, then close: the grace of an overload go-away has passed."""
        protocol = self._live.get(key)
        if protocol is not None:
            protocol.kill(ErrorCodes.NO_ERROR, GRACE_ENDED)

    # -- the listen socket ----------------------------------------------------------------

    def bind(self) -> tuple[str, int]:
        """Open the listen socket (the configured port, or on resume the port first bound).
        Raises OSError (EADDRINUSE, EMFILE, ...)."""
        ip = self.spec.ip
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if os.environ.get(REUSEPORT_VAR) == "1" and hasattr(socket, "SO_REUSEPORT"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((ip, self._port))
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        host, port = sock.getsockname()[:2]
        self._port = port
        self.address = (host, port)
        return self.address

    def suspend(self) -> None:
        """Close the listen socket; established connections are left alone."""
        task, self._accept_task = self._accept_task, None
        sock, self._sock = self._sock, None
        # Unwatched before the descriptor is closed, so the number cannot be reused by a new
        # socket while the loop still watches it.
        self._stop_accepting()
        if task is not None:
            task.cancel()
        if sock is not None:
            sock.close()

    def close(self) -> None:
        """Stop accepting and end every connection (GOAWAY, then close)."""
        self.suspend()
        for task in list(self._setups):
            task.cancel()
        for protocol in list(self._live.values()):
            protocol.kill(ErrorCodes.NO_ERROR, LISTENER_STOPPED)

    # -- accepting -----------------------------------------------------------------------

    async def serve(self) -> None:
        """The accept loop; runs until cancelled (`suspend`, `close`, or its owner ending), or
        raises the accept error that is neither transient nor exhaustion."""
        assert self._sock is not None, "bind() first"
        self._accept_task = asyncio.current_task()
        self._loop = loop = asyncio.get_running_loop()
        self._serving = serving = loop.create_future()
        self._resume()
        try:
            await serving
        finally:
            # A resume may have started the next loop already (suspend, then bind and serve).
            if self._serving is serving:
                self._stop_accepting()

    def _stop_accepting(self) -> None:
        self._pause()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._serving = None

    def _pause(self) -> None:
        sock, self._watched = self._watched, None
        if sock is not None and self._loop is not None:
            self._loop.remove_reader(sock)

    def _resume(self) -> None:
        """Watch the listen socket again, unless paused for a reason that still holds."""
        sock, loop = self._sock, self._loop
        if sock is None or loop is None or self._serving is None or self._retry is not None:
            return
        if self._watched is None and self._count < self.spec.limits.max_connections:
            self._watched = sock
            loop.add_reader(sock, self._accept)

    def _accept(self) -> None:
        """One wake: the connections the kernel has completed, up to the wake's share."""
        sock, loop = self._sock, self._loop
        assert sock is not None and loop is not None
        limit = self.spec.limits.max_connections
        for _ in range(self._per_wake):
            if self._count >= limit:
                self._pause()  # until a slot frees (_free_slot)
                return
            try:
                conn, addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _TRANSIENT:
                    continue
                self._accept_failed(exc)
                return
            conn.setblocking(False)
            self._admit(loop, conn, addr)

    def _accept_failed(self, exc: OSError) -> None:
        loop, serving = self._loop, self._serving
        assert loop is not None
        if exc.errno not in _EXHAUSTED:
            if serving is not None and not serving.done():
                serving.set_exception(exc)
            self._pause()
            return
        now = loop.time()
        if now - self._exhausted_logged_at >= _EXHAUSTED_LOG_INTERVAL_S:
            self._exhausted_logged_at = now
            log.warning(
                "gRPC listener %s cannot accept a connection (%s); retrying every %g s"
                " (raise the open-file limit or lower limits.max_connections)",
                self.spec.name,
                errno.errorcode.get(exc.errno or 0, "error").lower(),
                _ACCEPT_RETRY_S,
            )
        self._pause()
        self._retry = loop.call_later(_ACCEPT_RETRY_S, self._retried)

    def _retried(self) -> None:
        self._retry = None
        self._resume()

    def _admit(
        self, loop: asyncio.AbstractEventLoop, conn: socket.socket, addr: tuple[str, int]
    ) -> None:
        self._count += 1
        task = loop.create_task(self._setup(loop, conn, addr))
        self._setups.add(task)
        task.add_done_callback(self._setups.discard)

    async def _setup(
        self, loop: asyncio.AbstractEventLoop, conn: socket.socket, addr: tuple[str, int]
    ) -> None:
        protocol: ListenerProtocol | None = None
        refusals = self.policy.refusals
        # One deadline for everything before HTTP/2 runs; the protocol holds the client's
        # preface and first SETTINGS to what is left of it.
        deadline = loop.time() + self.policy.handshake_timeout_s
        stage = PROXY_HEADER_TIMEOUT
        try:
            claim: Claim | None = None
            if self.policy.mode is Mode.PROXY_PROTOCOL:
                # Seed: "Every connection on the listener must carry the header or it is
                # closed (after a second)".
                async with asyncio.timeout(min(PROXY_HEADER_TIMEOUT_S, deadline - loop.time())):
                    header = await read_proxy_header(loop, conn)
                claim = header.claim()
            stage = TLS_TIMEOUT
            info = ConnectionInfo(next_key(), self.spec.name, peer_address(addr[0]), addr[1])
            protocol = self._core.protocol(
                self.policy,
                info,
                claim,
                handshake_deadline=deadline,
                on_made=self._made,
                on_lost=self._lost,
            )
            made = protocol
            if self._ssl is None:
                # Nothing here waits for the peer (the protocol holds the preface to the
                # deadline): no time-out, which could only cancel it in the turn that made the
                # protocol, under a loop slowed by a storm.
                await loop.connect_accepted_socket(lambda: made, conn)
                return
            # asyncio's own handshake timer is left at its default (60 s), above ours, so the
            # time-out is always this one and counted as such.
            async with asyncio.timeout_at(deadline):
                await loop.connect_accepted_socket(lambda: made, conn, ssl=self._ssl)
        except asyncio.CancelledError:
            self._abandon(conn, protocol)
            raise
        except Exception as exc:
            # A scanner, a health check without the header, a failed handshake (OSError,
            # SSLError, ProxyHeaderError, TimeoutError, EOFError): routine on an
            # unauthenticated port, so counted by reason and not worth more than a debug line.
            # Whatever it was, the slot must come back, or the ceiling would shrink for good.
            if protocol is None or not protocol.made:
                refusals.handshake(_failed_reason(exc, stage))
            self._abandon(conn, protocol)

    def _abandon(self, conn: socket.socket, protocol: ListenerProtocol | None) -> None:
        if protocol is not None and protocol.made:
            protocol.abandon()  # the protocol owns the slot now: it frees it, once
            return
        conn.close()
        self._free_slot()

    def _made(self, protocol: ListenerProtocol) -> None:
        self._live[protocol.info.key] = protocol
        if self._draining is not None:
            self._go_away(protocol)

    def _lost(self, protocol: ListenerProtocol) -> None:
        self._live.pop(protocol.info.key, None)
        self._free_slot()
        if self._on_connection_closed is not None:
            try:
                self._on_connection_closed(protocol.info)
            except Exception as exc:
                log.error(
                    "gRPC listener %s: the connection-closed hook raised %s",
                    self.spec.name,
                    type(exc).__name__,
                )

    def _free_slot(self) -> None:
        self._count -= 1
        self._resume()


def _failed_reason(exc: Exception, stage: str) -> str:
    """The handshake counter's reason for a setup that failed with `exc` at `stage`."""
    if isinstance(exc, TimeoutError):
        return stage
    if isinstance(exc, EOFError | ConnectionError):
        return PEER_CLOSED
    return BAD_PROXY_HEADER if stage == PROXY_HEADER_TIMEOUT else TLS_FAILED


# -- the PROXY header on a raw socket ---------------------------------------------------------


async def read_proxy_header(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> ProxyHeader:
    """Read exactly one PROXY header from `sock`, never a byte past it (what follows is TLS
    or HTTP/2, which must reach their own parsers untouched)."""
    first = await _recv_exact(loop, sock, 1)
    if version_of(first) == 2:
        fixed = first + await _recv_exact(loop, sock, V2_FIXED - 1)
        rest = await _recv_exact(loop, sock, v2_length(fixed) - V2_FIXED)
        header, _ = parse_v2(fixed + rest)
        return header
    data = first
    while True:
        peeked = await _peek(loop, sock, V1_MAX - len(data))
        end = peeked.find(b"\n")
        # Up to the LF when it is there; otherwise all of it, which is still header.
        data += sock.recv(end + 1 if end >= 0 else len(peeked))
        if not V1_PREFIX.startswith(data[: len(V1_PREFIX)]):
            raise ProxyHeaderError("not a PROXY v1 header")
        if end >= 0:
            header, used = parse_v1(data)
            if used != len(data):
                raise ProxyHeaderError("malformed PROXY v1 header")
            return header
        if len(data) >= V1_MAX:
            raise ProxyHeaderError("PROXY v1 header without CRLF in its first 107 bytes")


async def _recv_exact(loop: asyncio.AbstractEventLoop, sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = await loop.sock_recv(sock, size - len(data))
        if not chunk:
            raise EOFError("connection closed inside the PROXY header")
        data += chunk
    return data


async def _peek(loop: asyncio.AbstractEventLoop, sock: socket.socket, size: int) -> bytes:
    while True:
        try:
            data = sock.recv(size, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            await _readable(loop, sock)
            continue
        if not data:
            raise EOFError("connection closed inside the PROXY header")
        return data


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    fd = sock.fileno()
    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
