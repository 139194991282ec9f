"""`UpstreamChannelActor` (registered `upstream_channel`): owns the upstream channels of a node
and publishes them.

How other code gets a channel (no message round trip, calls never pass through this actor):

    from actors.upstream.api import PROXY_REGISTER, upstream_channel
    channel = upstream_channel(runtime)                   # default_channel, or None
    reply = await channel.unary(PROXY_REGISTER, request, RegisterResponse, timeout=5.0)

or read the protected table `CHANNELS_TABLE` (`upstream_channels`, actors/upstream/api.py),
keyed by channel name (`DEFAULT_CHANNEL`), whose values implement `actors.upstream.api.Channel`.

Lifecycle: `init` builds every configured channel and starts its dials (it does not wait for
them: a server that is down must not stop the node from starting), then publishes it. The table
dies with the actor, so a restarted actor publishes fresh channels. `terminate` closes them.

Also here, registered once per node so a restart of this actor does not register twice:

* the readiness check `upstream_tls_files`: false while a channel's latest connection attempt
  failed because its SSL options cannot be used (a table read, so a slow upstream cannot hold
  `/readyz`); true when the actor is not running (the tree's own checks report that);
* the metrics `yuzu_gw_upstream_server_max_streams` (gauge: default_channel's total),
  `yuzu_gw_upstream_connections{channel,state}` (gauge) and
  `yuzu_gw_upstream_tls_handshake_failures_total` (counter).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from actors.node.api import Readiness
from actors.upstream.api import CHANNELS_TABLE, DEFAULT_CHANNEL, Channel
from gateway.config.context import NodeContext
from gateway.config.keys.upstream import UPSTREAM_CLIENT, UPSTREAM_TCP_NODELAY
from gateway.upstream.channel import UpstreamChannel
from supervisors.process import Process
from supervisors.reason import ExitReason
from supervisors.runtime import LoopSystemBase

__all__ = ["READINESS_CHECK", "UpstreamChannelActor", "tls_files_usable", "upstream_channels"]

READINESS_CHECK: Final = "upstream_tls_files"


def upstream_channels(runtime: LoopSystemBase) -> Mapping[str, Channel]:
    """Every published channel by name; empty while the actor is not running."""
    table = runtime.table(CHANNELS_TABLE)
    return dict(table.items()) if table is not None else {}


def tls_files_usable(runtime: LoopSystemBase) -> bool:
    return all(channel.tls_files_usable() for channel in upstream_channels(runtime).values())


class _ChannelCollector(Collector):
    """Gauges read from the published channels at scrape time, so they are never stale and
    survive a restart of the actor without re-registration."""

    def __init__(self, runtime: LoopSystemBase) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        channels = upstream_channels(self.runtime)
        default = channels.get(DEFAULT_CHANNEL)
        streams = GaugeMetricFamily(
            "yuzu_gw_upstream_server_max_streams",
            "Sum of SETTINGS_MAX_CONCURRENT_STREAMS the server declared on default_channel's"
            " live connections; 0 when unknown or when the server declared no limit.",
        )
        streams.add_metric([], default.server_max_streams() if default is not None else 0)
        yield streams
        connections = GaugeMetricFamily(
            "yuzu_gw_upstream_connections",
            "Upstream connections by channel and state (connecting, up, backoff, closed).",
            labels=["channel", "state"],
        )
        for name, channel in channels.items():
            if isinstance(channel, UpstreamChannel):
                for state, count in channel.connection_states().items():
                    connections.add_metric([name, state], count)
        yield connections


class _Metrics:
    def __init__(self, registry: CollectorRegistry, runtime: LoopSystemBase) -> None:
        self.tls_handshake_failures = Counter(
            "yuzu_gw_upstream_tls_handshake_failures",
            "Failed TLS handshakes of upstream connections (an alert, an untrusted server"
            " certificate). Each also fails the connection attempt the breaker sees.",
            registry=registry,
        )
        registry.register(_ChannelCollector(runtime))


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, _Metrics] = weakref.WeakKeyDictionary()


def _metrics(registry: CollectorRegistry, runtime: LoopSystemBase) -> _Metrics:
    # Once per node registry: a restarted actor keeps counting where the last one stopped.
    metrics = _METRICS.get(registry)
    if metrics is None:
        metrics = _METRICS[registry] = _Metrics(registry, runtime)
    return metrics


def _register_readiness(readiness: Readiness, runtime: LoopSystemBase) -> None:
    if READINESS_CHECK not in readiness.names():
        readiness.register(READINESS_CHECK, lambda: tls_files_usable(runtime))


class UpstreamChannelActor(Process):
    def init(self, args: Any) -> None:
        ctx: NodeContext = args
        spec = ctx.config[UPSTREAM_CLIENT]
        nodelay = ctx.config[UPSTREAM_TCP_NODELAY]
        metrics = _metrics(ctx.registry, self.runtime)
        _register_readiness(ctx.readiness, self.runtime)
        self.table = self.new_table(CHANNELS_TABLE, "protected")
        self.channels: list[UpstreamChannel] = []
        for channel_spec in spec.channels if spec is not None else ():
            channel = UpstreamChannel(
                channel_spec,
                nodelay=nodelay,
                on_handshake_failure=metrics.tls_handshake_failures.inc,
            )
            channel.start(self.loop)
            self.channels.append(channel)
            self.table.insert(channel.name, channel)

    def terminate(self, reason: ExitReason) -> None:
        for channel in self.channels:
            channel.close()

    def format_status(self) -> Mapping[str, Any]:
        # Endpoints, states and reasons only: the specs' SSL options stay out of the console.
        return {channel.name: channel.status() for channel in self.channels}
