"""Test actors and a harness that runs a coroutine against a fresh loop runtime.

Everything runs in one process, so init arguments may carry shared objects: an `events`
list that every `Child` appends its lifecycle to (init, exit request, terminate) is how the
supervision tests observe start and stop order *from the children themselves*.

`actor_test` turns `async def test_x(h, <fixtures>)` into a plain pytest test that runs on a
fresh event loop with a fresh `LoopSystemBase` (no pytest-asyncio), bounded in time, and
shuts the runtime down afterwards.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

import attrs
from thespian.actors import ActorExitRequest, ActorSystem

from supervisors.address import Address
from supervisors.process import Process
from supervisors.reason import NORMAL, SHUTDOWN, ExitReason
from supervisors.runtime import LoopSystemBase
from supervisors.supervisor import Supervisor, SupSpec

T = TypeVar("T")

# -- messages the test actors understand --------------------------------------------------


@attrs.frozen
class Crash:
    """Raise `RuntimeError(text)` inside `receiveMessage`."""

    text: str = "boom"


@attrs.frozen
class Exit:
    """End with `reason` via `Process.exit`."""

    reason: ExitReason = NORMAL


@attrs.frozen(eq=False)
class Call:
    """Run `fn(actor)` inside the actor's handler and reply with a `CallResult`."""

    fn: Callable[[Any], Any]


@attrs.frozen(eq=False)
class CallResult:
    value: Any = None
    error: BaseException | None = None


@attrs.frozen
class Ping:
    pass


@attrs.frozen
class Pong:
    id: str
    address: Address


@attrs.define(eq=False)
class Args:
    """Init arguments of a `Child` (shared lists by reference)."""

    id: str = ""
    events: list[tuple[Any, ...]] | None = None
    inbox: list[Any] | None = None
    fail_init: str | None = None


# -- test actors ---------------------------------------------------------------------------


class Child(Process):
    """A scriptable worker: records its lifecycle in `events`, keeps every message it does
    not understand in `inbox` (ChildExited, ActorDown, WakeupMessage, WorkerDone...)."""

    def init(self, args: Any) -> None:
        self.args = args if isinstance(args, Args) else Args()
        self.inbox: list[Any] = self.args.inbox if self.args.inbox is not None else []
        self.record("init")
        if self.args.fail_init is not None:
            raise ValueError(self.args.fail_init)

    def record(self, *event: Any) -> None:
        if self.args.events is not None:
            self.args.events.append((event[0], self.args.id, *event[1:]))

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        match msg:
            case Crash(text=text):
                raise RuntimeError(text)
            case Exit(reason=reason):
                self.exit(reason)
            case Ping():
                self.send(sender, Pong(self.args.id, self.myAddress))
            case Call(fn=fn):
                try:
                    value = fn(self)
                except Exception as exc:
                    self.send(sender, CallResult(error=exc))
                else:
                    self.send(sender, CallResult(value))
            case ActorExitRequest():
                self.record("exit_request")
                self.on_exit_request()
            case _:
                self.inbox.append(msg)

    def on_exit_request(self) -> None:
        """A non-trapping actor is ended by the runtime after this returns."""

    def terminate(self, reason: ExitReason) -> None:
        self.record("terminate", reason.kind)


class TrapChild(Child):
    """Traps exits: cleans up, then ends itself with `shutdown`."""

    trap_exit: ClassVar[bool] = True

    def on_exit_request(self) -> None:
        self.exit(SHUTDOWN)


class Stubborn(Child):
    """Traps exits and never ends on its own: only a kill (or an `Exit`) ends it."""

    trap_exit: ClassVar[bool] = True


