"""`memory_shedder`: the actor around the shedder core (actors/core/shedder_marks.py).

Every `interval_ms` it samples the memory in use (`ShedderArgs.read_memory`: RssAnon, read by
gateway/node/memory_reader.py) and gives it to the core, then brings each agent listener to the
state the core wants: `Suspend` while shedding, `Resume` otherwise (actors/listeners/api.py).
RssAnon falls with memory in use only once a collection and malloc_trim give back what Python
freed: `mem_reclaim` runs those passes while the row published here says shedding.
Seed, "Node-wide memory load shedding", "What a new agent connection sees while shedding", "When
a suspend or resume fails"; SPEC_INDEX MS-01..MS-10.

- Only agent listeners are moved: a listener that serves the management service is never
  suspended, even one that serves both (the operator plane must stay reachable;
  gateway/node/children/memory.py picks them).
- A listener's state is read from its published table (no message); a command goes out as a
  worker asking the listener actor, at most one in flight per listener, and its answer (or its
  timeout) goes back to the core, which owns the retry log lines and the failure counts.
- The marks were resolved at boot (gateway/config/keys/shedder.py): the start-up line names the
  limit, where it came from, and both marks. Disabled, no agent listener, the limit unknown with
  a fractional mark, or no memory sample on this platform: one line, no timer, the gauges at 0
  but `inactive` (1 for the last two).
- A restarted shedder that finds an agent listener suspended treats the node as shedding and
  resumes it once memory is at or below the low-water mark.
- The `memory_shedding` readiness check reads the row this actor publishes in its table
  `memory_shedder` (no message; actors/memory/api.py): not ready while shedding. While shedding
  the `listeners` check is false too (a suspended listener does not read as running), and it
  stays false until a listener whose resume failed is running again.

A planned stop must end this actor before it suspends the agent listeners (issue 7 §2), or the
next tick would resume them: it is a child after the listeners, and the stop's first step is
`terminate_child(runtime, root, SHEDDER_NAME)`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from prometheus_client import CollectorRegistry
from thespian.actors import WakeupMessage

from actors.core.shedder_marks import (
    FAILURE_LOG_INTERVAL_S,
    RESUME,
    SUSPEND,
    SUSPENDED,
    Action,
    Command,
    Effect,
    Shedder,
)
from actors.core.warn_limit import WarnLimiter
from actors.effects import carry_out
from actors.listeners.api import STATE_ROW, ListenerState, Resume, Suspend, actor_name, table_name
from actors.memory.api import (
    READINESS_CHECK,
    SHEDDER_LOGGER,
    SHEDDER_NAME,
    SHEDDING_ROW,
    SheddingPlan,
    shedding_now,
)
from actors.memory.metrics import ShedderMetrics, shedder_metrics
from actors.node.api import Readiness
from supervisors.errors import TableGone
from supervisors.messages import WorkerDone
from supervisors.process import Process

if TYPE_CHECKING:
    from supervisors.address import Address
    from supervisors.runtime import LoopSystemBase

__all__ = ["MemoryShedder", "ShedderArgs"]

log = logging.getLogger(SHEDDER_LOGGER)

_TICK = "memory_shedder_tick"
# A listener answers Suspend and Resume at once (it closes or binds a socket); this only bounds a
# listener that is stuck, so its command counts as failed and is asked again.
ASK_TIMEOUT_S = 5.0


@attrs.frozen(eq=False)
class ShedderArgs:
    """What the shedder starts with: the `memory_shedding` settings and the plan the boot check
    resolved, built by gateway/node/children/memory.py."""

    enabled: bool
    interval_ms: int
    # The agent listeners it moves (none serving the management service).
    listeners: tuple[str, ...]
    # None when it is not needed: shedding disabled, or no agent listener to shed.
    plan: SheddingPlan | None
    # Bytes of memory in use now, or None when they cannot be read.
    read_memory: Callable[[], int | None]
    registry: CollectorRegistry
    readiness: Readiness


@attrs.frozen
class _Transition:
    """The tag of the worker asking `listener` to `action`."""

    listener: str
    action: Action


def install_readiness(readiness: Readiness, runtime: LoopSystemBase) -> None:
    """Register the check once per node (a restarted shedder finds it there already)."""
    if READINESS_CHECK not in readiness.names():
        readiness.register(READINESS_CHECK, lambda: not shedding_now(runtime))


def _why(error: BaseException) -> str:
    return "timeout" if isinstance(error, TimeoutError) else "listener_down"


class MemoryShedder(Process):
    def init(self, args: ShedderArgs) -> None:
        self.metrics: ShedderMetrics = shedder_metrics(args.registry)
        self.table = self.new_table(SHEDDER_NAME)
        self.listeners = args.listeners
        self.read_memory = args.read_memory
        self.in_flight: set[str] = set()
        self.sample_warnings = WarnLimiter(FAILURE_LOG_INTERVAL_S)
        install_readiness(args.readiness, self.runtime)
        self.core = self._start(args)
        self._publish()
        if self.core is not None:
            self.wakeupAfter(self.core.interval_ms / 1000, _TICK)

    def _start(self, settings: ShedderArgs) -> Shedder | None:
        """The core, or None (after its one line) when shedding cannot or need not run."""
        if not settings.enabled:
            log.info("gateway memory shedding is disabled (memory_shedding enabled => false)")
            self.metrics.not_running(inactive=False)
            return None
        if not self.listeners:
            log.info("gateway memory shedding has no agent listener to shed")
            self.metrics.not_running(inactive=False)
            return None
        plan = settings.plan
        if plan is None or plan.marks is None:
            return self._inactive("memory_limit_unknown")
        if self.read_memory() is None:
            return self._inactive("memory_sample_unavailable")
        high, low = plan.marks.high, plan.marks.low
        found = [name for name in self.listeners if self._state_of(name) == SUSPENDED]
        core = Shedder(high.bytes, low.bytes, settings.interval_ms, shedding=bool(found))
        limit = (
            "unknown"
            if plan.limit is None
            else f"{plan.limit.limit_bytes} bytes ({plan.limit.source})"
        )
        if plan.nodes > 1:
            limit += f", shared by {plan.nodes} nodes"
        log.info(
            "gateway memory shedding: memory limit %s; high-water mark %s, low-water mark %s;"
            " sampling RssAnon every %d ms; agent listener(s): %s%s",
            limit,
            high.describe(),
            low.describe(),
            settings.interval_ms,
            ", ".join(self.listeners),
            f"; {', '.join(found)} found suspended: treated as shed" if found else "",
        )
        self.metrics.marks(high.bytes, low.bytes)
        self.metrics.inactive.set(0)
        return core

    def _inactive(self, reason: str) -> None:
        log.warning(
            "gateway memory shedding is inactive: %s (set high_water_bytes and low_water_bytes"
            " below the memory the gateway may use; read at start, so restart the gateway;"
            " docs/memory-shedding.md)",
            reason,
        )
        self.metrics.not_running(inactive=True)

    def format_status(self) -> Mapping[str, Any]:
        core = self.core
        return {
            "running": core is not None,
            "shedding": core is not None and core.shedding,
            "agent_listeners": len(self.listeners),
            "in_flight": len(self.in_flight),
            "failing": {a: core.failing(a) for a in (SUSPEND, RESUME)} if core else {},
        }

    # -- messages --

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        match msg:
            case WakeupMessage(payload=payload) if payload == _TICK:
                self._on_tick()
            case WorkerDone(tag=_Transition() as tag):
                self._on_answer(tag, msg)
            case _:
                pass

    def _on_tick(self) -> None:
        core = self.core
        if core is None:
            return
        self.wakeupAfter(core.interval_ms / 1000, _TICK)
        now = self.now()
        used = self.read_memory()
        if used is None:
            suffix = self.sample_warnings.admit("sample", now)
            if suffix is not None:
                log.warning("gateway memory shedding: memory in use could not be read%s", suffix)
        else:
            self._perform(core.sample(used, now))
        states = {name: self._state_of(name) for name in self.listeners}
        self._perform(core.reconcile(states, self.in_flight))
        self._publish()

    def _on_answer(self, tag: _Transition, done: WorkerDone) -> None:
        self.in_flight.discard(tag.listener)
        if self.core is None:
            return
        if done.error is not None:
            state, why = None, _why(done.error)
        elif isinstance(done.result, ListenerState):
            state, why = done.result.state, done.result.error
        else:
            state, why = None, "no_answer"
        self._perform(self.core.result(tag.listener, tag.action, state, why, self.now()))
        self._publish()

    # -- effects and reads --

    def _perform(self, effects: list[Effect]) -> None:
        for effect in effects:
            if carry_out(effect, log, self.metrics):
                continue
            if isinstance(effect, Command):
                self._command(effect.listener, effect.action)

    def _command(self, listener: str, action: Action) -> None:
        address = self.runtime.whereis(actor_name(listener))
        if address is None:
            return  # restarting: its successor's state is read at the next tick
        self.in_flight.add(listener)
        request = Suspend() if action == SUSPEND else Resume()
        self.run_worker(
            self.runtime.ask(address, request, ASK_TIMEOUT_S), _Transition(listener, action)
        )

    def _state_of(self, listener: str) -> str | None:
        table = self.runtime.table(table_name(listener))
        if table is None:
            return None
        try:
            row = table.get(STATE_ROW)
        except TableGone:
            return None
        return row.state if isinstance(row, ListenerState) else None

    def _publish(self) -> None:
        core = self.core
        shedding = core is not None and core.shedding
        self.table.insert(SHEDDING_ROW, shedding)
        if core is not None:
            failing = {action: core.failing(action) for action in (SUSPEND, RESUME)}
            self.metrics.state(active=shedding, failing=failing)
