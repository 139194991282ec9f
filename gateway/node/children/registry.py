"""The registry's child spec."""

from __future__ import annotations

from actors.core.reservations import SlotPolicy
from actors.registry.actor import Registry, RegistryArgs
from actors.registry.api import REGISTRY_NAME
from gateway.config.context import NodeContext
from gateway.config.keys.sessions import MAX_SESSIONS_PER_CONNECTION
from supervisors.supervisor import ChildSpec


def registry_child_spec(ctx: NodeContext) -> ChildSpec:
    """The registry under `gateway_sup`: permanent, registered as `registry`. The cap is read
    here, once, so a change needs a restart (seed: "read once, when the registry process
    starts")."""
    args = RegistryArgs(
        slots=SlotPolicy(max_sessions_per_connection=ctx.config[MAX_SESSIONS_PER_CONNECTION]),
        readiness=ctx.readiness,
    )
    return ChildSpec(REGISTRY_NAME, Registry, args, restart="permanent", name=REGISTRY_NAME)


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    return (registry_child_spec(ctx),)
