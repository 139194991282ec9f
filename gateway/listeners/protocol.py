"""One HTTP/2 connection of a listener: grpclib's protocol with the listener's limits.

What this adds to grpclib's `H2Protocol` and `Handler`, each where grpclib leaves room:

- SETTINGS: the first SETTINGS frame carries the listener's `max_concurrent_streams`
  (grpclib sends h2's default of 100 and has no option for it), and the flow-control
  windows are capped at `max_connection_memory_bytes`.
- Idle timeout: a connection that has received no byte for `http2.idle_timeout` gets a
  GOAWAY and is closed. Activity is any byte received from the peer, a PING included (as in
  Cowboy, whose rule the manual documents); bytes the gateway sends do not count.
- Memory bound: request bytes a connection holds (received, not yet read by a handler,
  including a partly received message) are summed over its streams; past
  `max_connection_memory_bytes` the connection gets GOAWAY ENHANCE_YOUR_CALM and is closed,
  `yuzu_gw_grpc_connection_killed_total` +1. grpclib itself never bounds a message's size.
- Request timeout: a handler waiting for the rest of a message it has started to receive
  (or, on a method whose request is one message, for that message at all) waits at most
  `request_timeout_ms`; then the stream is reset (CANCEL), the handler task cancelled and
  `yuzu_gw_grpc_recv_timeout_total` +1. An idle streaming request (a Subscribe between
  messages) is not stalled: only the connection's idle timeout applies to it.
- Header bytes: read as latin-1, so a header value that is not ASCII (out of gRPC's spec) gets
  its method's answer instead of dropping the connection.
- Cancel rate: more client RST_STREAMs than `max_cancel_stream_rate` allows closes the
  connection with ENHANCE_YOUR_CALM (Cowboy's defence against "rapid reset").
- Per call: the origin of each RPC stream is decided (`origin.attribute`), counted when a
  claim is not used, and set with the connection in the `CURRENT_CALL` context variable of
  the stream's task (`connection.current_call()`).
- Graceful GOAWAY (`go_away`: the planned stop's drain, the overload go-away): a GOAWAY frame
  with NO_ERROR, the highest stream id taken as its last stream id and debug data naming the
  reason and a retry time (`goaway_debug`). It is written to the transport as frame bytes,
  because h2's `close_connection` would forbid every later frame, and the streams open now must
  still send their messages and trailers. h2 goes on accepting streams the client opens after
  it, so each is reset REFUSED_STREAM before grpclib sees it (the client may retry it elsewhere).
- Every GOAWAY sent, graceful or before a close (`kill`), is counted with its reason in
  `yuzu_gw_listener_goaway_sent_total{listener,reason}` (metrics.py names the reasons).
- Handshake time-out: a connection whose client has not sent the HTTP/2 preface and its first
  SETTINGS by the handshake deadline (`listener_handshake_timeout_ms` after the accept, the
  PROXY header and TLS handshake included) is closed and counted `preface_timeout`; first bytes
  that are not the preface are counted `bad_preface` (`Refusals.handshake`).
- Each RPC stream is served by `request.Served.serve_stream` (hostile input answered by name),
  and its buffer (`buffer.GuardedBuffer`) names a stream that ends inside a message where
  grpclib's raised AssertionError.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import logging
import socket
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, cast

import attrs
from grpclib.config import Configuration
from grpclib.protocol import Connection, EventsProcessor, H2Protocol, Stream
from grpclib.server import Handler
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    DataReceived,
    RemoteSettingsChanged,
    RequestReceived,
    SettingsAcknowledged,
    StreamReset,
)
from h2.exceptions import ProtocolError, StreamClosedError
from h2.settings import SettingCodes, Settings
from hyperframe.frame import GoAwayFrame
from prometheus_client import Counter

from gateway.config.listener_spec import ListenerSpec
from gateway.config.origin_sources import Mode, Sources
from gateway.listeners.buffer import GuardedBuffer
from gateway.listeners.coalesce import CoalescingTransport
from gateway.listeners.connection import CURRENT_CALL, CallInfo, ConnectionInfo
from gateway.listeners.h2_closed_streams import bound_closed_streams
from gateway.listeners.h2_settings import compact
from gateway.listeners.metrics import (
    BAD_PREFACE,
    CANCEL_RATE,
    DRAINING,
    IDLE_TIMEOUT,
    MEMORY_BOUND,
    OVERLOADED,
    PREFACE_TIMEOUT,
    STREAM_ENDED,
    ListenerMetrics,
)
from gateway.listeners.origin import XFF_HEADER, Claim, Ignored, attribute, forwarded_claim
from gateway.listeners.refusals import Refusals
from gateway.listeners.request import Served

log = logging.getLogger("yuzu_gw.listeners")

# grpclib's windows; smaller only when the memory bound is (a flow-controlled peer then
# cannot even send past the bound before reading our WINDOW_UPDATEs).
_WINDOW = 4 * 1024 * 1024
_H2_MIN_WINDOW = 65_535
# h2's default: header blocks beyond this are refused by HPACK before any handler runs.
_MAX_HEADER_LIST_SIZE = 65_536
# Header bytes are read as latin-1, which decodes every byte. grpclib asks h2 for ascii, and
# one byte above 0x7F then raises inside h2, which drops the connection with every session on
# it. gRPC metadata is ASCII, so a value that is not (a session id that is not text, say)
# reaches its handler as text that no valid value equals, and gets the method's own answer.
_HEADER_ENCODING = "latin-1"
__all__ = [
    "DRAINING",
    "OVERLOADED",
    "ConnectionPolicy",
    "GuardedBuffer",
    "ListenerHandler",
    "ListenerProtocol",
    "goaway_debug",
]


def goaway_debug(reason: str, retry_after_ms: int) -> bytes:
    """The debug data of a graceful GOAWAY, as seed 001's go-away carries them: the reason and
    when to come back, as ASCII `reason=<reason> retry_after_ms=<ms>` (HTTP/2 clients log
    debug data as text)."""
    return f"reason={reason} retry_after_ms={retry_after_ms}".encode("ascii")


@attrs.frozen
class ConnectionPolicy:
    """What every connection of one listener enforces, resolved once from its spec."""

    listener: str
    max_concurrent_streams: int
    idle_timeout_s: float | None
    memory_limit: int
    request_timeout_s: float
    cancel_limit: int
    cancel_period_s: float
    mode: Mode
    sources: Sources
    trusted_hops: int
    metrics: ListenerMetrics
    goaways: Mapping[str, Counter]
    refusals: Refusals
    handshake_timeout_s: float

    @classmethod
    def of(
        cls, spec: ListenerSpec, metrics: ListenerMetrics, handshake_timeout_s: float
    ) -> ConnectionPolicy:
        idle = spec.http2.idle_timeout_ms
        count, period_ms = spec.http2.max_cancel_stream_rate
        return cls(
            listener=spec.name,
            max_concurrent_streams=spec.http2.max_concurrent_streams,
            idle_timeout_s=None if idle is None else idle / 1000,
            memory_limit=spec.limits.max_connection_memory_bytes,
            request_timeout_s=spec.limits.request_timeout_ms / 1000,
            cancel_limit=count,
            cancel_period_s=period_ms / 1000,
            mode=spec.origin.mode,
            sources=spec.origin.sources,
            trusted_hops=spec.origin.trusted_hops,
            metrics=metrics,
            goaways=metrics.goaways(spec.name),
            refusals=Refusals(
                spec.name,
                metrics.refusals(spec.name),
                metrics.handshakes(spec.name),
                time.monotonic,
            ),
            handshake_timeout_s=handshake_timeout_s,
        )

    @property
    def window(self) -> int:
        return max(_H2_MIN_WINDOW, min(_WINDOW, self.memory_limit))


class ListenerProtocol(H2Protocol):
    """grpclib's protocol for one connection, with the listener's limits (module doc)."""

    def __init__(
        self,
        handler: ListenerHandler,
        config: Configuration,
        h2_config: H2Configuration,
        *,
        policy: ConnectionPolicy,
        info: ConnectionInfo,
        claim: Claim | None,
        handshake_deadline: float,
        on_made: Callable[[ListenerProtocol], None],
        on_lost: Callable[[ListenerProtocol], None],
    ) -> None:
        h2_config = copy.copy(h2_config)
        h2_config.header_encoding = _HEADER_ENCODING
        super().__init__(handler, config, h2_config)
        handler.owner = self
        self.policy = policy
        self.info = info
        self.made = False
        self._lost = False
        self._on_made = on_made
        self._on_lost = on_lost
        self.loop = asyncio.get_event_loop()
        self._h2: H2Connection | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._held = 0
        self._over_budget = False
        self._killed = False
        self._last_rx = 0.0
        self._idle: asyncio.TimerHandle | None = None
        # Loop time by which the client's preface and first SETTINGS must have arrived.
        self._handshake_deadline = handshake_deadline
        self._preface: asyncio.TimerHandle | None = None
        self.settled = False
        self._cancels = 0
        self._cancel_window = 0.0
        # The last stream id of the graceful GOAWAY sent, once sent: streams above it are refused.
        self._drained: int | None = None
        # The origin is decided once per connection where it cannot change per stream.
        self._trusted = policy.mode is not Mode.TRANSPORT and policy.sources.trusts(info.peer)
        if policy.mode is Mode.PROXY_PROTOCOL:
            decided = attribute(info.peer, self._trusted, claim)
            self._call = CallInfo(info, decided.address)
            self._ignored: Ignored | None = decided.ignored
        else:
            self._call = CallInfo(info, info.peer)
            self._ignored = None

    # -- the connection --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Small gRPC frames must not wait for Nagle (grpclib does the same).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        h2 = H2Connection(config=self.h2_config)
        bound_closed_streams(h2)
        window = self.policy.window
        # Replaced before the first SETTINGS frame is written, so the peer learns the stream
        # limit at once and h2 enforces it from the first stream.
        h2.local_settings = Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: self.policy.max_concurrent_streams,
                SettingCodes.MAX_HEADER_LIST_SIZE: _MAX_HEADER_LIST_SIZE,
                SettingCodes.INITIAL_WINDOW_SIZE: window,
            },
        )
        h2.initiate_connection()
        if window > _H2_MIN_WINDOW:
            h2.increment_flow_control_window(window - _H2_MIN_WINDOW)
        _compact_settings(h2)
        self._h2 = h2
        # Corked for good: a turn's writes leave together at the next turn (coalesce.py).
        # uvloop's transports do not subclass asyncio.Transport, hence the cast.
        writes = CoalescingTransport(cast(asyncio.Transport, transport), self.loop)
        writes.cork()
        self._transport = writes
        self.connection = Connection(h2, writes, config=self.config)  # type: ignore[arg-type]
        self.connection.flush()
        self.connection.initialize()
        self.processor = EventsProcessor(self.handler, self.connection)
        self.info.attach(transport)
        self.made = True
        self._last_rx = self.loop.time()
        if self.policy.idle_timeout_s is not None:
            self._idle = self.loop.call_later(self.policy.idle_timeout_s, self._idle_check)
        self._preface = self.loop.call_at(self._handshake_deadline, self._preface_missing)
        self._on_made(self)

    def data_received(self, data: bytes) -> None:
        self._last_rx = self.loop.time()
        try:
            events = self.connection.feed(data)
        except ProtocolError:
            # Includes a peer opening more streams than max_concurrent_streams (h2 treats it
            # as a connection error) and a peer overrunning its flow-control window.
            log.debug("gRPC listener %s: HTTP/2 protocol error", self.policy.listener)
            if not self.settled:
                self._settle()
                self.policy.refusals.handshake(BAD_PREFACE)
            self.processor.close("Protocol error")
            return
        self.connection.flush()
        streams = self.processor.streams
        drained = self._drained
        for event in events:
            kind = type(event)
            if drained is not None and getattr(event, "stream_id", 0) > drained:
                self._refuse(event)
                continue
            if kind is RemoteSettingsChanged or kind is SettingsAcknowledged:
                _compact_settings(self._h2)
                if kind is RemoteSettingsChanged and not self.settled:
                    self._settle()  # the preface and the client's first SETTINGS are in
            if kind is DataReceived and event.stream_id not in streams:
                # A stream whose handler is done: grpclib acknowledges and drops it.
                self.policy.metrics.dropped(STREAM_ENDED, len(event.data or b""))
            elif kind is StreamReset and event.remote_reset and self._cancelled_too_often():
                log.warning(
                    "gRPC listener %s: connection %d cancelled more than %d streams in %g s;"
                    " closing it",
                    self.policy.listener,
                    self.info.key,
                    self.policy.cancel_limit,
                    self.policy.cancel_period_s,
                )
                self.kill(ErrorCodes.ENHANCE_YOUR_CALM, CANCEL_RATE)
                return
            self.processor.process(event)
        self.connection.flush()
        if self._over_budget and not self._killed:
            self.policy.metrics.connection_killed.inc()
            log.info(
                "gRPC listener %s: connection %d buffered more than %d request bytes; killed",
                self.policy.listener,
                self.info.key,
                self.policy.memory_limit,
            )
            self.kill(ErrorCodes.ENHANCE_YOUR_CALM, MEMORY_BOUND)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.made or self._lost:
            # Never established: the setup task still owns the socket and the slot. Or gone
            # already (`abandon`).
            return
        self._lost = True
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._settle()
        super().connection_lost(exc)
        self.info.closed()
        self._on_lost(self)

    def abandon(self) -> None:
        """The setup failed after this protocol was made (cancelled in the turn that made it):
        close and let go of the connection once. uvloop closes the handle of a cancelled
        `connect_accepted_socket` without calling `connection_lost`, which would keep the
        connection's slot of `max_connections` and its table entry for good."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()  # what the connection wrote (its SETTINGS) is not sent
        self.connection_lost(None)

    def kill(self, code: ErrorCodes, reason: str) -> None:
        """GOAWAY with `code` (counted as `reason`), then close. Established streams end with
        the connection."""
        if self._killed or self._transport is None:
            return
        self._killed = True
        if self._h2 is not None and not self._transport.is_closing():
            try:
                # After a graceful GOAWAY the last stream id must not grow (RFC 9113 6.8), and
                # h2 counts the streams it refused since.
                self._h2.close_connection(error_code=code, last_stream_id=self._drained)
                self.connection.flush()
                self.policy.goaways[reason].inc()
            except Exception:  # the connection may already be broken; closing is what counts
                log.debug("gRPC listener %s: GOAWAY not sent", self.policy.listener)
        self._transport.close()

    def go_away(self, reason: str, retry_after_ms: int) -> bool:
        """The graceful GOAWAY (module doc): the streams open now run to their end, new ones
        are refused. False when the connection is closing or has had its GOAWAY already."""
        transport, h2 = self._transport, self._h2
        if self._killed or self._drained is not None or h2 is None or transport is None:
            return False
        if transport.is_closing():
            return False
        self.connection.flush()  # what h2 holds goes out before the GOAWAY
        last = h2.highest_inbound_stream_id
        frame = GoAwayFrame(
            0,
            last_stream_id=last,
            error_code=ErrorCodes.NO_ERROR,
            additional_data=goaway_debug(reason, retry_after_ms),
        )
        # A stream transport (uvloop's do not subclass asyncio's, hence the cast).
        cast("asyncio.WriteTransport", transport).write(frame.serialize())
        self._drained = last
        self.info.goaway_retry_ms = retry_after_ms
        self.policy.goaways[reason].inc()
        return True

    def _refuse(self, event: Any) -> None:
        """An event of a stream opened after the graceful GOAWAY: the stream is reset
        REFUSED_STREAM and its data acknowledged, so the connection's window does not shrink."""
        kind = type(event)
        if kind is RequestReceived:
            assert self._h2 is not None  # a GOAWAY was sent, so the connection was made
            # The client may have reset it already, later in the same read.
            with contextlib.suppress(StreamClosedError):
                self._h2.reset_stream(event.stream_id, ErrorCodes.REFUSED_STREAM)
        elif kind is DataReceived:
            self.connection.ack(event.stream_id, event.flow_controlled_length)

    def _settle(self) -> None:
        self.settled = True
        if self._preface is not None:
            self._preface.cancel()
            self._preface = None

    def _preface_missing(self) -> None:
        """The handshake deadline passed without the client's preface and SETTINGS: the
        connection holds a slot of max_connections for nothing (a slow-connection hold)."""
        self._preface = None
        if self.settled or self._transport is None:
            return
        self.settled = True
        self.policy.refusals.handshake(PREFACE_TIMEOUT)
        self._killed = True
        self._transport.close()

    def _idle_check(self) -> None:
        assert self.policy.idle_timeout_s is not None
        quiet = self.loop.time() - self._last_rx
        if quiet >= self.policy.idle_timeout_s:
            self._idle = None
            self.kill(ErrorCodes.NO_ERROR, IDLE_TIMEOUT)
            return
        # Re-armed only when it fires: a busy connection costs one timer per idle period,
        # not one per received packet.
        self._idle = self.loop.call_later(self.policy.idle_timeout_s - quiet, self._idle_check)

    def _cancelled_too_often(self) -> bool:
        now = self.loop.time()
        if now - self._cancel_window > self.policy.cancel_period_s:
            self._cancel_window, self._cancels = now, 0
        self._cancels += 1
        return self._cancels > self.policy.cancel_limit

    # -- memory accounting (called by the streams' buffers) ---------------------------------

    def charge(self, size: int) -> None:
        self._held += size
        if self._held > self.policy.memory_limit:
            # Acted on after the current batch of events: killing inside h2's event loop
            # would leave grpclib half way through a frame.
            self._over_budget = True

    def release(self, size: int) -> None:
        self._held -= size

    @property
    def held(self) -> int:
        return self._held

    # -- origin -------------------------------------------------------------------------------

    def call_for(self, forwarded: list[str] | None) -> CallInfo:
        """The CallInfo of a new RPC stream, counting a claim that is not used."""
        policy = self.policy
        if policy.mode is Mode.FORWARDED_FOR:
            if not self._trusted:
                if forwarded:
                    policy.metrics.ignored(policy.mode, Ignored.UNTRUSTED_SOURCE)
                return self._call
            claim = forwarded_claim(forwarded, policy.trusted_hops) if forwarded else None
            decided = attribute(self.info.peer, True, claim)
            if decided.ignored is not None:
                policy.metrics.ignored(policy.mode, decided.ignored)
            if decided.address != self._call.origin:
                # Most connections carry one client: keep the last CallInfo for the next call.
                self._call = CallInfo(self.info, decided.address)
            return self._call
        if self._ignored is not None:
            policy.metrics.ignored(policy.mode, self._ignored)
        return self._call


