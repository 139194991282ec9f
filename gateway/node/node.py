"""One gateway node: one OS process, one asyncio loop, one supervision tree.

`start` builds the tree synchronously (a child that fails to start refuses the boot),
`stop` is the planned stop: the prep-stop steps registered by the areas run first within
the budget (seed: "Planned stop"), then the tree stops in reverse start order.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from thespian.actors import ActorSystem

from gateway.config.context import NodeContext
from gateway.config.keys.node import SHUTDOWN_FLUSH_BUDGET_MS
from gateway.config.refusal import BootRefused
from gateway.node import crash_redaction
from gateway.node.loop_monitor import LoopMonitor
from gateway.node.planned_stop import PlannedStop
from gateway.node.sd_notify import SystemdNotify
from gateway.node.task import NodeTask
from gateway.node.tree import GatewaySup
from gateway.node.young_generation import YoungGenerationBound
from supervisors import gc_policy
from supervisors.address import Address
from supervisors.errors import InitFailed
from supervisors.reason import SHUTDOWN, ExitReason
from supervisors.runtime import LoopSystemBase

log = logging.getLogger("yuzu_gw.node")

PrepStop = Callable[[float], Awaitable[None]]


def ready_status(bound: dict[str, tuple[str, int]]) -> str:
    """systemd's STATUS= line at READY=1 (`systemctl status`): what the node serves where."""
    where = ", ".join(f"{name} {host}:{port}" for name, (host, port) in sorted(bound.items()))
    return f"serving {where}" if where else "serving"


class Node:
    def __init__(self, ctx: NodeContext, notify: SystemdNotify | None = None) -> None:
        self.ctx = ctx
        # systemd's READY/STOPPING/WATCHDOG (docs/install.md); silent outside a notify unit.
        self.notify = notify if notify is not None else SystemdNotify()
        self.runtime: LoopSystemBase | None = None
        self.system: ActorSystem | None = None
        self.root: Address | None = None
        self.prep_stop: list[PrepStop] = []
        self._ended: asyncio.Future[ExitReason] | None = None
        # The node's own tasks (the loop monitor, the young generation's bound), in start order.
        self._tasks: tuple[NodeTask, ...] = ()
        self._redaction: crash_redaction.CrashRedaction | None = None

    @property
    def name(self) -> str:
        return self.ctx.node.name

    @property
    def pid_file(self) -> Path:
        return self.ctx.run_dir / f"{self.ctx.node.short_name}.pid"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        runtime = LoopSystemBase(loop)
        self.runtime = runtime
        self.system = ActorSystem(systemBase=runtime, transientUnique=True)
        self._ended = loop.create_future()
        runtime.primary_exit_hooks.append(self._primary_ended)
        # Before the tree starts, so a crash during boot is redacted too (docs/crash-redaction.md).
        self._redaction = redaction = crash_redaction.install(runtime)
        try:
            self.root = self.system.createActor(GatewaySup, self.ctx, "gateway_sup")
        except InitFailed as failed:
            redaction.release(runtime)
            raise BootRefused("start_failed", str(failed.reason)) from None
        # The planned stop's drain (gateway/node/planned_stop.py), first of the prep-stop steps.
        self.prep_stop.insert(0, PlannedStop(self.ctx, runtime, self.root).run)
        self.ctx.run_dir.mkdir(parents=True, exist_ok=True)
        self.pid_file.write_text(f"{os.getpid()}\n")
        # What boot allocated lives as long as the node: keep it out of every future
        # collection (a full collection costs ~0.12 ms per held connection otherwise).
        gc.collect()
        gc.freeze()
        gc_policy.tune()
        monitor = LoopMonitor(
            self.ctx.registry,
            watchdog=self.notify.watchdog,
            watchdog_interval_s=self.notify.watchdog_interval_s,
        )
        self._tasks = (monitor, YoungGenerationBound(self.ctx.registry))
        for task in self._tasks:
            task.start()
        log.info("node %s started (pid %d)", self.name, os.getpid())
        # The tree is up, so every listener has bound (a child that fails refuses the boot).
        self.notify.ready(ready_status(self.ctx.bound))

    def _primary_ended(self, address: Address, reason: ExitReason) -> None:
        if address == self.root and self._ended is not None and not self._ended.done():
            if not reason.is_normal:
                log.critical("node %s: gateway_sup ended: %s", self.name, reason)
            self._ended.set_result(reason)

    async def wait(self) -> ExitReason:
        """Until the tree has ended (a planned stop, or the root giving up)."""
        assert self._ended is not None
        return await asyncio.shield(self._ended)

    async def stop(self) -> ExitReason:
        """The planned stop: prep-stop steps within the budget, then the tree."""
        runtime, root = self.runtime, self.root
        if runtime is None or root is None:
            return SHUTDOWN
        self.notify.stopping()
        await self._stop_tasks()
        budget = self.ctx.config[SHUTDOWN_FLUSH_BUDGET_MS] / 1000
        deadline = runtime.loop.time() + budget
        for step in self.prep_stop:
            remaining = deadline - runtime.loop.time()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(step(remaining), remaining)
            except TimeoutError:
                log.warning("planned stop: a step did not finish within the budget")
        reason = await runtime.stop(root, None)
        self._release(runtime)
        log.info("node %s stopped", self.name)
        return reason

    async def close(self) -> None:
        """After the tree ended on its own (the root gave up): release what `stop` would,
        so no stale pid file says the node still runs."""
        await self._stop_tasks()
        if self.runtime is not None:
            self._release(self.runtime)

    async def _stop_tasks(self) -> None:
        for task in self._tasks:
            await task.stop()

    def _release(self, runtime: LoopSystemBase) -> None:
        self.notify.close()
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()
        if self._redaction is not None:
            self._redaction.release(runtime)