class ManualClock:
    """A clock the test advances by hand."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class ClockedSupervisor(Supervisor):
    """A `Supervisor` whose restart intensity reads a `ManualClock`: args are
    `(SupSpec, ManualClock)`."""

    def supervisor_spec(self, args: Any) -> SupSpec:
        spec, self.clock = args
        assert isinstance(spec, SupSpec)
        return spec

    def now(self) -> float:
        return self.clock()


# -- the harness ---------------------------------------------------------------------------


class Harness:
    """A fresh runtime on the running loop, with helpers for tests."""

    def __init__(self, loop: asyncio.AbstractEventLoop, **base_kw: Any) -> None:
        self.loop = loop
        self.base = LoopSystemBase(loop, **base_kw)
        self.system = ActorSystem(systemBase=self.base, transientUnique=True)

    def create(self, cls: type[Any], args: Any = None, name: str | None = None) -> Address:
        address: Address = self.system.createActor(
            cls, targetActorRequirements=args, globalName=name
        )
        return address

    def spawn(self, id: str = "", cls: type[Any] = Child, **kw: Any) -> Address:
        return self.create(cls, Args(id=id, **kw))

    def tell(self, address: Address, msg: Any) -> None:
        self.base.tell(address, msg)

    async def ask(self, address: Address, msg: Any, timeout: float = 2.0) -> Any:
        return await self.base.ask(address, msg, timeout)

    async def call(self, address: Address, fn: Callable[[Any], T], timeout: float = 2.0) -> T:
        """Run `fn(actor)` inside the actor's handler; re-raise what it raised."""
        result = await self.base.ask(address, Call(fn), timeout)
        assert isinstance(result, CallResult), result
        if result.error is not None:
            raise result.error
        return result.value  # type: ignore[no-any-return]

    def instance(self, address: Address) -> Any:
        ref = self.base.ref(address)
        assert ref is not None, f"{address} is not alive"
        return ref.instance

    def alive(self, address: Address | None) -> bool:
        return address is not None and self.base.is_alive(address)

    async def settle(self, max_turns: int = 100_000) -> None:
        """Let the loop run until the runtime's run queue is empty (no timers awaited)."""
        await settle(self.base, max_turns)

    async def wait_until(
        self, predicate: Callable[[], bool], timeout: float = 2.0, what: str = ""
    ) -> None:
        deadline = self.loop.time() + timeout
        while not predicate():
            if self.loop.time() > deadline:
                raise AssertionError(f"timed out waiting for {what or predicate}")
            await asyncio.sleep(0.001)


async def settle(base: LoopSystemBase, max_turns: int = 100_000) -> None:
    await asyncio.sleep(0)
    for _ in range(max_turns):
        if base.idle:
            return
        await asyncio.sleep(0)
    raise AssertionError("the runtime did not go idle")


def settle_sync(loop: asyncio.AbstractEventLoop, base: LoopSystemBase) -> None:
    """Drive a loop that is not running until the runtime is idle (for hypothesis)."""
    loop.run_until_complete(settle(base))


def run(body: Callable[[Harness], Awaitable[T]], *, timeout: float = 10.0, **base_kw: Any) -> T:
    """Run `body(harness)` on a fresh event loop and runtime; shut the runtime down after."""

    async def main() -> T:
        h = Harness(asyncio.get_running_loop(), **base_kw)
        try:
            return await asyncio.wait_for(body(h), timeout)
        finally:
            h.base.shutdown()

    return asyncio.run(main())


def actor_test(
    fn: Callable[..., Awaitable[Any]] | None = None, *, timeout: float = 10.0, **base_kw: Any
) -> Any:
    """Decorator: `async def test_x(h, caplog)` becomes a sync pytest test `test_x(caplog)`
    that runs `test_x` with a fresh `Harness` (see `run`)."""

    def decorate(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        signature = inspect.signature(fn)
        rest = list(signature.parameters.values())[1:]

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return run(lambda h: fn(h, *args, **kwargs), timeout=timeout, **base_kw)

        wrapper.__name__ = fn.__name__
        wrapper.__qualname__ = fn.__qualname__
        wrapper.__doc__ = fn.__doc__
        wrapper.__module__ = fn.__module__
        wrapper.__signature__ = signature.replace(parameters=rest)  # type: ignore[attr-defined]
        return wrapper

    return decorate if fn is None else decorate(fn)
