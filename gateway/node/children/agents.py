"""agent_sup's child spec and its Args from the Config."""

from __future__ import annotations

from actors.agents.api import AGENT_SUP_NAME
from actors.agents.sup import AgentSup, AgentSupArgs
from gateway.config.context import NodeContext
from gateway.config.keys.sessions import AGENT_RESTART_INTENSITY, AGENT_RESTART_PERIOD_S
from supervisors.supervisor import ChildSpec


def agent_sup_args(ctx: NodeContext) -> AgentSupArgs:
    config = ctx.config
    return AgentSupArgs(
        intensity=config[AGENT_RESTART_INTENSITY],
        period_s=float(config[AGENT_RESTART_PERIOD_S]),
        registry=ctx.registry,
    )


def agent_sup_child_spec(ctx: NodeContext) -> ChildSpec:
    """agent_sup under `gateway_sup`: permanent, registered as `agent_sup` (the Subscribe handler
    finds it by name)."""
    return ChildSpec(
        AGENT_SUP_NAME,
        AgentSup,
        agent_sup_args(ctx),
        restart="permanent",
        type="supervisor",
        name=AGENT_SUP_NAME,
    )


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    # One owner per agent session, started by the Subscribe handlers.
    return (agent_sup_child_spec(ctx),)
