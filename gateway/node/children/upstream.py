"""The upstream actors' child specs: the channel, the breaker's actor and the permits."""

from __future__ import annotations

from actors.upstream.actor import Upstream
from actors.upstream.regulator import Regulator
from actors.upstream.slow_sampler import NAME as SLOW_SERVER
from actors.upstream.slow_sampler import SlowSampler
from gateway.config.context import NodeContext
from gateway.upstream.channel_actor import UpstreamChannelActor
from supervisors.supervisor import ChildSpec


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    return (
        # Opens the upstream connections (without waiting for them) before anything that calls
        # the server starts.
        ChildSpec("upstream_channel", UpstreamChannelActor, ctx, name="upstream_channel"),
        ChildSpec("upstream", Upstream, ctx, name="upstream"),
        ChildSpec("upstream_regulator", Regulator, ctx, name="upstream_regulator"),
    )


def slow_server_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    # Reads the lane states the upstream actors publish; not a readiness input.
    return (ChildSpec(SLOW_SERVER, SlowSampler, ctx, name=SLOW_SERVER),)
