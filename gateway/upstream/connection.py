"""One connection slot of the upstream channel: dial, hold, notice the loss, redial.

A channel has `pool_size` slots per endpoint. Each slot runs one task for its whole life:

    CONNECTING --(TCP, TLS, the server's first SETTINGS)--> UP --(lost)--> BACKOFF
        ^    \\--(any step fails)--> BACKOFF                                   |
        \\-------------------------(redial delay, `redial.Redial`)-------------/

Rules of this file:

* A slot is UP only once the server's first HTTP/2 SETTINGS frame has arrived, so its stream
  limit is known before any call uses it, and a TLS 1.3 server that rejects the client
  certificate (its alert, or its close, comes instead of SETTINGS) is a failed dial.
  TCP, TLS and the SETTINGS wait are each bounded by the channel's connect_timeout.
* The slot never dials on behalf of a call: a call finds it UP or not at all (the grpclib
  channel of a slot refuses to dial, see `SlotChannel`).
* SETTINGS_MAX_CONCURRENT_STREAMS is read from each SETTINGS frame the server sends (h2's
  RemoteSettingsChanged event); `max_streams` None means "no limit declared". The slot never
  lets more calls in flight than that (`has_room`): grpclib would otherwise wait for a stream to
  close when h2 refuses to open one, hiding the limit from the permits.
* TCP_NODELAY is set as `upstream_tcp_nodelay` (or the endpoint's own `{nodelay, Bool}`) says,
  after grpclib's protocol has switched it on unconditionally.
* The SSL context is built for every dial, in a thread (it reads files). When it cannot be
  built, the files are examined (`tls_files`) so the channel can say which one is wrong.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
import ssl
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
from google.protobuf.message import Message
from grpclib.const import Cardinality

from actors.core.breaker import ResultKind
from actors.upstream.api import UpstreamCallError
from gateway.config.upstream_client import EndpointSpec
from gateway.upstream import tls_files
from gateway.upstream.failures import call_error, dial_error
from gateway.upstream.grpclib_glue import Codec, SettingsProtocol, SlotChannel
from gateway.upstream.ratelimit import Every
from gateway.upstream.redial import Redial
from gateway.upstream.tls_context import build_context, server_hostname

__all__ = ["BAD_TLS_OPTIONS", "ConnectionSlot", "DialFailure", "SlotEvents", "SlotState"]

CHANNEL_LOGGER = "yuzu_gw.upstream.channel"
# The Erlang gateway's word for an option set the TLS stack rejects before any handshake.
BAD_TLS_OPTIONS = "bad_tls_options"
# A repeated identical dial failure is logged at most this often per slot; the seed measured
# ~100 MB of log a day from one line per failed attempt.
DIAL_LOG_INTERVAL_S = 60.0
# asyncio needs a number for the TLS handshake timer: connect_timeout `infinity` becomes a day.
_NO_BOUND_S = 86_400.0


class SlotState(enum.Enum):
    CONNECTING = "connecting"
    UP = "up"
    BACKOFF = "backoff"
    CLOSED = "closed"


@attrs.frozen
class DialFailure:
    """Why a dial gave no live connection, and what the channel reports about it."""

    error: UpstreamCallError
    delay_s: float
    # The SSL options could not be used at all (bad_tls_options), before any handshake.
    tls_options: bool = False
    # `tls_files.describe` lines of the files at fault (empty: none of the files is).
    file_problems: tuple[str, ...] = ()
    # What the ssl module said about the options (no path in it), for the none-at-fault case.
    tls_detail: str = ""
    # A TLS handshake ran and failed (an alert, a certificate the client did not trust).
    handshake: bool = False


class SlotEvents(Protocol):
    """What a slot tells its channel."""

    def slot_changed(self, slot: ConnectionSlot) -> None: ...

    def dial_failed(self, slot: ConnectionSlot, failure: DialFailure) -> None: ...


class _DialFailedError(Exception):
    def __init__(self, error: UpstreamCallError, **report: Any) -> None:
        super().__init__(error.detail)
        self.error = error
        self.report = report


def _file_problems(endpoint: EndpointSpec) -> tuple[str, ...]:
    problems = []
    for name, path in endpoint.tls.files():
        role = tls_files.Role(name)
        reason = tls_files.content_problem(role, path)
        if reason is not None:
            problems.append(tls_files.describe(role, path, reason))
    return tuple(problems)


def _ssl_detail(error: BaseException) -> str:
    # ssl.SSLError carries OpenSSL's reason (KEY_VALUES_MISMATCH, ...), never a path; an
    # OSError's text would carry the path of the file, so only its POSIX name is kept.
    if isinstance(error, ssl.SSLError):
        return str(getattr(error, "reason", None) or type(error).__name__)
    return dial_error(error).detail


class ConnectionSlot:
    def __init__(
        self,
        *,
        channel_name: str,
        endpoint: EndpointSpec,
        index: int,
        connect_timeout_s: float | None,
        nodelay: bool,
        max_receive: int,
        redial: Redial,
        events: SlotEvents,
    ) -> None:
        self.channel_name = channel_name
        self.endpoint = endpoint
        self.index = index
        self.connect_timeout_s = connect_timeout_s
        self.nodelay = endpoint.socket.nodelay if endpoint.socket.nodelay is not None else nodelay
        self.redial = redial
        self.events = events
        self.codec = Codec(max_receive)
        self.state = SlotState.CONNECTING
        self.max_streams: int | None = None  # declared by the server; None: no limit declared
        self.in_flight = 0
        self.last_error: UpstreamCallError | None = None
        self._grpc: SlotChannel | None = None
        self._protocol: SettingsProtocol | None = None
        self._task: asyncio.Task[None] | None = None
        self._dial_log = Every(DIAL_LOG_INTERVAL_S)
        self._last_logged_reason = ""
        self.log = logging.getLogger(CHANNEL_LOGGER)

    # -- what calls read -------------------------------------------------------------------
    @property
    def live(self) -> bool:
        return self.state is SlotState.UP

    def has_room(self) -> bool:
        return self.max_streams is None or self.in_flight < self.max_streams

    @property
    def label(self) -> str:
        return self.endpoint.label

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._task = loop.create_task(
            self._run(loop), name=f"upstream {self.channel_name} {self.label} #{self.index}"
        )

    def close(self) -> None:
        """Stop for good: the task is cancelled and the connection, if any, closed."""
        self.state = SlotState.CLOSED
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._drop_connection()

    def _drop_connection(self) -> None:
        grpc, self._grpc = self._grpc, None
        self._protocol = None
        self.max_streams = None
        if grpc is not None:
            grpc.close()

    async def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            self._set(SlotState.CONNECTING)
            try:
                protocol = await self._dial(loop)
            except Exception as exc:
                # Anything unforeseen is a failed dial too: a slot must never stop redialling.
                failed = (
                    exc if isinstance(exc, _DialFailedError) else _DialFailedError(dial_error(exc))
                )
                delay = self.redial.failed()
                self.last_error = failed.error
                self._set(SlotState.BACKOFF)
                self._log_dial_failure(failed.error, delay)
                self.events.dial_failed(self, DialFailure(failed.error, delay, **failed.report))
                await asyncio.sleep(delay)
                continue
            self.redial.connected(loop.time())
            self._up(protocol)
            exc = await protocol.lost
            delay = self.redial.lost(loop.time())
            self.last_error = dial_error(exc)
            self._drop_connection()
            self._set(SlotState.BACKOFF)
            self.log.warning(
                "Upstream channel %s: connection to %s down (%s); redialling in %.1f s",
                self.channel_name,
                self.label,
                self.last_error.detail,
                delay,
            )
            await asyncio.sleep(delay)

    def _set(self, state: SlotState) -> None:
        if self.state is not SlotState.CLOSED:
            self.state = state
            self.events.slot_changed(self)

    def _up(self, protocol: SettingsProtocol) -> None:
        self.max_streams = protocol.max_streams
        self._dial_log.reset()
        self._last_logged_reason = ""
        self._set(SlotState.UP)
        limit = "no limit declared" if self.max_streams is None else self.max_streams
        self.log.info(
            "Upstream channel %s: connection to %s up (slot %d); the server allows %s"
            " concurrent streams",
            self.channel_name,
            self.label,
            self.index,
            limit,
        )

    def _limit_changed(self, protocol: SettingsProtocol | None) -> None:
        if protocol is None or self._protocol is not protocol:
            return  # a settings frame of a connection that is not (or no longer) this slot's
        self.max_streams = protocol.max_streams
        self.events.slot_changed(self)
        self.log.info(
            "Upstream channel %s: the server now allows %s concurrent streams on %s",
            self.channel_name,
            self.max_streams,
            self.label,
        )

    def _log_dial_failure(self, error: UpstreamCallError, delay: float) -> None:
        now = asyncio.get_running_loop().time()
        # A new reason is always worth a line; the same one again at most once a minute.
        if error.detail != self._last_logged_reason:
            self._dial_log.reset()
        level = logging.WARNING if self._dial_log.allow(now) else logging.DEBUG
        if level == logging.WARNING:
            self._last_logged_reason = error.detail
        self.log.log(
            level,
            "Upstream channel %s: cannot connect to %s (%s); retrying in %.1f s",
            self.channel_name,
            self.label,
            error.detail,
            delay,
        )

    # -- dialling --------------------------------------------------------------------------
    async def _dial(self, loop: asyncio.AbstractEventLoop) -> SettingsProtocol:
        sock = await self._tcp(loop)
        protocol: SettingsProtocol | None = None
        try:
            context = await self._context()
            protocol = SettingsProtocol(loop, lambda: self._limit_changed(protocol))
            await self._handshake(loop, sock, context, protocol)
        except BaseException:
            if protocol is not None and hasattr(protocol, "processor"):
                protocol.processor.close()  # the transport owns the socket now
            else:
                sock.close()
            raise
        self._protocol = protocol
        self._grpc = SlotChannel(self.endpoint, context, self.codec, protocol)
        return protocol

    async def _tcp(self, loop: asyncio.AbstractEventLoop) -> socket.socket:
        options = self.endpoint.socket
        family = socket.AF_INET6 if options.inet6 else socket.AF_INET
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                infos = await loop.getaddrinfo(
                    self.endpoint.host, self.endpoint.port, family=family, type=socket.SOCK_STREAM
                )
                error: BaseException | None = None
                for *_, address in infos:
                    sock = socket.socket(family, socket.SOCK_STREAM)
                    sock.setblocking(False)
                    try:
                        self._apply_socket_options(sock)
                        await loop.sock_connect(sock, address)
                    except BaseException as exc:
                        sock.close()
                        if not isinstance(exc, OSError):
                            raise
                        error = exc
                        continue
                    return sock
                try:
                    raise error or OSError("no address")
                finally:
                    # The error's traceback holds this frame: keeping it here too is a cycle
                    # that lives until a full collection (supervisors/gc_policy.py).
                    error = None
        except (OSError, TimeoutError) as exc:
            raise _DialFailedError(dial_error(exc)) from None

    def _apply_socket_options(self, sock: socket.socket) -> None:
        options = self.endpoint.socket
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(self.nodelay))
        if options.keepalive is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, int(options.keepalive))
        if options.recbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, options.recbuf)
        if options.sndbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, options.sndbuf)

    async def _context(self) -> ssl.SSLContext | None:
        if not self.endpoint.is_tls:
            return None
        try:
            return await asyncio.to_thread(build_context, self.endpoint.tls)
        except (OSError, ssl.SSLError, ValueError) as exc:
            problems = await asyncio.to_thread(_file_problems, self.endpoint)
            raise _DialFailedError(
                UpstreamCallError(ResultKind.TLS, detail=BAD_TLS_OPTIONS),
                tls_options=True,
                file_problems=problems,
                tls_detail=_ssl_detail(exc),
            ) from None

    async def _handshake(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        context: ssl.SSLContext | None,
        protocol: SettingsProtocol,
    ) -> None:
        timeout = self.connect_timeout_s
        tls: Mapping[str, Any] = {}
        if context is not None:
            tls = {
                "ssl": context,
                "server_hostname": server_hostname(self.endpoint.tls, self.endpoint.host),
                "ssl_handshake_timeout": timeout if timeout is not None else _NO_BOUND_S,
            }
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: protocol, sock=sock, **tls)
                # grpclib switched TCP_NODELAY on in connection_made; the setting decides.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(self.nodelay))
                settled = await protocol.settled
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise _DialFailedError(
                dial_error(exc), handshake=isinstance(exc, ssl.SSLError)
            ) from None
        if not settled:
            # Lost before the server's SETTINGS: a TLS 1.3 server rejecting our certificate
            # sends its alert here, after the client's side of the handshake completed.
            error = protocol.lost_error
            raise _DialFailedError(dial_error(error), handshake=isinstance(error, ssl.SSLError))

    # -- calls -----------------------------------------------------------------------------
    async def call(
        self,
        method: str,
        payload: bytes,
        response_type: type[Message],
        timeout: float,
        metadata: Mapping[str, str] | None,
    ) -> Message:
        """One unary call on this connection. The caller checked `live` and `has_room`."""
        grpc, protocol = self._grpc, self._protocol
        if grpc is None or protocol is None:
            raise UpstreamCallError(ResultKind.TRANSPORT, detail="closed")
        self.in_flight += 1
        try:
            async with grpc.request(
                method,
                Cardinality.UNARY_UNARY,
                bytes,
                response_type,
                timeout=timeout,
                metadata=metadata,
            ) as stream:
                # HEADERS and DATA in one write (gateway/listeners/coalesce.py).
                protocol.writes.cork()
                try:
                    await stream.send_message(payload, end=True)  # type: ignore[arg-type]
                finally:
                    protocol.writes.uncork()
                reply = await stream.recv_message()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise call_error(exc) from None
        finally:
            self.in_flight -= 1
        if reply is None:
            raise UpstreamCallError(ResultKind.EXCEPTION, detail="answer is not a response message")
        return reply

    def status(self) -> Mapping[str, Any]:
        return {
            "endpoint": self.label,
            "state": self.state.value,
            "max_streams": self.max_streams,
            "in_flight": self.in_flight,
            "last_error": self.last_error.detail if self.last_error else None,
        }
