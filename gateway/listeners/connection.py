"""What a gRPC handler knows about the call it serves: its connection and its origin.

    from gateway.listeners.connection import current_call

    async def Register(self, stream):
        call = current_call()
        call.connection.key      # int, unique per HTTP/2 connection in this process
        call.origin              # "" or the bare IP the call is attributed to
        call.connection.peer     # the TCP peer's bare IP (a proxy's, behind one)

`current_call()` works in the handler coroutine and in anything it awaits or spawns (it is a
context variable the listener sets for each RPC stream's task); outside a call it raises
`LookupError`. Heartbeat admission binds a session to `connection.key`; the registry learns
that a connection went away from `on_close` callbacks or the listener's connection-closed hook.
A Subscribe learns that the listener sent its connection away (the overload go-away,
docs/listeners.md) from `on_sent_away`, and ends its stream with the retry time it is given.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
from collections.abc import Callable
from typing import TypeVar

import attrs

from supervisors.reason import ExitReason

log = logging.getLogger("yuzu_gw.listeners")
T = TypeVar("T")

# One counter per process: keys stay unique across listeners and listener restarts, so a key
# a registry still holds can never be handed to a newer connection.
_KEYS = itertools.count(1)


def next_key() -> int:
    return next(_KEYS)


class ConnectionInfo:
    """One accepted connection. Slots: 60,000 of these may be alive at once."""

    __slots__ = (
        "_away",
        "_callbacks",
        "_peer_der",
        "goaway_retry_ms",
        "key",
        "listener",
        "open",
        "peer",
        "peer_port",
        "sent_away_ms",
    )

    def __init__(self, key: int, listener: str, peer: str, peer_port: int) -> None:
        self.key = key
        self.listener = listener
        self.peer = peer  # bare IP, IPv4-mapped folded
        self.peer_port = peer_port
        self.open = True
        self._peer_der: bytes | None = None
        self._callbacks: list[Callable[[ConnectionInfo], None]] | None = None
        # The retry time the connection was sent away with, once it was.
        self.sent_away_ms: int | None = None
        # The retry time of the graceful GOAWAY it got, once it got one (a planned stop's drain,
        # or the overload go-away): its streams' UNAVAILABLE ends say the same.
        self.goaway_retry_ms: int | None = None
        self._away: list[Callable[[int], None]] | None = None

    def attach(self, transport: object) -> None:
        """Called by the listener once the connection is established (after TLS). The peer
        certificate is captured here, once: the management listener's per-stream check reads
        it for every stream."""
        ssl_object = transport.get_extra_info("ssl_object")  # type: ignore[attr-defined]
        if ssl_object is not None:
            self._peer_der = ssl_object.getpeercert(binary_form=True)

    def peer_cert(self) -> bytes | None:
        """The DER certificate the client presented in the TLS handshake, or None."""
        return self._peer_der

    def on_close(self, callback: Callable[[ConnectionInfo], None]) -> None:
        """Call `callback(self)` once when the connection closes (at once if it has)."""
        if not self.open:
            _run(callback, self)
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)

    def closed(self) -> None:
        """Called by the listener when the transport is gone."""
        if not self.open:
            return
        self.open = False
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            _run(callback, self)

    def on_sent_away(self, callback: Callable[[int], None]) -> None:
        """Call `callback(retry_after_ms)` once if the listener sends this connection away (at
        once if it has). A stream that ends first takes it back with `forget_sent_away`."""
        if self.sent_away_ms is not None:
            _run(callback, self.sent_away_ms)
            return
        if self._away is None:
            self._away = []
        self._away.append(callback)

    def forget_sent_away(self, callback: Callable[[int], None]) -> None:
        if self._away is not None and callback in self._away:
            self._away.remove(callback)

    def sent_away(self, retry_after_ms: int) -> None:
        """Called by the listener right after the connection's overload GOAWAY."""
        if self.sent_away_ms is not None:
            return
        self.sent_away_ms = retry_after_ms
        callbacks, self._away = self._away, None
        for callback in callbacks or ():
            _run(callback, retry_after_ms)

    def __repr__(self) -> str:
        state = "open" if self.open else "closed"
        return f"<Connection {self.key} on {self.listener} {state}>"


def _run(callback: Callable[[T], None], value: T) -> None:
    # A watcher's bug must not stop the others being told, nor the listener's bookkeeping;
    # the log gets the class and frame only (seed: crash redaction).
    try:
        callback(value)
    except Exception as exc:
        log.error("a connection callback raised: %s", ExitReason.crash(exc))


@attrs.frozen(slots=True)
class CallInfo:
    """One RPC stream. For `transport` and `proxy_protocol` listeners every stream of a
    connection shares one instance; `forwarded_for` decides per stream."""

    connection: ConnectionInfo
    origin: str  # a bare IP, or "" when the proxy gave no usable address

    @property
    def observed(self) -> bool:
        return self.origin != ""


CURRENT_CALL: contextvars.ContextVar[CallInfo] = contextvars.ContextVar("yuzu_gw_call")


def current_call() -> CallInfo:
    """The call being served by this task; `LookupError` outside a listener's handler."""
    return CURRENT_CALL.get()
