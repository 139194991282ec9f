"""`agent_sup`: the supervisor of the agent owners (the Erlang gateway's yuzu_gw_agent_sup).

simple_one_for_one with `AgentOwner` as the template: the Subscribe handler starts one owner per
session with `start_child(agent_sup, OwnerArgs(...))`. Owners are transient, so one that ends
normally (the agent went away, a refused registration) or is shut down (a planned stop) is not
restarted, and one that crashes is (seed: "When an agent's owner process crashes", step 1).

The restart intensity is shared by every owner: `agent_restart_intensity` (2000) restarts in
`agent_restart_period_s` (10 s), read from the Config into `AgentSupArgs` by
gateway/node/children/agents.py. Past it the fault is the gateway's, not one agent's: agent_sup
stops every owner (each sends its DISCONNECTED and closes its stream) and ends with
`reached_max_restart_intensity`; `gateway_sup` then starts a new one (step 5), which starts an
owner for every orphaned session: a row of the owner table (owned by the root, so it outlives
agent_sup) whose owner is dead. That owner is a restart like any other: it sends the
DISCONNECTED and recovers the session if its stream is still open (docs/owner-recovery.md).

It also installs `yuzu_gw_agent_owner_restarts_total` for its runtime (actors/agents/metrics.py)
when its Args carry the node's metric registry.
"""

from __future__ import annotations

from typing import Final

import attrs
from prometheus_client import CollectorRegistry

from actors.agents.api import OWNERS_TABLE, OwnerArgs, OwnerRow
from actors.agents.metrics import install_owner_metrics
from actors.agents.owner import AgentOwner
from supervisors.errors import TableGone
from supervisors.supervisor import ChildSpec, Supervisor, SupFlags, SupSpec

__all__ = ["OWNER_SHUTDOWN", "AgentSup", "AgentSupArgs"]

# No bound on an owner's stop. An owner does not trap exits (the runtime ends it right after
# delivering its ActorExitRequest) and settles in `terminate` without waiting for anything, so a
# bound could only time its turn in the queue while agent_sup stops every owner at once on one
# loop: about 0.5 ms a session with its stream's trailers on two cores, past OTP's 5 s at 10,000,
# and an owner killed there sends no DISCONNECTED. The planned stop bounds the step (step 3).
OWNER_SHUTDOWN: Final = "infinity"


@attrs.frozen
class AgentSupArgs:
    intensity: int
    period_s: float
    # Where the owners' restart outcomes are counted; None in tests that do not count them.
    registry: CollectorRegistry | None = attrs.field(default=None, eq=False)


class AgentSup(Supervisor):
    def init(self, args: AgentSupArgs) -> None:
        super().init(args)
        if args.registry is not None:
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

    def supervisor_spec(self, args: AgentSupArgs) -> SupSpec:
        return SupSpec(
            SupFlags("simple_one_for_one", args.intensity, args.period_s),
            (ChildSpec("agent", AgentOwner, restart="transient", shutdown=OWNER_SHUTDOWN),),
        )
