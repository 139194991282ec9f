"""`gateway_sup`, the root of the supervision tree.

Order is policy: the metrics and health endpoints start first and stop last, so probes
and scrapes answer through a planned stop; listeners (added by the agent-plane issue) come
last so they start after everything they call and stop first.
"""

from __future__ import annotations

from actors.upstream import Upstream, readiness_checks
from actors.upstream_regulator import Regulator
from gateway.config.keys.node import HEALTH_PORT, PROMETHEUS_PORT
from gateway.console import ConsoleServer
from gateway.context import NodeContext
from gateway.endpoints import EndpointArgs, HttpEndpoint, health_routes, metrics_routes
from gateway.upstream.channel_actor import UpstreamChannelActor
from supervisors.supervisor import ChildSpec, Supervisor, SupFlags, SupSpec

# Seed, "OTP Process Model": the root tolerates 10 restarts in 60 s before it gives up.
ROOT_INTENSITY = 10
ROOT_PERIOD_S = 60.0
# The endpoints bind every interface: probes and scrapers come from outside the host.
ENDPOINT_HOST = "0.0.0.0"


class GatewaySup(Supervisor):
    def supervisor_spec(self, args: NodeContext) -> SupSpec:
        ctx = args
        metrics = EndpointArgs(
            "metrics",
            ENDPOINT_HOST,
            ctx.config[PROMETHEUS_PORT],
            metrics_routes(ctx.registry),
            ctx.record_bound,
        )
        health = EndpointArgs(
            "health",
            ENDPOINT_HOST,
            ctx.config[HEALTH_PORT],
            health_routes(ctx.readiness),
            ctx.record_bound,
        )
        # `upstream` (alive) and `circuit_breaker` (the published state): table and name reads,
        # so /readyz answers at once whatever the upstream actor is doing.
        for check_name, check in readiness_checks(self.runtime).items():
            ctx.readiness.register(check_name, check)
        return SupSpec(
            SupFlags("one_for_one", ROOT_INTENSITY, ROOT_PERIOD_S),
            (
                ChildSpec("metrics", HttpEndpoint, metrics, name="metrics"),
                ChildSpec("health", HttpEndpoint, health, name="health"),
                # Opens the upstream connections (without waiting for them) before anything
                # that calls the server starts.
                ChildSpec("upstream_channel", UpstreamChannelActor, ctx, name="upstream_channel"),
                ChildSpec("upstream", Upstream, ctx, name="upstream"),
                ChildSpec("upstream_regulator", Regulator, ctx, name="upstream_regulator"),
                ChildSpec("console", ConsoleServer, ctx, name="console"),
            ),
        )
