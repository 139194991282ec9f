"""`gateway_sup`, the root of the supervision tree.

Order is policy: the metrics and health endpoints start first and stop last, so probes
and scrapes answer through a planned stop; listeners (added by the agent-plane issue) come
last so they start after everything they call and stop first.
"""

from __future__ import annotations

from gateway.config.keys.node import HEALTH_PORT, PROMETHEUS_PORT
from gateway.console import ConsoleServer
from gateway.context import NodeContext
from gateway.endpoints import EndpointArgs, HttpEndpoint, health_routes, metrics_routes
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
            "metrics", ENDPOINT_HOST, ctx.config[PROMETHEUS_PORT],
            metrics_routes(ctx.registry), ctx.record_bound,
        )
        health = EndpointArgs(
            "health", ENDPOINT_HOST, ctx.config[HEALTH_PORT],
            health_routes(ctx.readiness), ctx.record_bound,
        )
        return SupSpec(
            SupFlags("one_for_one", ROOT_INTENSITY, ROOT_PERIOD_S),
            (
                ChildSpec("metrics", HttpEndpoint, metrics, name="metrics"),
                ChildSpec("health", HttpEndpoint, health, name="health"),
                ChildSpec("console", ConsoleServer, ctx, name="console"),
            ),
        )
