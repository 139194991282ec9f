"""What the root supervisor starts for the listeners, and the `listeners` readiness check.

    from gateway.listeners.tree import listener_child_specs

    children = listener_child_specs(ctx, {"yuzu_gw_agent_service": AgentService(...),
                                          "yuzu_gw_mgmt_service": ManagementService(...)})

`handlers` maps the module names a `services` map names to grpclib servables (objects with
`__mapping__()`, such as subclasses of the generated `AgentServiceBase`). A name with no
handler, or a handler that routes none of its service's methods, refuses boot with
`{bad_routes, ...}`; a handler that routes only some is accepted and the rest are answered
UNIMPLEMENTED by grpclib (seed: "gRPC listeners").

Call it once per node and before anything binds (it raises `BootRefused`), then put the specs
last in the root supervisor: listeners start after everything they call and stop first.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from gateway.config.context import NodeContext
from gateway.config.keys.listeners import (
    ALLOW_NO_LISTENERS,
    GRPC_LISTENERS,
    LISTENER_HANDSHAKE_TIMEOUT_MS,
)
from gateway.config.listener_spec import BAD_ROUTES, ListenerSpec
from gateway.config.refusal import BootRefused
from gateway.config.terms import format_atom
from gateway.listeners.connection import ConnectionInfo
from gateway.listeners.extras import ListenerExtras
from gateway.listeners.listener_actor import (
    RUNNING,
    STATE_ROW,
    ListenerActor,
    ListenerArgs,
    ListenerState,
    actor_name,
)
from gateway.listeners.metrics import ListenerMetrics
from gateway.listeners.server import Routes
from supervisors.supervisor import ChildSpec
from supervisors.table import Table

log = logging.getLogger("yuzu_gw.listeners")

READINESS_CHECK = "listeners"
# Seed, "Sizing the proxy and the gateway for a fleet": keep about 5500 descriptors below the
# process limit for everything that is not an agent connection (upstream, endpoints, files).
FD_HEADROOM = 5500
# A listener gets this long to close its socket and connections when the tree stops.
LISTENER_SHUTDOWN_S = 5.0


class RouteGuard(Protocol):
    """What stands in front of a listener's routes: the management peer authorisation
    (gateway/mgmt/auth/gate.py's `PeerGate`), handed down by the tree that starts both."""

    def guard(self, spec: ListenerSpec, routes: Collection[Routes]) -> tuple[Routes, ...]: ...


def listener_child_specs(
    ctx: NodeContext,
    handlers: Mapping[str, object],
    *,
    on_connection_closed: Callable[[ConnectionInfo], None] | None = None,
    peer_gate: RouteGuard | None = None,
) -> tuple[ChildSpec, ...]:
    """One permanent worker per configured listener, in config order, named
    `listener_<name>`; registers the `listeners` readiness check. `on_connection_closed` is
    told every connection that goes away (the registry's ConnectionDown). `peer_gate` puts the
    management peer authorisation in front of the management routes (docs/mgmt-auth.md)."""
    specs: tuple[ListenerSpec, ...] = ctx.config[GRPC_LISTENERS]
    # Health and opt-in reflection beside the configured services (before the gate: it guards
    # reflection, never Health), and the RPC metrics (gateway/listeners/extras.py).
    extras = ListenerExtras.of(ctx)
    routes = {spec.name: extras.add_routes(spec, resolve_routes(spec, handlers)) for spec in specs}
    if peer_gate is not None:
        routes = {spec.name: peer_gate.guard(spec, routes[spec.name]) for spec in specs}
    elif any(spec.serves_mgmt and spec.tls is not None for spec in specs):
        # Serving the management plane over TLS without its authorisation would admit any
        # holder of a certificate from the install CA: never start that way.
        raise RuntimeError("a management listener with TLS needs the peer gate")
    check_fd_limit(specs)
    metrics = ListenerMetrics(ctx.registry)
    board = ListenerBoard(specs, ctx.config[ALLOW_NO_LISTENERS])
    ctx.readiness.register(READINESS_CHECK, board.ready)
    return tuple(
        ChildSpec(
            actor_name(spec.name),
            ListenerActor,
            ListenerArgs(
                spec,
                routes[spec.name],
                metrics,
                board.publish,
                ctx.record_bound,
                on_connection_closed,
                extras,
                handshake_timeout_s=ctx.config[LISTENER_HANDSHAKE_TIMEOUT_MS] / 1000,
            ),
            restart="permanent",
            shutdown=LISTENER_SHUTDOWN_S,
            name=actor_name(spec.name),
        )
        for spec in specs
    )


def resolve_routes(spec: ListenerSpec, handlers: Mapping[str, object]) -> tuple[Routes, ...]:
    """The routes of each service of `spec`, from its handler's `__mapping__()`."""
    routes: list[Routes] = []
    for service, module in spec.services:
        handler = handlers.get(module)
        servable = getattr(handler, "__mapping__", None)
        if handler is None or servable is None:
            raise BootRefused(
                BAD_ROUTES,
                f"grpc_listeners entry {spec.name}: services maps {format_atom(service)} to"
                f" {format_atom(module)}, which is not a service module of this gateway",
                context=(f"{{unknown_module,{format_atom(module)}}}",),
            )
        prefix = f"/{service}/"
        mapping = {path: h for path, h in servable().items() if path.startswith(prefix)}
        if not mapping:
            raise BootRefused(
                BAD_ROUTES,
                f"grpc_listeners entry {spec.name}: {format_atom(module)} routes none of the"
                f" methods of {format_atom(service)} (a mistyped module?)",
                context=(f"{{service_without_routes,{format_atom(service)}}}",),
            )
        routes.append(Routes(mapping))
    return tuple(routes)


def check_fd_limit(
    specs: tuple[ListenerSpec, ...],
    getrlimit: Callable[[int], tuple[int, int]] = resource.getrlimit,
    setrlimit: Callable[[int, tuple[int, int]], None] = resource.setrlimit,
) -> int:
    """Raise the soft open-file limit to the hard one (as the BEAM does at start), then warn
    when the listeners' max_connections cannot all be held under it. Returns the limit."""
    soft, hard = getrlimit(resource.RLIMIT_NOFILE)
    if hard not in (resource.RLIM_INFINITY, soft):
        try:
            setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            log.info(
                "open-file limit stays at %d (the hard limit %d could not be taken)", soft, hard
            )
        else:
            log.info("open-file limit raised from %d to the hard limit %d", soft, hard)
            soft = hard
    wanted = sum(spec.limits.max_connections for spec in specs)
    if specs and soft != resource.RLIM_INFINITY and wanted + FD_HEADROOM > soft:
        log.warning(
            "gRPC listeners: limits.max_connections add up to %d but the open-file limit is %d;"
            " with about %d descriptors kept for everything else, at most %d connections can"
            " be held. Raise the limit (LimitNOFILE=, ulimits nofile) or lower max_connections"
            " (docs/listeners.md 'Connection ceilings')",
            wanted,
            soft,
            FD_HEADROOM,
            max(soft - FD_HEADROOM, 0),
        )
    return soft


def agent_connection_capacity(specs: tuple[ListenerSpec, ...]) -> int:
    """The connections the agent listeners admit, summed (the notification cap is 3 per
    connection, seed "Stream Status Notification", Cap)."""
    return sum(spec.limits.max_connections for spec in specs if spec.routes_agent)


class ListenerBoard:
    """Where each running listener publishes its table; the `listeners` readiness check.

    Ready when every configured listener's published state is `running` and, unless
    allow_no_listeners is true, at least one of them routes the AgentService (seed:
    "Readiness"). It reads tables only: no message, no connection to the ports."""

    def __init__(self, specs: tuple[ListenerSpec, ...], allow_no_listeners: bool) -> None:
        self.names = tuple(spec.name for spec in specs)
        self.routes_agent = any(spec.routes_agent for spec in specs)
        self.allow_no_listeners = allow_no_listeners
        self._tables: dict[str, Table[str, ListenerState]] = {}

    def publish(self, name: str, table: Table[str, ListenerState]) -> None:
        self._tables[name] = table

    def states(self) -> dict[str, ListenerState | None]:
        """Each listener's published state; None while it is not up."""
        result: dict[str, ListenerState | None] = {}
        for name in self.names:
            table = self._tables.get(name)
            result[name] = table.get(STATE_ROW) if table is not None and table.alive else None
        return result

    def ready(self) -> bool:
        if not self.routes_agent and not self.allow_no_listeners:
            return False
        return all(state is not None and state.state == RUNNING for state in self.states().values())
