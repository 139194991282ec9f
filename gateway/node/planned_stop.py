"""The planned stop's drain (the Erlang gateway's yuzu_gw_app:prep_stop/1; seed: "Planned stop",
"Stop timeout coupling"; docs/planned-stop.md).

`Node.stop` runs `PlannedStop.run` before the tree stops, within `shutdown_flush_budget_ms`:

1. the regulator refuses every permit (`StopAdmitting`: proxied Register and inventory answer
   UNAVAILABLE with a retry hint, no replay runs, no recovered session is presented again) and
   the upstream actor starts no replay; the held-notification cap is raised by twice the
   sessions held (`RaiseNotifyCap`), so every session's DISCONNECTED fits;
2. the memory shedder and mem_reclaim are stopped (nothing resumes the listeners after this, and
   no reclaim pass's full collection holds the loop while the owners stop: the process ends
   after the drain, so memory given back now is of no use), then every agent
   listener is suspended (`Suspend`: the listen socket closes, established connections stay)
   and drained (`Drain`: each connection gets a graceful HTTP/2 GOAWAY, NO_ERROR, whose debug
   data says `draining` and a retry time drawn per connection from the stopping hint's range;
   its open Subscribe runs on, new streams on it are refused); the router takes no more
   commands and those in flight get up to 3 s or 30% of the budget, whichever is less
   (`StopRouting`);
3. every session is ended through its own owner: `agent_sup` is stopped, each owner sends its
   DISCONNECTED (stream home id from its row) and ends its agent's Subscribe UNAVAILABLE with a
   jittered `grpc-retry-pushback-ms`; up to 5 s or 40% of the budget, whichever is less;
4. the heartbeat buffer is stopped, which flushes it (its own shutdown flush, at most 5 s);
5. every held notification is sent, 64 at a time whatever the breaker says, until none is left
   or the budget ends (`FlushNotifications`); the rest is counted
   `yuzu_gw_upstream_notify_lost_total{reason="shutdown"}` and named in one WARN by the store.

Then `Node.stop` stops the tree in reverse start order: the listeners first (GOAWAY, then close),
`/metrics` last. Each step is bounded; a step that cannot finish in time is left behind with
one line and the next one runs, so the stop ends within the budget.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final

from actors.agents.api import AGENT_SUP_NAME, OWNERS_TABLE
from actors.heartbeat.api import NAME as HEARTBEAT_BUFFER
from actors.memory.api import RECLAIM_NAME as MEM_RECLAIM
from actors.memory.api import SHEDDER_NAME as MEMORY_SHEDDER
from actors.node.api import RoutingStopped, StopAdmitting, StopRouting
from actors.router.api import ROUTER_NAME
from actors.upstream.api import REGULATOR_NAME as REGULATOR
from actors.upstream.api import UPSTREAM_NAME as UPSTREAM
from actors.upstream.notify import FlushDone, FlushNotifications, RaiseNotifyCap
from gateway.config.keys.listeners import GRPC_LISTENERS
from gateway.listeners.listener_actor import Drain, Suspend, actor_name
from gateway.listeners.protocol import DRAINING
from gateway.listeners.retry_hint import STOPPING_HINT_MS
from supervisors.api import SupervisorError, terminate_child
from supervisors.errors import TableGone

if TYPE_CHECKING:
    from gateway.config.context import NodeContext
    from supervisors.address import Address
    from supervisors.runtime import LoopSystemBase

__all__ = [
    "ROUTER_GRACE_MAX_S",
    "ROUTER_GRACE_SHARE",
    "SESSIONS_MAX_S",
    "SESSIONS_SHARE",
    "PlannedStop",
]

log = logging.getLogger("yuzu_gw.node")

# Seed, "Planned stop" step 2: in-flight commands get up to 3 s or 30% of the budget.
ROUTER_GRACE_MAX_S: Final = 3.0
ROUTER_GRACE_SHARE: Final = 0.30
# Seed, step 3: the owners get up to 5 s or 40% of the budget to end their sessions.
SESSIONS_MAX_S: Final = 5.0
SESSIONS_SHARE: Final = 0.40
# Seed, step 1: the held-notification cap is raised by twice the sessions held.
CAP_PER_SESSION: Final = 2
# A message to a local actor that answers at once (a listener's Suspend or Drain).
_ASK_S: Final = 1.0
# The flush ends this much before the budget, so its answer arrives inside Node.stop's own bound.
FLUSH_MARGIN_S: Final = 0.1
STEP_LATE_LINE: Final = "Planned stop: %s did not finish in time; going on"


class PlannedStop:
    def __init__(self, ctx: NodeContext, runtime: LoopSystemBase, root: Address) -> None:
        self.ctx = ctx
        self.runtime = runtime
        self.root = root

    async def run(self, budget_s: float) -> None:
        loop = self.runtime.loop
        deadline = loop.time() + budget_s
        self._refuse_new_work()
        await self._terminate(MEMORY_SHEDDER, _ASK_S)
        await self._terminate(MEM_RECLAIM, _ASK_S)
        await self._suspend_listeners()
        await self._stop_routing(min(ROUTER_GRACE_MAX_S, ROUTER_GRACE_SHARE * budget_s))
        await self._terminate(AGENT_SUP_NAME, min(SESSIONS_MAX_S, SESSIONS_SHARE * budget_s))
        await self._terminate(HEARTBEAT_BUFFER, max(0.0, deadline - loop.time()))
        await self._flush_notifications(max(0.0, deadline - loop.time() - FLUSH_MARGIN_S))

    # -- the steps --

    def _refuse_new_work(self) -> None:
        for name in (REGULATOR, UPSTREAM):
            self._tell(name, StopAdmitting())
        held = self._sessions_held()
        if held:
            self._tell(UPSTREAM, RaiseNotifyCap(CAP_PER_SESSION * held))

    async def _suspend_listeners(self) -> None:
        names = [spec.name for spec in self.ctx.config[GRPC_LISTENERS] if spec.serves_agent]
        await asyncio.gather(*(self._suspend_and_drain(actor_name(name)) for name in names))

    async def _suspend_and_drain(self, listener: str) -> None:
        await self._ask(listener, Suspend(), _ASK_S)
        # The GOAWAY goes before the sessions end (step 3), so an agent learns the connection
        # is going while its Subscribe still runs; its retry time has the streams' hint range.
        await self._ask(listener, Drain(DRAINING, STOPPING_HINT_MS), _ASK_S)

    async def _stop_routing(self, grace_s: float) -> None:
        answer = await self._ask(ROUTER_NAME, StopRouting(grace_s), grace_s + _ASK_S)
        if isinstance(answer, RoutingStopped) and answer.in_flight:
            log.info(
                "Planned stop: %d command(s) still in flight after the grace", answer.in_flight
            )

    async def _flush_notifications(self, budget_s: float) -> None:
        answer = await self._ask(UPSTREAM, FlushNotifications(budget_s), budget_s + _ASK_S)
        if isinstance(answer, FlushDone):
            log.info("Planned stop: %d stream-status notification(s) flushed", answer.sent)

    # -- helpers --

    def _sessions_held(self) -> int:
        table = self.runtime.table(OWNERS_TABLE)
        try:
            return 0 if table is None else len(table)
        except TableGone:
            return 0

    def _tell(self, name: str, msg: Any) -> None:
        address = self.runtime.whereis(name)
        if address is not None:
            self.runtime.tell(address, msg)

    async def _ask(self, name: str, msg: Any, timeout: float) -> Any:
        address = self.runtime.whereis(name)
        if address is None:
            return None  # not running (restarting, or never started): nothing to drain there
        try:
            return await self.runtime.ask(address, msg, timeout)
        except TimeoutError:
            log.warning(STEP_LATE_LINE, name)
        except Exception as exc:  # it ended under the ask: the class only
            log.info("Planned stop: %s did not answer (%s)", name, type(exc).__name__)
        return None

    async def _terminate(self, child: str, timeout: float) -> None:
        """Stop one child of the root now (it is not restarted, and the tree's stop skips it)."""
        if self.runtime.whereis(child) is None:
            return
        try:
            await terminate_child(self.runtime, self.root, child, timeout=max(timeout, 0.001))
        except TimeoutError:
            log.warning(STEP_LATE_LINE, child)
        except SupervisorError as exc:
            log.info("Planned stop: %s not stopped (%s)", child, exc)
