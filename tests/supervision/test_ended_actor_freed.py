"""An ended actor is freed by reference counting the moment its end is processed: what it
held (an owner's Register with its enrolment token, its stream handle) must not wait for a
full collection, which stalls the loop for about a second at 10,000 connections."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from thespian.actors import ActorExitRequest

from actors.agents.api import StreamClosed
from supervisors.address import Address
from supervisors.messages import ActorDown
from supervisors.process import Process
from supervisors.reason import NORMAL, ExitReason
from tests.supervision.test_agent_owner import crash as crash_owner
from tests.supervision.test_agent_owner import tree as owner_tree
from tests.support.actors import Crash, Exit, Harness, actor_test


class Held:
    """Stands for what an owner holds: weakref-able, so the test sees when it goes."""


class Holder(Process):
    """Holds `Held`, a timer and a worker, as an agent owner holds its Register, its
    heartbeat timer and its stream's task."""

    def init(self, args: Any) -> None:
        self.held = args
        self.wakeupAfter(3600.0)
        self.run_worker(asyncio.Event().wait())

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        match msg:
            case Crash(text=text):
                raise RuntimeError(text)
            case Exit(reason=reason):
                self.exit(reason)


@pytest.fixture(autouse=True)
def no_collector() -> Iterator[None]:
    """Only reference counting may free the actor: a cycle would survive the test."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def spawn_holding(h: Harness) -> tuple[Address, weakref.ref[Held]]:
    held = Held()
    return h.create(Holder, held), weakref.ref(held)


async def exit_normally(h: Harness, actor: Address) -> None:
    h.tell(actor, Exit(NORMAL))


async def crash(h: Harness, actor: Address) -> None:
    h.tell(actor, Crash())


async def kill(h: Harness, actor: Address) -> None:
    h.base.kill(actor)


async def exit_request(h: Harness, actor: Address) -> None:
    h.tell(actor, ActorExitRequest())


Ender = Callable[[Harness, Address], Awaitable[None]]


@pytest.mark.parametrize(
    "end",
    [exit_normally, crash, kill, exit_request],
    ids=["exit", "crash", "kill", "exit_request"],
)
@actor_test
async def test_an_ended_actor_and_what_it_held_are_freed_at_once(h: Harness, end: Ender):
    actor, held = spawn_holding(h)
    down: list[ExitReason] = []
    h.base.monitor_callback(actor, down.append)
    await end(h, actor)
    await h.settle()
    await asyncio.sleep(0)  # the cancelled worker's task finishes on the next turn
    assert down and not h.alive(actor)
    assert held() is None


@actor_test
async def test_children_ended_with_their_parent_are_freed(h: Harness):
    held = Held()
    alive = weakref.ref(held)
    parent = h.create(Holder, Held())
    child = h.base.create_actor(h.base.ref(parent), Holder, held)
    del held
    h.base.kill(parent)
    await h.settle()
    await asyncio.sleep(0)
    assert not h.alive(child)
    assert alive() is None


@actor_test
async def test_an_ended_actors_address_still_reports_down_and_dead_letters(h: Harness):
    """Freeing the record changes nothing seen from outside: a late message to the address
    is a dead letter, a late monitor gets `noproc`, and watchers got the reason."""
    inbox: list[Any] = []
    watcher = h.spawn("watcher", inbox=inbox)
    actor, _ = spawn_holding(h)
    h.base.monitor(h.base.ref(watcher), actor)  # type: ignore[arg-type]
    h.tell(actor, Crash())
    await h.settle()
    assert [(d.address, d.reason.kind) for d in inbox if isinstance(d, ActorDown)] == [
        (actor, "crash")
    ]
    before = h.base.dead_letters
    h.tell(actor, "late")
    assert h.base.dead_letters == before + 1
    reasons: list[ExitReason] = []
    h.base.monitor_callback(actor, reasons.append)
    assert [r.kind for r in reasons] == ["noproc"]
    assert h.base.ref(actor) is None


@pytest.mark.parametrize("end", ["stream_closed", "crash", "kill"])
@actor_test
async def test_an_ended_agent_owner_is_freed_with_its_register_and_stream(h: Harness, end: str):
    t = owner_tree(h)
    owner, _ = await t.owner()
    instance = weakref.ref(h.instance(owner))
    if end == "stream_closed":
        h.tell(owner, StreamClosed())
    elif end == "crash":
        crash_owner(h, owner)
    else:
        h.base.kill(owner)
    await h.settle()
    await asyncio.sleep(0)
    assert not h.alive(owner)
    assert instance() is None


class ExitsThenLooks(Process):
    """Ends itself, then reads what the crash redaction filter reads: the current actor's
    instance (its class decides whether a record is redacted)."""

    def init(self, args: Any) -> None:
        self.seen: list[object] = args

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        self.exit(NORMAL)
        current = self.runtime.current
        self.seen.append(None if current is None else current.instance)


@actor_test
async def test_an_actor_that_ended_itself_is_still_current_until_its_handler_returns(h: Harness):
    seen: list[object] = []
    actor = h.create(ExitsThenLooks, seen)
    instance = weakref.ref(h.instance(actor))
    h.tell(actor, "go")
    await h.settle()
    assert len(seen) == 1 and isinstance(seen[0], ExitsThenLooks)
    seen.clear()
    assert instance() is None
