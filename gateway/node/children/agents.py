"""agent_sup's child spec."""

from __future__ import annotations

from actors.agents.sup import agent_sup_child_spec
from gateway.config.context import NodeContext
from supervisors.supervisor import ChildSpec


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    # One owner per agent session, started by the Subscribe handlers.
    return (agent_sup_child_spec(ctx),)
