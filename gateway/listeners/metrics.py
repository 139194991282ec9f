"""The listeners' counters (seed: "Origin counters", "Node-wide memory load shedding"; seed
001's go-away counter; the refused calls and handshakes of docs/listeners.md "Hostile input").

Every label comes from a closed set and every series exists from the start at 0, so an alert on
a rate sees a flat line rather than no data. An address is never a label. The seed's families
carry no listener label; the GOAWAY counter does (its reasons differ between an agent listener
and the management one), and its series are made when each listener's policy is (`goaways`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter

from gateway.config.origin_sources import Mode
from gateway.listeners.origin import Ignored

EXTRA_REQUEST_DATA = "extra_request_data"
STREAM_ENDED = "stream_ended"

# Why a GOAWAY was sent: the two graceful ones (NO_ERROR, the connection's streams run to their
# end), then those sent right before the gateway closes the connection.
DRAINING: Final = "draining"  # a planned stop (seed 001: DRAINING on shutdown)
OVERLOADED: Final = "overloaded"  # the overload go-away (seed 001: OVERLOADED)
IDLE_TIMEOUT: Final = "idle_timeout"  # http2.idle_timeout, NO_ERROR
MEMORY_BOUND: Final = "memory_bound"  # limits.max_connection_memory_bytes, ENHANCE_YOUR_CALM
CANCEL_RATE: Final = "cancel_rate"  # http2.max_cancel_stream_rate, ENHANCE_YOUR_CALM
GRACE_ENDED: Final = "grace_ended"  # still open 5 s after its overload go-away, NO_ERROR
LISTENER_STOPPED: Final = "listener_stopped"  # the listener stops (a planned stop), NO_ERROR
GOAWAY_REASONS: Final = (
    DRAINING,
    OVERLOADED,
    IDLE_TIMEOUT,
    MEMORY_BOUND,
    CANCEL_RATE,
    GRACE_ENDED,
    LISTENER_STOPPED,
)

# Why a call was refused for what it put on the wire (gateway/listeners/request.py).
DEADLINE_EXPIRED: Final = "deadline_expired"  # grpc-timeout 0: DEADLINE_EXCEEDED
BAD_TIMEOUT: Final = "bad_timeout"  # grpc-timeout not 1 to 8 digits and a unit: INTERNAL
BAD_METADATA: Final = "bad_metadata"  # a -bin header that is not base64: INTERNAL
COMPRESSED: Final = "compressed"  # the compressed flag set: UNIMPLEMENTED
BAD_MESSAGE_FLAG: Final = "bad_message_flag"  # a flag byte other than 0 and 1: INTERNAL
TRUNCATED_MESSAGE: Final = "truncated_message"  # the stream ended inside a message: INTERNAL
EXTRA_MESSAGE: Final = "extra_message"  # a second request message on a unary call: INTERNAL
REFUSAL_REASONS: Final = (
    DEADLINE_EXPIRED,
    BAD_TIMEOUT,
    BAD_METADATA,
    COMPRESSED,
    BAD_MESSAGE_FLAG,
    TRUNCATED_MESSAGE,
    EXTRA_MESSAGE,
)

# Why a connection was closed before HTTP/2 started (gateway/listeners/server.py `_setup`).
PROXY_HEADER_TIMEOUT: Final = "proxy_header_timeout"  # no complete PROXY header in 1 s
BAD_PROXY_HEADER: Final = "bad_proxy_header"  # anything else where the header should be
TLS_TIMEOUT: Final = "tls_timeout"  # the TLS handshake outlasted the handshake time-out
TLS_FAILED: Final = "tls_failed"  # the TLS handshake failed (a bad certificate, not TLS)
PREFACE_TIMEOUT: Final = "preface_timeout"  # no HTTP/2 preface and SETTINGS within it
BAD_PREFACE: Final = "bad_preface"  # the first bytes are not the HTTP/2 client preface
PEER_CLOSED: Final = "peer_closed"  # the client went away during the handshake
HANDSHAKE_REASONS: Final = (
    PROXY_HEADER_TIMEOUT,
    BAD_PROXY_HEADER,
    TLS_TIMEOUT,
    TLS_FAILED,
    PREFACE_TIMEOUT,
    BAD_PREFACE,
    PEER_CLOSED,
)


class ListenerMetrics:
    """Created once per node registry and shared by every listener of the node."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.origin_ignored = Counter(
            "yuzu_gw_grpc_origin_ignored",
            "Calls on a proxied listener whose claim was not used, per RPC stream.",
            ["mode", "reason"],
            registry=registry,
        )
        for mode in (Mode.PROXY_PROTOCOL, Mode.FORWARDED_FOR):
            for reason in Ignored:
                self.origin_ignored.labels(mode.value, reason.value)
        self.connection_killed = Counter(
            "yuzu_gw_grpc_connection_killed",
            "Connections killed for buffering more than limits.max_connection_memory_bytes.",
            registry=registry,
        )
        self.recv_timeout = Counter(
            "yuzu_gw_grpc_recv_timeout",
            "Requests aborted for stalling longer than limits.request_timeout_ms.",
            registry=registry,
        )
        self.dropped_data_bytes = Counter(
            "yuzu_gw_grpc_dropped_data_bytes",
            "Request bytes discarded in a state where no handler may run them.",
            ["reason"],
            registry=registry,
        )
        self._dropped = {
            reason: self.dropped_data_bytes.labels(reason)
            for reason in (EXTRA_REQUEST_DATA, STREAM_ENDED)
        }
        self.goaway_sent = Counter(
            "yuzu_gw_listener_goaway_sent",
            "HTTP/2 GOAWAY frames the gateway sent, by listener and reason.",
            ["listener", "reason"],
            registry=registry,
        )
        # Children resolved once: labels() is a dict lookup under a lock, per stream.
        self._ignored = {
            (mode, reason): self.origin_ignored.labels(mode.value, reason.value)
            for mode in (Mode.PROXY_PROTOCOL, Mode.FORWARDED_FOR)
            for reason in Ignored
        }

        self.request_refused = Counter(
            "yuzu_gw_grpc_request_refused",
            "Calls refused for what the client put on the wire, by listener and reason.",
            ["listener", "reason"],
            registry=registry,
        )
        self.handshake_failed = Counter(
            "yuzu_gw_listener_handshake_failed",
            "Connections closed before HTTP/2 started, by listener and reason.",
            ["listener", "reason"],
            registry=registry,
        )

    def ignored(self, mode: Mode, reason: Ignored) -> None:
        self._ignored[(mode, reason)].inc()

    def dropped(self, reason: str, size: int) -> None:
        if size > 0:
            self._dropped[reason].inc(size)

    def goaways(self, listener: str) -> Mapping[str, Counter]:
        """The GOAWAY series of one listener, by reason, each made now at 0."""
        return {reason: self.goaway_sent.labels(listener, reason) for reason in GOAWAY_REASONS}

    def refusals(self, listener: str) -> Mapping[str, Counter]:
        """The refused-call series of one listener, by reason, each made now at 0."""
        return {r: self.request_refused.labels(listener, r) for r in REFUSAL_REASONS}

    def handshakes(self, listener: str) -> Mapping[str, Counter]:
        """The failed-handshake series of one listener, by reason, each made now at 0."""
        return {r: self.handshake_failed.labels(listener, r) for r in HANDSHAKE_REASONS}
