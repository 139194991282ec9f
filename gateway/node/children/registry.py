"""The registry's child spec."""

from __future__ import annotations

from actors.registry.actor import registry_child_spec
from gateway.config.context import NodeContext
from supervisors.supervisor import ChildSpec


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    return (registry_child_spec(ctx),)
