"""The release supervisor: one small process that runs the N nodes of a host.

`rel/yuzu_gw start --nodes N` (detached) and `foreground --nodes N` run it. It starts each
node as `python -m gateway` with its index (gateway/release/plan.py), restarts a node that
ended as `RestartPolicy` decides while the others keep serving, turns SIGTERM or SIGINT into
the planned stop of every node (SIGTERM each, wait within the stop timeout, SIGKILL what is
left), and exits when every node has stopped. It keeps `nodes.json` up to date.

Exit statuses: 0 every node stopped cleanly; 1 the release could not start, or every node
ended with none to restart (a refused boot, say); 2 restart intensity reached (the others
were stopped); 6 a planned stop in which a node exited non-zero or was killed at the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import attrs

from gateway.release import runfile
from gateway.release.plan import NodePlan, node_env
from gateway.release.restart_policy import GiveUp, Leave, Restart, RestartPolicy
from gateway.release.runfile import NodeRecord, NodeState, ReleaseRecord

log = logging.getLogger("yuzu_gw.release")

EXIT_STOPPED = 0
EXIT_FAILED = 1
EXIT_GAVE_UP = 2
EXIT_UNCLEAN = 6


class Logs(enum.Enum):
    FILES = "files"  # each node's output appended to <run_dir>/<short>.log (start)
    INHERIT = "inherit"  # the supervisor's own stderr (foreground: journald, docker logs)


@attrs.frozen
class Exited:
    index: int
    pid: int
    status: int


@attrs.frozen
class RestartDue:
    index: int


@attrs.frozen
class StopRequested:
    pass


Event = Exited | RestartDue | StopRequested


def describe(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


class ReleaseSupervisor:
    def __init__(
        self,
        plans: tuple[NodePlan, ...],
        env: Mapping[str, str],
        run_dir: Path,
        *,
        logs: Logs,
        stop_timeout_s: float,
        policy: RestartPolicy | None = None,
        python: str = sys.executable,
    ) -> None:
        self.plans = {plan.index: plan for plan in plans}
        self.env = env
        self.run_dir = run_dir
        self.logs = logs
        self.stop_timeout_s = stop_timeout_s
        self.policy = policy or RestartPolicy()
        self.python = python
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._pending: dict[int, asyncio.TimerHandle] = {}
        self._watchers: set[asyncio.Task[None]] = set()
        self._clean: dict[int, bool] = {}
        self._records = {
            plan.index: NodeRecord(
                plan.index,
                plan.name,
                plan.short_name,
                plan.health_port,
                plan.prometheus_port,
                plan.cluster_port,
                NodeState.RUNNING,
            )
            for plan in plans
        }

    def request_stop(self) -> None:
        """The planned stop of every node (what SIGTERM and SIGINT do)."""
        self._events.put_nowait(StopRequested())

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.request_stop)
        try:
            for plan in self.plans.values():
                await self._spawn(plan)
            return await self._supervise()
        except asyncio.CancelledError:
            # Cancelled from outside (the loop closing): no time left for a planned stop.
            for proc in self._procs.values():
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            raise
        except Exception:
            # A bug here must not leave the nodes unsupervised: stop them in order.
            await self._stop_all()
            raise
        finally:
            runfile.remove(self.run_dir)

    # -- the loop --------------------------------------------------------------------------

    async def _supervise(self) -> int:
        loop = asyncio.get_running_loop()
        while True:
            event = await self._events.get()
            if isinstance(event, StopRequested):
                log.info("planned stop of %d node(s)", len(self._procs))
                return await self._stop_all()
            if isinstance(event, RestartDue):
                self._pending.pop(event.index, None)
                await self._spawn(self.plans[event.index])
                continue
            if self._procs.get(event.index) is None or self._procs[event.index].pid != event.pid:
                continue
            del self._procs[event.index]
            plan = self.plans[event.index]
            decision = self.policy.exited(event.index, event.status, loop.time())
            if isinstance(decision, GiveUp):
                log.critical(
                    "node %s (pid %d) %s; restart intensity reached (%s): stopping every node",
                    plan.name,
                    event.pid,
                    describe(event.status),
                    decision.reason,
                )
                await self._stop_all()
                return EXIT_GAVE_UP
            if isinstance(decision, Restart):
                log.warning(
                    "node %s (pid %d) %s; restarting it in %.1f s (attempt %d)",
                    plan.name,
                    event.pid,
                    describe(event.status),
                    decision.delay_s,
                    decision.attempt,
                )
                self._pending[event.index] = loop.call_later(
                    decision.delay_s, self._events.put_nowait, RestartDue(event.index)
                )
                record = self._records[event.index]
                self._update(
                    attrs.evolve(record, state=NodeState.RESTARTING, restarts=record.restarts + 1)
                )
                continue
            self._left(decision, plan, event)
            if not self._procs and not self._pending:
                log.info("every node has ended")
                return EXIT_STOPPED if all(self._clean.values()) else EXIT_FAILED

    def _left(self, decision: Leave, plan: NodePlan, event: Exited) -> None:
        refused = decision.reason != "stopped"
        self._clean[plan.index] = not refused
        level = logging.ERROR if refused else logging.INFO
        log.log(
            level,
            "node %s (pid %d) %s: %s, not restarted",
            plan.name,
            event.pid,
            describe(event.status),
            decision.reason,
        )
        state = NodeState.REFUSED if refused else NodeState.STOPPED
        self._update(attrs.evolve(self._records[plan.index], state=state))

    # -- the nodes -------------------------------------------------------------------------

    async def _spawn(self, plan: NodePlan) -> None:
        loop = asyncio.get_running_loop()
        output = None
        if self.logs is Logs.FILES:
            output = (self.run_dir / f"{plan.short_name}.log").open("ab")
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            output.write(f"--- start {stamp}\n".encode())
            output.flush()
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                "gateway",
                env=node_env(self.env, plan.index, len(self.plans)),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT if output is not None else None,
            )
        finally:
            if output is not None:
                output.close()
        self.policy.started(plan.index, loop.time())
        self._procs[plan.index] = proc
        watcher = loop.create_task(self._watch(plan.index, proc))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        self._update(attrs.evolve(self._records[plan.index], state=NodeState.RUNNING, pid=proc.pid))
        log.info("node %s started (pid %d)", plan.name, proc.pid)

    async def _watch(self, index: int, proc: asyncio.subprocess.Process) -> None:
        status = await proc.wait()
        self._events.put_nowait(Exited(index, proc.pid, status))

    async def _stop_all(self) -> int:
        """The planned stop of every node still running: SIGTERM, wait, SIGKILL at the end."""
        for handle in self._pending.values():
            handle.cancel()
        self._pending.clear()
        clean = True
        for index, proc in self._procs.items():
            self._update(attrs.evolve(self._records[index], state=NodeState.STOPPING))
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stop_timeout_s
        while self._procs:
            try:
                event = await asyncio.wait_for(self._events.get(), deadline - loop.time())
            except TimeoutError:
                break
            if not isinstance(event, Exited) or event.index not in self._procs:
                continue
            del self._procs[event.index]
            plan = self.plans[event.index]
            if event.status == 0:
                log.info("node %s stopped", plan.name)
            else:
                clean = False
                log.error(
                    "node %s (pid %d) %s while stopping",
                    plan.name,
                    event.pid,
                    describe(event.status),
                )
            self._update(attrs.evolve(self._records[event.index], state=NodeState.STOPPED))
        for index, proc in self._procs.items():
            clean = False
            log.error(
                "node %s (pid %d) still running %g s after SIGTERM: killed",
                self.plans[index].name,
                proc.pid,
                self.stop_timeout_s,
            )
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        self._procs.clear()
        return EXIT_STOPPED if clean else EXIT_UNCLEAN

    def _update(self, record: NodeRecord) -> None:
        self._records[record.index] = record
        nodes = tuple(self._records[index] for index in sorted(self._records))
        runfile.write(self.run_dir, ReleaseRecord(supervisor_pid=os.getpid(), nodes=nodes))
