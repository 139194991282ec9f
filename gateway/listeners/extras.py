"""What every listener of a node serves beside its configured services, built once per node by
the listeners' tree: the Health service and, where `grpc_reflection` names the listener, server
reflection (grpc_health.py); and the RPC metrics every route is wrapped in (rpc_metrics.py),
which the listener actor applies to what it serves.

    extras = ListenerExtras.of(ctx)
    routes = extras.add_routes(spec, resolve_routes(spec, handlers))   # before the peer gate
"""

from __future__ import annotations

from collections.abc import Collection

import attrs

from gateway.config.context import NodeContext
from gateway.config.keys.listeners import GRPC_LISTENERS
from gateway.config.keys.node import GRPC_REFLECTION
from gateway.config.listener_spec import ListenerSpec
from gateway.listeners.grpc_health import (
    ServingBoard,
    health_routes,
    reflection_routes,
    warn_unknown_reflection,
)
from gateway.listeners.rpc_metrics import ServerRpcMetrics, server_rpc_metrics
from gateway.listeners.server import Routes

__all__ = ["ListenerExtras"]


@attrs.frozen(eq=False)
class ListenerExtras:
    board: ServingBoard
    metrics: ServerRpcMetrics
    reflection: frozenset[str]

    @classmethod
    def of(cls, ctx: NodeContext) -> ListenerExtras:
        reflection = ctx.config[GRPC_REFLECTION]
        warn_unknown_reflection(reflection, ctx.config[GRPC_LISTENERS])
        return cls(ServingBoard(ctx.readiness), server_rpc_metrics(ctx.registry), reflection)

    def add_routes(self, spec: ListenerSpec, routes: Collection[Routes]) -> tuple[Routes, ...]:
        """`routes`, Health, and reflection when the listener is named in grpc_reflection."""
        extra = (health_routes(spec, self.board),)
        if spec.name in self.reflection:
            extra += reflection_routes(spec)
        return (*routes, *extra)
