"""The listeners' counters (seed: "Origin counters", "Node-wide memory load shedding").

Both origin labels come from closed sets and every series exists from the start at 0, so an
alert on a rate sees a flat line rather than no data. An address is never a label, and the
counters carry no listener label (the seed's families have none).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from gateway.listeners.origin import Ignored, Mode

EXTRA_REQUEST_DATA = "extra_request_data"
STREAM_ENDED = "stream_ended"


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
        # Children resolved once: labels() is a dict lookup under a lock, per stream.
        self._ignored = {
            (mode, reason): self.origin_ignored.labels(mode.value, reason.value)
            for mode in (Mode.PROXY_PROTOCOL, Mode.FORWARDED_FOR)
            for reason in Ignored
        }

    def ignored(self, mode: Mode, reason: Ignored) -> None:
        self._ignored[(mode, reason)].inc()

    def dropped(self, reason: str, size: int) -> None:
        if size > 0:
            self._dropped[reason].inc(size)
