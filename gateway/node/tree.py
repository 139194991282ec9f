"""`gateway_sup`, the root of the supervision tree.

Order is policy: the metrics and health endpoints start first and stop last, so probes
and scrapes answer through a planned stop; the registry follows them, so every table the agent
plane reads exists before anything that writes or reads it starts; `agent_sup` comes after the
upstream actors its owners notify; the listeners come last so they start after everything they
call and stop first.
"""

from __future__ import annotations

from collections.abc import Callable

from actors.agents.api import AGENT_SUP_NAME, create_owner_table
from actors.agents.watch import create_watch_table
from actors.registry.api import ConnectionDown, registry_address
from actors.router.api import ROUTER_NAME
from actors.upstream.actor import readiness_checks
from actors.upstream.api import create_notify_hold
from gateway.agent.service import MODULE as AGENT_SERVICE_MODULE
from gateway.agent.service import agent_service
from gateway.cluster.actor import cluster_child_spec
from gateway.config.context import NodeContext
from gateway.config.keys.node import HEALTH_PORT, PROMETHEUS_PORT
from gateway.console.server import ConsoleServer
from gateway.http.endpoints import EndpointArgs, HttpEndpoint, health_routes, metrics_routes
from gateway.http.metrics import register_node_metrics
from gateway.listeners.connection import ConnectionInfo
from gateway.listeners.tree import listener_child_specs
from gateway.mgmt.auth.tree import mgmt_auth_tree
from gateway.mgmt.service import MODULE as MGMT_SERVICE_MODULE
from gateway.mgmt.service import mgmt_service
from gateway.node.children import agents, gauges, heartbeat, memory, registry, router, upstream
from supervisors.runtime import LoopSystemBase
from supervisors.supervisor import ChildSpec, Supervisor, SupFlags, SupSpec

# Seed, "OTP Process Model": the root tolerates 10 restarts in 60 s before it gives up.
ROOT_INTENSITY = 10
ROOT_PERIOD_S = 60.0
# The endpoints bind every interface: probes and scrapers come from outside the host.
ENDPOINT_HOST = "0.0.0.0"


class GatewaySup(Supervisor):
    def supervisor_spec(self, args: NodeContext) -> SupSpec:
        ctx = args
        runtime = self.runtime
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
        # yuzu_gw_build_info and a gauge per readiness check (gateway/http/metrics.py).
        register_node_metrics(ctx.registry, ctx.readiness)
        # `upstream` (alive) and `circuit_breaker` (the published state): table and name reads,
        # so /readyz answers at once whatever the upstream actor is doing.
        for check_name, check in readiness_checks(runtime).items():
            ctx.readiness.register(check_name, check)
        # Seed, "Readiness": the agent supervisor must be alive (a name read, no call).
        ctx.readiness.register(AGENT_SUP_NAME, lambda: runtime.whereis(AGENT_SUP_NAME) is not None)
        ctx.readiness.register(ROUTER_NAME, lambda: runtime.whereis(ROUTER_NAME) is not None)
        # Built here, before any child starts: the listeners are validated (a bad route refuses
        # the boot before anything binds) and the admission summary state exists before the
        # first heartbeat can arrive. Management peer authorisation guards the management
        # routes; its certificate watcher publishes the pins before the listeners start.
        mgmt_auth = mgmt_auth_tree(ctx)
        listeners = listener_child_specs(
            ctx,
            {
                AGENT_SERVICE_MODULE: agent_service(ctx, runtime),
                MGMT_SERVICE_MODULE: mgmt_service(ctx, runtime),
            },
            on_connection_closed=connection_closed(runtime),
            peer_gate=mgmt_auth.gate,
        )
        # The owner table belongs to the root so a row outlives its owner's crash and agent_sup's
        # restarts (seed: "When an agent's owner process crashes").
        create_owner_table(self)
        # WatchEvents' watchers, which the owners publish to: the root's, like the owner table.
        create_watch_table(self)
        # The held notifications and the owners' posts outlive the upstream actor's restarts.
        create_notify_hold(self)
        return SupSpec(
            SupFlags("one_for_one", ROOT_INTENSITY, ROOT_PERIOD_S),
            (
                ChildSpec("metrics", HttpEndpoint, metrics, name="metrics"),
                ChildSpec("health", HttpEndpoint, health, name="health"),
                *registry.child_specs(ctx),
                *upstream.child_specs(ctx),
                *heartbeat.child_specs(ctx),
                *agents.child_specs(ctx),
                *router.child_specs(ctx),
                # Membership, the inter-node transport and forwarded commands (docs/cluster.md);
                # after the router it forwards for, before the listeners.
                cluster_child_spec(ctx),
                *upstream.slow_server_specs(ctx),
                *gauges.child_specs(ctx),
                ChildSpec("console", ConsoleServer, ctx, name="console"),
                mgmt_auth.watcher,
                *listeners,
                # After the listeners it moves, so it stops before them (the shedder stops,
                # then the agent listeners are suspended).
                *memory.child_specs(ctx),
            ),
        )


def connection_closed(runtime: LoopSystemBase) -> Callable[[ConnectionInfo], None]:
    """Tell the registry each agent connection that closed: its pending rows go after the grace
    and it takes no new reservation (a restarting registry has nothing of it to drop)."""

    def closed(conn: ConnectionInfo) -> None:
        registry = registry_address(runtime)
        if registry is not None:
            runtime.tell(registry, ConnectionDown(conn.key))

    return closed