def _compact_settings(h2: H2Connection | None) -> None:
    if h2 is not None:
        compact(h2.local_settings)
        compact(h2.remote_settings)


def _prune_closed_streams(h2: H2Connection | None) -> None:
    """h2's count of open inbound streams, for its side effect: it removes closed streams."""
    if h2 is not None:
        _ = h2.open_inbound_streams


class ListenerHandler(Handler):
    """grpclib's per-connection request handler; `accept` sets up each stream's guards
    and context before the stream's task starts.

    A finished stream's task leaves `_tasks` as soon as it is done. grpclib prunes that map
    only every tenth stream of a connection, so an agent connection (a Register, a Subscribe,
    a heartbeat every 30 s) would keep its finished Register stream, with its buffer and
    events (about 5 KB), for minutes or for good."""

    # Set by the protocol it serves, right after both are made.
    owner: ListenerProtocol
    # What its streams are served with, made at the first stream.
    _served: Served | None = None

    def cancel(self, stream: Stream) -> None:
        # A reset that arrives after the stream's task finished has nothing left to cancel.
        if stream in self._tasks:
            super().cancel(stream)

    def accept(
        self, stream: Stream, headers: list[tuple[str, str]], release_stream: Callable[[], Any]
    ) -> None:
        self.__gc_step__()  # prunes the tasks of streams reset by their client
        path = None
        forwarded: list[str] | None = None
        for name, value in headers:
            if name == ":path":
                path = value
            elif name == XFF_HEADER:
                if forwarded is None:
                    forwarded = []
                forwarded.append(value)
        owner = self.owner
        call = owner.call_for(forwarded)
        method = self.mapping.get(path) if path is not None else None
        unary = method is not None and not method.cardinality.client_streaming
        assert stream.id is not None
        buffer = GuardedBuffer(partial(stream.connection.ack, stream.id), owner, stream, unary)
        stream.buffer = buffer

        def release() -> None:
            release_stream()
            buffer.discard()

        context = contextvars.copy_context()
        context.run(CURRENT_CALL.set, call)
        if self._served is None:
            self._served = Served(
                self.mapping,
                self.codec,
                self.status_details_codec,
                self.dispatch,
                owner.policy.refusals,
            )
        task = self.loop.create_task(
            self._served.serve_stream(stream, headers, release), context=context
        )
        buffer.task = task
        self._tasks[stream] = task
        task.add_done_callback(partial(self._finished, stream))

    def _finished(self, stream: Stream, task: asyncio.Task[None]) -> None:
        if self._tasks.get(stream) is task:
            del self._tasks[stream]
        # h2 drops a closed stream only when it next counts the open ones (a new stream): an
        # agent's last heartbeat stream (about 8 tracked objects) would live until its next
        # heartbeat, and a heartbeat window of 10,000 agents grows the young generation by
        # 80,000 objects, collected in one pause of 70 to 500 ms. The count prunes it now.
        _prune_closed_streams(self.owner._h2)
        buffer = stream.buffer
        if isinstance(buffer, GuardedBuffer):
            # The stream and its buffer point at each other: without this they wait for a
            # garbage collection instead of going when the connection lets go of the stream.
            buffer.task = None
            buffer.stream = None
