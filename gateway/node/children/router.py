"""The router's child spec."""

from __future__ import annotations

from actors.router.actor import Router, RouterArgs
from actors.router.api import ROUTER_NAME
from gateway.config.context import NodeContext
from gateway.config.keys.router import DEFAULT_COMMAND_TIMEOUT_S
from supervisors.supervisor import ChildSpec


def router_child_spec(ctx: NodeContext) -> ChildSpec:
    """The router under `gateway_sup`: permanent, registered as `router`."""
    config = ctx.config
    args = RouterArgs(lambda: config.value_of(DEFAULT_COMMAND_TIMEOUT_S.name))
    return ChildSpec(ROUTER_NAME, Router, args, restart="permanent", name=ROUTER_NAME)


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    # Fans SendCommand out to the owners (seed: "Subscribe Stream Proxy").
    return (router_child_spec(ctx),)
