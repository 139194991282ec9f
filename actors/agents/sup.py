"""`agent_sup`: the supervisor of the agent owners (the Erlang gateway's yuzu_gw_agent_sup).

simple_one_for_one with `AgentOwner` as the template: the Subscribe handler starts one owner per
session with `start_child(agent_sup, OwnerArgs(...))`. Owners are transient, so one that ends
normally (the agent went away, a refused registration) or is shut down (a planned stop) is not
restarted, and one that crashes is (seed: "When an agent's owner process crashes", step 1).

The restart intensity is shared by every owner: `agent_restart_intensity` (2000) restarts in
`agent_restart_period_s` (10 s). Past it the fault is the gateway's, not one agent's: agent_sup
stops every owner (each sends its DISCONNECTED and closes its stream) and ends with
`reached_max_restart_intensity`; `gateway_sup` then starts a new one (step 5), which starts an
owner for every orphaned session: a row of the owner table (owned by the root, so it outlives
agent_sup) whose owner is dead. That owner is a restart like any other: it sends the
DISCONNECTED and recovers the session if its stream is still open (docs/owner-recovery.md).

It also installs `yuzu_gw_agent_owner_restarts_total` for its runtime (actors/agents/metrics.py).
"""

from __future__ import annotations

from typing import Any

import attrs

from actors.agents.api import OWNERS_TABLE, OwnerArgs, OwnerRow
from actors.agents.metrics import install_owner_metrics
from actors.agents.owner import AgentOwner
from gateway.config import Config
from gateway.config.context import NodeContext
from gateway.config.keys.sessions import AGENT_RESTART_INTENSITY, AGENT_RESTART_PERIOD_S
from supervisors.errors import TableGone
from supervisors.supervisor import ChildSpec, Supervisor, SupFlags, SupSpec

__all__ = [
    "AGENT_SUP_NAME",
    "OWNER_SHUTDOWN_S",
    "AgentSup",
    "AgentSupArgs",
    "agent_sup_child_spec",
]

AGENT_SUP_NAME = "agent_sup"
# An owner settles in `terminate` without waiting for anything, so this is only the bound on a
# stop that goes wrong; OTP's default for a worker.
OWNER_SHUTDOWN_S = 5.0


@attrs.frozen
class AgentSupArgs:
    intensity: int = AGENT_RESTART_INTENSITY.default_value
    period_s: float = float(AGENT_RESTART_PERIOD_S.default_value)
    shutdown_s: float = OWNER_SHUTDOWN_S

    @classmethod
    def from_config(cls, config: Config) -> AgentSupArgs:
        return cls(
            intensity=config[AGENT_RESTART_INTENSITY],
            period_s=float(config[AGENT_RESTART_PERIOD_S]),
        )


class AgentSup(Supervisor):
    """`args`: the node's `NodeContext` (the intensity is read from its configuration here, at
    every start of agent_sup), or `AgentSupArgs` (tests), or None for the defaults."""

    def init(self, args: Any) -> None:
        super().init(args)
        if isinstance(args, NodeContext):
            install_owner_metrics(self.runtime, args.registry)
        for owner_args in self._orphans():
            self._start_child(owner_args)

    def _orphans(self) -> list[OwnerArgs]:
        """The start arguments of every session whose owner is dead (none at a first start)."""
        table = self.runtime.table(OWNERS_TABLE)
        if table is None:
            return []
        try:
            rows = list(table.values())
        except TableGone:
            return []
        return [
            row.args
            for row in rows
            if isinstance(row, OwnerRow)
            and row.args is not None
            and not self.runtime.is_alive(row.owner)
        ]

    def supervisor_spec(self, args: Any) -> SupSpec:
        if isinstance(args, NodeContext):
            spec = AgentSupArgs.from_config(args.config)
        elif isinstance(args, AgentSupArgs):
            spec = args
        else:
            spec = AgentSupArgs()
        return SupSpec(
            SupFlags("simple_one_for_one", spec.intensity, spec.period_s),
            (ChildSpec("agent", AgentOwner, restart="transient", shutdown=spec.shutdown_s),),
        )


def agent_sup_child_spec(ctx: NodeContext) -> ChildSpec:
    """agent_sup under `gateway_sup`: permanent, registered as `agent_sup` (the Subscribe handler
    finds it by name)."""
    return ChildSpec(
        AGENT_SUP_NAME,
        AgentSup,
        ctx,
        restart="permanent",
        type="supervisor",
        name=AGENT_SUP_NAME,
    )
