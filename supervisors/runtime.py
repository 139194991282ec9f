"""A thespian system base that runs every actor on one asyncio event loop.

Theory of operation
-------------------
Each actor has a mailbox (a deque, allocated only while it holds mail) and a flag saying
whether it is on the run queue. `send` appends to the mailbox and, if needed, puts the
actor on the run queue: O(1) whatever the number of actors. The run queue is drained by
one loop callback (`_tick`) that delivers at most `budget_messages` messages or runs for at
most `budget_seconds`, whichever comes first, then gives the loop back so sockets are
served: the analogue of BEAM reductions. An actor gets at most `per_actor` messages per
turn so one flooded mailbox cannot starve the others.

Actors registered under a name (the node's singletons: `upstream`, `registry`, `router`,
`agent_sup`...) are scheduled on a second, priority run queue. When both queues hold actors,
turns alternate between them (a priority actor, an ordinary one, a priority one...). A
node service then waits one ordinary turn per registered actor ahead of it, not a round of
thousands of busy per-agent actors, and ordinary actors still get every other turn. Only
the order in which actors get turns changes: each mailbox is still delivered in arrival
order.

Crash semantics are OTP's, not thespian's retry-then-PoisonMessage: an exception that
escapes `receiveMessage` ends the actor; its children are stopped; its parent gets a
`ChildExited` carrying the reason (class and top frame only); its monitors get
`ActorDown`. Timers are `loop.call_later` handles and worker coroutines are tasks, both
owned by the actor and cancelled when it ends.

Everything here runs on the loop's thread; nothing is thread-safe by design.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from thespian.actors import Actor, ActorExitRequest, WakeupMessage

from supervisors.address import SYSTEM_ADDRESS, Address
from supervisors.errors import ActorExited, InitFailed, NoProc
from supervisors.messages import ActorDown, ChildExited, WorkerDone
from supervisors.reason import KILLED, NOPROC, SHUTDOWN, ExitReason
from supervisors.table import Access, Table

log = logging.getLogger("supervisors.runtime")
crash_log = logging.getLogger("supervisors.crash")

# Per tick: enough messages to amortise the callback, few enough that a flood of 100,000
# messages still lets the loop poll its sockets every couple of milliseconds.
DEFAULT_BUDGET_MESSAGES = 2000
DEFAULT_BUDGET_SECONDS = 0.005
# Per actor per turn: fairness between a flooded mailbox and everyone else.
DEFAULT_PER_ACTOR = 64

DownCallback = Callable[[ExitReason], None]


class ActorRef:
    """The runtime's record of one actor; `instance._myRef` points here (thespian's
    contract for what an Actor calls to send, create and set timers)."""

    __slots__ = (
        "address",
        "children",
        "globalName",
        "instance",
        "kind",
        "mailbox",
        "monitoring",
        "monitors",
        "parent",
        "runq",
        "scheduled",
        "system",
        "tables",
        "timers",
        "trap_exit",
        "workers",
    )

    def __init__(
        self, system: LoopSystemBase, address: Address, parent: ActorRef | None, instance: Actor
    ) -> None:
        self.system = system
        self.address = address
        self.parent = parent
        self.instance: Actor | None = instance
        self.kind = type(instance).__name__
        self.globalName: str | None = None
        self.trap_exit: bool = getattr(instance, "trap_exit", False)
        self.scheduled = False
        # The run queue `send` puts the actor on: the priority one for registered actors.
        self.runq = system._runq
        # Allocated on first use: an idle actor should cost as little as possible.
        self.mailbox: deque[tuple[Any, Address]] | None = None
        self.children: dict[Address, ActorRef] | None = None
        self.monitors: dict[int, Address | DownCallback] | None = None
        self.monitoring: dict[int, Address] | None = None
        self.timers: set[asyncio.TimerHandle] | None = None
        self.workers: set[asyncio.Task[Any]] | None = None
        self.tables: list[Table[Any, Any]] | None = None

    @property
    def alive(self) -> bool:
        return self.system._refs.get(self.address._aaddr) is self

    @property
    def priority(self) -> bool:
        """Scheduled on the priority run queue (a registered actor)."""
        return self.runq is self.system._hiq

    @property
    def label(self) -> str:
        """What logs call this actor: its registered name, else its class."""
        return self.globalName or self.kind

    # -- thespian's ActorRef surface -------------------------------------------------
    def createActor(
        self,
        actorClass: type[Actor],
        targetActorRequirements: Any = None,
        globalName: str | None = None,
        sourceHash: Any = None,
    ) -> Address:
        return self.system.create_actor(self, actorClass, targetActorRequirements, globalName)

    def actor_send(self, target: Address, msg: Any) -> None:
        self.system.send(self.address, target, msg)

    def wakeupAfter(
        self, period: float | datetime.timedelta, payload: Any = None
    ) -> asyncio.TimerHandle:
        return self.system.wakeup_after(self, period, payload)

    def handleDeadLetters(self, address: Address, enable: bool) -> None:
        raise NotImplementedError("dead letters are counted, not delivered, on this base")

    def notifyOnSystemRegistrationChanges(self, address: Address, enable: bool) -> None:
        """A single-node base has no convention to report on."""

    def updateCapability(self, name: str, value: Any = None) -> None:
        self.system.capabilities[name] = value


class LoopSystemBase:
    """The system base: pass it as `ActorSystem(systemBase=..., transientUnique=True)`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        budget_messages: int = DEFAULT_BUDGET_MESSAGES,
        budget_seconds: float = DEFAULT_BUDGET_SECONDS,
        per_actor: int = DEFAULT_PER_ACTOR,
    ) -> None:
        self.loop = loop or asyncio.get_event_loop()
        self.budget_messages = budget_messages
        self.budget_seconds = budget_seconds
        self.per_actor = per_actor
        self.capabilities: dict[str, Any] = {}
        self._refs: dict[int, ActorRef] = {}
        self._primaries: dict[Address, ActorRef] = {}
        self._names: dict[str, Address] = {}
        self._tables: dict[str, Table[Any, Any]] = {}
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        # Callback monitors (asks, stops) by id -> the monitored address, so that
        # `demonitor` after every `ask` is O(1) rather than a scan of every actor.
        self._callback_monitors: dict[int, Address] = {}
        self._ids = itertools.count(1)
        self._monitor_ids = itertools.count(1)
        self._runq: deque[ActorRef] = deque()
        # Registered actors' run queue, and whose turn is next (see the module's docstring).
        self._hiq: deque[ActorRef] = deque()
        self._priority_turn = True
        self._tick_pending = False
        self.current: ActorRef | None = None
        self.dead_letters = 0
        self.ticks = 0
        self.primary_exit_hooks: list[Callable[[Address, ExitReason], None]] = []

    # -- creation --------------------------------------------------------------------
    def newPrimaryActor(
        self,
        actorClass: type[Actor],
        targetActorRequirements: Any,
        globalName: str | None,
        sourceHash: Any = None,
    ) -> Address:
        return self.create_actor(None, actorClass, targetActorRequirements, globalName)

    def create_actor(
        self,
        parent: ActorRef | None,
        cls: type[Actor],
        args: Any = None,
        global_name: str | None = None,
    ) -> Address:
        """Create, register and `init` an actor synchronously (OTP's `start_link`).

        `args` is what thespian calls targetActorRequirements: for a `Process` it is the
        argument of `init`. If `init` raises, the actor never existed and `InitFailed`
        carries the reason to the caller, as `{error, Reason}` does in OTP.
        """
        if global_name is not None and global_name in self._names:
            return self._names[global_name]
        address = Address(next(self._ids))
        instance = cls.__new__(cls)
        ref = ActorRef(self, address, parent, instance)
        instance._myRef = ref
        ref.globalName = global_name
        self._refs[address._aaddr] = ref
        if global_name is not None:
            self._names[global_name] = address
            ref.runq = self._hiq
        if parent is None:
            self._primaries[address] = ref
        else:
            if parent.children is None:
                parent.children = {}
            parent.children[address] = ref
        previous, self.current = self.current, ref
        try:
            instance.__init__()
            init = getattr(instance, "init", None)
            if init is not None:
                init(args)
        except Exception as exc:
            reason = ExitReason.crash(exc)
            self.current = previous
            crash_log.error("init of %s failed: %s", ref.label, reason)
            self._end(ref, reason, notify_parent=False, run_terminate=False)
            raise InitFailed(reason) from None
        finally:
            self.current = previous
            if not ref.alive:  # it ended itself in `init`: see `_release`
                ref.instance = None
        return address

    # -- sending ---------------------------------------------------------------------
    def send(self, sender: Address, target: Address, msg: Any) -> None:
        ref = self._refs.get(target._aaddr)
        if ref is None:
            waiter = self._waiters.pop(target._aaddr, None)
            if waiter is not None:
                if not waiter.done():
                    waiter.set_result(msg)
            else:
                self.dead_letters += 1
            return
        mailbox = ref.mailbox
        if mailbox is None:
            mailbox = ref.mailbox = deque()
        mailbox.append((msg, sender))
        if not ref.scheduled:
            ref.scheduled = True
            ref.runq.append(ref)
            if not self._tick_pending:
                self._tick_pending = True
                self.loop.call_soon(self._tick)

    def tell(self, target: Address, msg: Any) -> None:
        """thespian's `ActorSystem.tell`: send from outside the actor world."""
        self.send(SYSTEM_ADDRESS, target, msg)

    async def ask(self, target: Address, msg: Any, timeout: float | None = None) -> Any:
        """Send `msg` and wait for the first message sent back to the sender address.

        Raises `NoProc` if the target is not alive, `ActorExited` if it ends before it
        answers, and `TimeoutError` after `timeout` seconds.
        """
        ref = self._refs.get(target._aaddr)
        if ref is None:
            raise NoProc(str(target))
        reply_to = Address(next(self._ids))
        future: asyncio.Future[Any] = self.loop.create_future()
        self._waiters[reply_to._aaddr] = future

        def on_down(reason: ExitReason) -> None:
            if not future.done():
                future.set_exception(ActorExited(reason))

        monitor = self.monitor_callback(target, on_down)
        self.send(reply_to, target, msg)
        try:
            # Not wait_for: on 3.11 it swallows a cancellation that lands in the same turn
            # as the answer, and a cancelled caller must stop (and release what it holds).
            async with asyncio.timeout(timeout):
                return await future
        finally:
            self._waiters.pop(reply_to._aaddr, None)
            self.demonitor(monitor)

    def listen(self, timeout: float | None = None) -> Any:
        raise NotImplementedError("use `await ask(...)` on the loop system base")

    # -- the scheduler ---------------------------------------------------------------
    def _tick(self) -> None:
        self._tick_pending = False
        self.ticks += 1
        runq = self._runq
        hiq = self._hiq
        budget = self.budget_messages
        per_actor = self.per_actor
        deadline = self.loop.time() + self.budget_seconds
        delivered = 0
        priority_turn = self._priority_turn
        while delivered < budget:
            # Alternate while both queues hold actors; either alone is drained in turn.
            if hiq and (priority_turn or not runq):
                queue = hiq
                priority_turn = False
            elif runq:
                queue = runq
                priority_turn = True
            else:
                break
            ref = queue.popleft()
            mailbox = ref.mailbox
            turn = 0
            while mailbox and turn < per_actor:
                msg, sender = mailbox.popleft()
                turn += 1
                self._deliver(ref, msg, sender)
                if ref.mailbox is not mailbox:  # the actor ended while handling it
                    ref.instance = None  # kept while its own code ran: see `_release`
                    break
            delivered += turn
            if ref.mailbox is mailbox and mailbox:
                queue.append(ref)
            else:
                ref.scheduled = False
                if ref.mailbox is mailbox:
                    ref.mailbox = None
            if self.loop.time() >= deadline:
                break
        self._priority_turn = priority_turn
        if (runq or hiq) and not self._tick_pending:
            self._tick_pending = True
            self.loop.call_soon(self._tick)

    def _deliver(self, ref: ActorRef, msg: Any, sender: Address) -> None:
        self.current = ref
        try:
            ref.instance.receiveMessage(msg, sender)
        except Exception as exc:
            self.current = None
            self._crash(ref, exc)
            return
        self.current = None
        if isinstance(msg, ActorExitRequest) and not ref.trap_exit and ref.alive:
            self._end(ref, SHUTDOWN)

    def _crash(self, ref: ActorRef, exc: BaseException) -> None:
        reason = ExitReason.crash(exc)
        # Only the label and the reason: never the message, the state or exc's text.
        crash_log.error("actor %s %s crashed: %s", ref.label, ref.address, reason)
        self._end(ref, reason)

    # -- ending ----------------------------------------------------------------------
    def exit_actor(self, address: Address, reason: ExitReason) -> None:
        """End an actor now with `reason` (the actor's own `exit`, or a brutal kill)."""
        ref = self._refs.get(address._aaddr)
        if ref is not None:
            self._end(ref, reason, run_terminate=reason is not KILLED)

    def kill(self, address: Address) -> None:
        """OTP's `exit(Pid, kill)`: ends the actor at once; its `terminate` does not run."""
        self.exit_actor(address, KILLED)

    def _end(
        self,
        ref: ActorRef,
        reason: ExitReason,
        *,
        notify_parent: bool = True,
        run_terminate: bool = True,
    ) -> None:
        if self._refs.get(ref.address._aaddr) is not ref:
            return
        if run_terminate:
            terminate = getattr(ref.instance, "terminate", None)
            if terminate is not None:
                previous, self.current = self.current, ref
                try:
                    terminate(reason)
                except Exception as exc:
                    crash_log.error("terminate of %s raised: %s", ref.label, ExitReason.crash(exc))
                finally:
                    self.current = previous
        del self._refs[ref.address._aaddr]
        ref.mailbox = None
        if ref.children:
            # Reverse start order, as a supervisor would; a dying parent takes its
            # children with it (their links in OTP).
            for child in reversed(list(ref.children.values())):
                self._end(child, SHUTDOWN, notify_parent=False)
            ref.children = None
        self._release(ref)
        self._notify_monitors(ref, reason)
        parent = ref.parent
        if parent is None:
            self._primaries.pop(ref.address, None)
            for hook in list(self.primary_exit_hooks):
                self._run_hook(hook, ref.address, reason)
        else:
            if parent.children is not None:
                parent.children.pop(ref.address, None)
            if notify_parent:
                self.send(SYSTEM_ADDRESS, parent.address, ChildExited(ref.address, reason))

    @staticmethod
    def _run_hook(hook: Callable[..., None], *args: Any) -> None:
        """Run code from outside the actor world (a monitor callback, an exit hook): if it
        raises, the scheduler must go on, and the log gets the class and frame only."""
        try:
            hook(*args)
        except Exception as exc:
            crash_log.error("exit hook raised: %s", ExitReason.crash(exc))

    def _release(self, ref: ActorRef) -> None:
        """Cancel what the actor owned: timers, workers, tables, its name; drop its instance,
        whose `_myRef` points back here, so reference counting frees both (and what the
        actor held) now rather than at the next full collection. An actor ending itself
        keeps it until its handler returns: its code may still read it (the log filter)."""
        if self.current is not ref:
            ref.instance = None
        if ref.timers:
            for handle in ref.timers:
                handle.cancel()
            ref.timers = None
        if ref.workers:
            for task in ref.workers:
                task.cancel()
            ref.workers = None
        if ref.tables:
            for table in ref.tables:
                table.drop()
                self._tables.pop(table.name, None)
            ref.tables = None
        if ref.globalName is not None and self._names.get(ref.globalName) == ref.address:
            del self._names[ref.globalName]

    def _notify_monitors(self, ref: ActorRef, reason: ExitReason) -> None:
        if ref.monitoring:
            for mid, target in ref.monitoring.items():
                target_ref = self._refs.get(target._aaddr)
                if target_ref is not None and target_ref.monitors:
                    target_ref.monitors.pop(mid, None)
            ref.monitoring = None
        if ref.monitors:
            for mid, watcher in ref.monitors.items():
                if isinstance(watcher, Address):
                    watcher_ref = self._refs.get(watcher._aaddr)
                    if watcher_ref is not None and watcher_ref.monitoring:
                        watcher_ref.monitoring.pop(mid, None)
                    self.send(SYSTEM_ADDRESS, watcher, ActorDown(ref.address, reason, mid))
                else:
                    self._callback_monitors.pop(mid, None)
                    self._run_hook(watcher, reason)
            ref.monitors = None

    def shutdown(self) -> None:
        """Stop every actor at once, newest primary first (thespian's `shutdown`)."""
        for ref in reversed(list(self._primaries.values())):
            self._end(ref, SHUTDOWN)

    async def stop(self, address: Address, timeout: float | None) -> ExitReason:
        """Ask an actor to exit (`ActorExitRequest`) and wait for it; kill it after
        `timeout` seconds (OTP's shutdown timeout)."""
        ref = self._refs.get(address._aaddr)
        if ref is None:
            return NOPROC
        ended: asyncio.Future[ExitReason] = self.loop.create_future()
        self.monitor_callback(address, lambda r: ended.done() or ended.set_result(r))
        self.send(SYSTEM_ADDRESS, address, ActorExitRequest())
        try:
            return await asyncio.wait_for(asyncio.shield(ended), timeout)
        except TimeoutError:
            self.kill(address)
            return await ended

    # -- monitors --------------------------------------------------------------------
    def monitor(self, watcher: ActorRef, target: Address) -> int:
        mid = next(self._monitor_ids)
        target_ref = self._refs.get(target._aaddr)
        if target_ref is None:
            self.send(SYSTEM_ADDRESS, watcher.address, ActorDown(target, NOPROC, mid))
            return mid
        if target_ref.monitors is None:
            target_ref.monitors = {}
        target_ref.monitors[mid] = watcher.address
        if watcher.monitoring is None:
            watcher.monitoring = {}
        watcher.monitoring[mid] = target
        return mid

    def monitor_callback(self, target: Address, callback: DownCallback) -> int:
        """Monitor from outside the actor world: `callback(reason)` runs when the target
        ends (at once with `noproc` if it is not alive)."""
        mid = next(self._monitor_ids)
        target_ref = self._refs.get(target._aaddr)
        if target_ref is None:
            callback(NOPROC)
            return mid
        if target_ref.monitors is None:
            target_ref.monitors = {}
        target_ref.monitors[mid] = callback
        self._callback_monitors[mid] = target
        return mid

    def demonitor(self, mid: int, watcher: ActorRef | None = None) -> None:
        target: Address | None = None
        if watcher is not None and watcher.monitoring:
            target = watcher.monitoring.pop(mid, None)
        if target is None:
            # A callback monitor (every `ask` ends with one), or one that already fired.
            target = self._callback_monitors.pop(mid, None)
        if target is not None:
            target_ref = self._refs.get(target._aaddr)
            if target_ref is not None and target_ref.monitors:
                target_ref.monitors.pop(mid, None)

    # -- timers and workers ----------------------------------------------------------
    def wakeup_after(
        self, ref: ActorRef, period: float | datetime.timedelta, payload: Any
    ) -> asyncio.TimerHandle:
        seconds = period.total_seconds() if isinstance(period, datetime.timedelta) else period
        message = WakeupMessage(period, payload)
        handle: asyncio.TimerHandle

        def fire() -> None:
            if ref.timers is not None:
                ref.timers.discard(handle)
            self.send(SYSTEM_ADDRESS, ref.address, message)

        handle = self.loop.call_later(max(0.0, seconds), fire)
        if ref.timers is None:
            ref.timers = set()
        ref.timers.add(handle)
        return handle

    def cancel_wakeup(self, ref: ActorRef, handle: asyncio.TimerHandle) -> None:
        handle.cancel()
        if ref.timers is not None:
            ref.timers.discard(handle)

    def run_worker(self, ref: ActorRef, coro: Coroutine[Any, Any, Any], tag: Any) -> None:
        """Run `coro` for the actor; its result or exception comes back as `WorkerDone`.
        The task belongs to the actor and is cancelled if the actor ends first."""
        task = self.loop.create_task(coro)
        if ref.workers is None:
            ref.workers = set()
        ref.workers.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            if ref.workers is not None:
                ref.workers.discard(t)
            if t.cancelled():
                return
            error = t.exception()
            result = None if error is not None else t.result()
            self.send(SYSTEM_ADDRESS, ref.address, WorkerDone(tag, result, error))

        task.add_done_callback(done)

    # -- tables ----------------------------------------------------------------------
    def new_table(self, owner: ActorRef, name: str, access: Access) -> Table[Any, Any]:
        if name in self._tables:
            raise ValueError(f"table {name} exists")
        table: Table[Any, Any] = Table(name, access, owner.label, lambda: self.current is owner)
        if owner.tables is None:
            owner.tables = []
        owner.tables.append(table)
        self._tables[name] = table
        return table

    def table(self, name: str) -> Table[Any, Any] | None:
        return self._tables.get(name)

    # -- lookup and introspection ----------------------------------------------------
    def whereis(self, name: str) -> Address | None:
        return self._names.get(name)

    def registered(self) -> dict[str, Address]:
        """Every registered name and its actor (a copy; Erlang's `registered()`)."""
        return dict(self._names)

    def is_alive(self, address: Address) -> bool:
        return address._aaddr in self._refs

    def ref(self, address: Address) -> ActorRef | None:
        return self._refs.get(address._aaddr)

    def mailbox_len(self, address: Address) -> int | None:
        """Messages waiting for the actor (Erlang's message_queue_len); None if it is not alive."""
        ref = self._refs.get(address._aaddr)
        return None if ref is None else len(ref.mailbox or ())

    def refs(self) -> Iterator[ActorRef]:
        return iter(list(self._refs.values()))

    def primaries(self) -> list[Address]:
        return list(self._primaries)

    @property
    def idle(self) -> bool:
        """No actor has mail and no tick is pending."""
        return not self._runq and not self._hiq and not self._tick_pending

    def __len__(self) -> int:
        return len(self._refs)
