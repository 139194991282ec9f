"""The router's child spec."""

from __future__ import annotations

from actors.router.actor import router_child_spec
from gateway.config.context import NodeContext
from supervisors.supervisor import ChildSpec


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    # Fans SendCommand out to the owners (seed: "Subscribe Stream Proxy").
    return (router_child_spec(ctx),)
