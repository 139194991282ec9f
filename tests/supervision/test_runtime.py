"""The loop system base: scheduling budget and fairness, monitors, timers, ask/tell, crash
semantics and redaction, exit requests, init failure, names and workers."""

from __future__ import annotations

import asyncio
import datetime
import logging

import pytest
from thespian.actors import ActorExitRequest, WakeupMessage

from supervisors.errors import ActorExited, InitFailed, NoProc
from supervisors.messages import ActorDown, ChildExited, WorkerDone
from supervisors.process import Process
from supervisors.reason import KILLED, NOPROC, NORMAL, SHUTDOWN, ExitReason
from supervisors.supervisor import ChildSpec, Supervisor, SupFlags, SupSpec
from tests.support.actors import (
    Args,
    Child,
    Crash,
    Exit,
    Harness,
    Ping,
    Pong,
    Stubborn,
    actor_test,
    run,
)

FLOOD = 100_000
SECRET = "SECRET-TOKEN-123"


def of_type(inbox: list[object], cls: type) -> list:
    return [m for m in inbox if isinstance(m, cls)]


# -- the scheduler ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "budget",
    [
        {},  # the defaults
        {"budget_messages": 2000, "budget_seconds": 3600.0},  # the message budget alone
        {"budget_messages": 10**9, "budget_seconds": 0.001},  # the time slice alone
    ],
    ids=["defaults", "messages", "time"],
)
def test_a_flood_of_messages_does_not_starve_the_loop(budget: dict[str, float]):
    run(flood_with_another_task, **budget)


async def flood_with_another_task(h: Harness) -> None:
    inbox: list[int] = []
    flooded = h.spawn("flooded", inbox=inbox)
    for i in range(FLOOD):
        h.tell(flooded, i)
    # Another task on the same loop: it gets a turn only when the scheduler hands the loop
    # back between batches.
    turns = 0
    while len(inbox) < FLOOD:
        turns += 1
        await asyncio.sleep(0)
    assert inbox == list(range(FLOOD))  # all delivered, in order
    assert turns > 20, f"the loop got only {turns} turns while {FLOOD} messages were handled"
    assert h.base.ticks > 20


@actor_test
async def test_a_flooded_actor_does_not_delay_another_actors_message(h: Harness):
    flood_inbox: list[int] = []
    flooded = h.spawn("flooded", inbox=flood_inbox)
    other = h.spawn("other")
    for i in range(FLOOD):
        h.tell(flooded, i)
    # `other` has one message queued behind the whole flood; it must wait at most one turn
    # of the flooded actor, not the flood.
    seen = await h.call(other, lambda _self: len(flood_inbox))
    assert seen <= h.base.per_actor
    assert len(flood_inbox) < FLOOD
    await h.wait_until(lambda: len(flood_inbox) == FLOOD, timeout=10)


# -- monitors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("end", "kind"),
    [(Crash("x"), "crash"), (Exit(NORMAL), "normal"), (ActorExitRequest(), "shutdown")],
)
@actor_test
async def test_monitor_gets_actor_down_with_the_reason(h: Harness, end: object, kind: str):
    inbox: list[object] = []
    watcher = h.spawn("watcher", inbox=inbox)
    target = h.spawn("target")
    mid = await h.call(watcher, lambda s: s.monitor(target))
    h.tell(target, end)
    await h.settle()
    downs = of_type(inbox, ActorDown)
    assert len(downs) == 1
    assert downs[0].address == target
    assert downs[0].monitor == mid
    assert downs[0].reason.kind == kind
    if kind == "crash":
        assert downs[0].reason.exc_class == "RuntimeError"


@actor_test
async def test_monitor_of_a_killed_actor_says_killed(h: Harness):
    inbox: list[object] = []
    watcher = h.spawn("watcher", inbox=inbox)
    target = h.spawn("target")
    mid = await h.call(watcher, lambda s: s.monitor(target))
    h.base.kill(target)
    await h.settle()
    assert of_type(inbox, ActorDown) == [ActorDown(target, KILLED, mid)]


@actor_test
async def test_monitor_of_a_dead_address_gives_noproc(h: Harness):
    inbox: list[object] = []
    watcher = h.spawn("watcher", inbox=inbox)
    target = h.spawn("target")
    h.tell(target, Exit())
    await h.settle()
    mid = await h.call(watcher, lambda s: s.monitor(target))
    await h.settle()
    assert of_type(inbox, ActorDown) == [ActorDown(target, NOPROC, mid)]


@actor_test
async def test_demonitor_stops_the_monitor(h: Harness):
    inbox: list[object] = []
    watcher = h.spawn("watcher", inbox=inbox)
    target = h.spawn("target")
    kept = await h.call(watcher, lambda s: s.monitor(target))
    dropped = await h.call(watcher, lambda s: s.monitor(target))
    await h.call(watcher, lambda s: s.demonitor(dropped))
    h.tell(target, Crash())
    await h.settle()
    assert [d.monitor for d in of_type(inbox, ActorDown)] == [kept]


@actor_test
async def test_monitors_are_cleaned_when_the_watcher_dies(h: Harness):
    watcher = h.spawn("watcher")
    target = h.spawn("target")
    await h.call(watcher, lambda s: s.monitor(target))
    target_ref = h.base.ref(target)
    assert target_ref is not None
    assert target_ref.monitors
    h.tell(watcher, Exit())
    await h.settle()
    assert not target_ref.monitors
    dead_letters = h.base.dead_letters
    h.tell(target, Crash())
    await h.settle()
    assert h.base.dead_letters == dead_letters  # no ActorDown sent to the dead watcher


@actor_test
async def test_monitors_are_cleaned_when_the_target_dies(h: Harness):
    watcher = h.spawn("watcher")
    target = h.spawn("target")
    await h.call(watcher, lambda s: s.monitor(target))
    watcher_ref = h.base.ref(watcher)
    assert watcher_ref is not None
    assert watcher_ref.monitoring
    h.tell(target, Exit())
    await h.settle()
    assert not watcher_ref.monitoring


@actor_test
async def test_callback_monitor_and_its_demonitor(h: Harness):
    target = h.spawn("target")
    fired: list[ExitReason] = []
    dropped: list[ExitReason] = []
    h.base.monitor_callback(target, fired.append)
    mid = h.base.monitor_callback(target, dropped.append)
    h.base.demonitor(mid)
    h.tell(target, Exit(ExitReason("bye")))
    await h.settle()
    assert [r.kind for r in fired] == ["bye"]
    assert dropped == []
    noproc: list[ExitReason] = []
    h.base.monitor_callback(target, noproc.append)
    assert noproc == [NOPROC]


# -- timers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("period", [0.01, datetime.timedelta(milliseconds=10)])
@actor_test
async def test_wakeup_after_delivers_the_payload(h: Harness, period: object):
    inbox: list[object] = []
    actor = h.spawn("timer", inbox=inbox)
    await h.call(actor, lambda s: s.wakeupAfter(period, ("tick", 1)))
    assert inbox == []
    await h.wait_until(lambda: bool(inbox), what="the wakeup")
    assert len(inbox) == 1
    assert isinstance(inbox[0], WakeupMessage)
    assert inbox[0].payload == ("tick", 1)


@actor_test
async def test_wakeups_arrive_in_time_order_and_can_be_cancelled(h: Harness):
    inbox: list[object] = []
    actor = h.spawn("timer", inbox=inbox)
    await h.call(actor, lambda s: s.wakeupAfter(0.03, "late"))
    cancelled = await h.call(actor, lambda s: s.wakeupAfter(0.005, "cancelled"))
    await h.call(actor, lambda s: s.wakeupAfter(0.01, "early"))
    await h.call(actor, lambda s: s.cancel_wakeup(cancelled))
    await h.wait_until(lambda: len(inbox) == 2, what="two wakeups")
    assert [m.payload for m in inbox] == ["early", "late"]


@actor_test
async def test_timers_are_cancelled_when_the_actor_ends(h: Harness, caplog):
    caplog.set_level(logging.DEBUG)
    actor = h.spawn("timer")
    handle = await h.call(actor, lambda s: s.wakeupAfter(0.01, "never"))
    dead_letters = h.base.dead_letters
    h.tell(actor, Exit())
    await h.settle()
    assert handle.cancelled()
    await asyncio.sleep(0.03)
    await h.settle()
    assert h.base.dead_letters == dead_letters
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


# -- ask and tell ----------------------------------------------------------------------------


@actor_test
async def test_ask_returns_the_reply(h: Harness):
    actor = h.spawn("a")
    assert await h.ask(actor, Ping()) == Pong("a", actor)
    assert h.base._waiters == {}
    ref = h.base.ref(actor)
    assert ref is not None
    assert not ref.monitors  # the ask's monitor was removed


@actor_test
async def test_ask_times_out(h: Harness):
    actor = h.spawn("silent")  # keeps unknown messages, never replies
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await h.ask(actor, "hello", timeout=0.05)
    assert 0.04 <= loop.time() - started < 1.0
    assert h.base._waiters == {}
    ref = h.base.ref(actor)
    assert ref is not None
    assert not ref.monitors
    assert h.instance(actor).inbox == ["hello"]


@actor_test
async def test_ask_of_a_dead_actor_raises_noproc(h: Harness):
    actor = h.spawn("a")
    h.tell(actor, Exit())
    await h.settle()
    with pytest.raises(NoProc):
        await h.ask(actor, Ping())


@pytest.mark.parametrize(("msg", "kind"), [(Crash(SECRET), "crash"), (Exit(NORMAL), "normal")])
@actor_test
async def test_ask_raises_actor_exited_when_the_target_ends_first(
    h: Harness, msg: object, kind: str
):
    actor = h.spawn("a")
    with pytest.raises(ActorExited) as raised:
        await h.ask(actor, msg)
    assert raised.value.reason.kind == kind
    assert SECRET not in str(raised.value)
    assert h.base._waiters == {}


# -- crashes ---------------------------------------------------------------------------------


def assert_secret_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    formatter = logging.Formatter()
    for record in caplog.records:
        text = record.getMessage()
        if record.exc_info:
            text += formatter.formatException(record.exc_info)
        if record.exc_text:
            text += record.exc_text
        if record.stack_info:
            text += record.stack_info
        assert SECRET not in text, f"{record.name}: {text}"


class FailingTerminate(Child):
    def terminate(self, reason: ExitReason) -> None:
        raise RuntimeError(SECRET)


@actor_test
async def test_crash_reason_keeps_class_and_top_frame_only(h: Harness, caplog):
    caplog.set_level(logging.DEBUG)
    inbox: list[object] = []
    parent = h.spawn("parent", inbox=inbox)
    child = await h.call(parent, lambda s: s.createActor(Child, Args("child")))
    h.tell(child, Crash(SECRET))
    await h.settle()
    exits = of_type(inbox, ChildExited)
    assert len(exits) == 1
    assert exits[0].childAddress == child
    reason = exits[0].reason
    assert reason.kind == "crash"
    assert reason.exc_class == "RuntimeError"
    assert reason.frame.startswith("actors.py:")
    assert reason.frame.endswith("in receiveMessage")
    for text in (str(reason), repr(reason), str(exits[0])):
        assert SECRET not in text
    assert any(r.name == "supervisors.crash" for r in caplog.records)  # it was logged...
    assert_secret_not_logged(caplog)  # ...redacted


@actor_test
async def test_no_crash_path_logs_the_exception_message(h: Harness, caplog):
    caplog.set_level(logging.DEBUG)
    # init failure
    with pytest.raises(InitFailed) as raised:
        h.create(Child, Args("bad", fail_init=SECRET))
    assert SECRET not in str(raised.value)
    # terminate raising
    failing = h.create(FailingTerminate, Args("ft"))
    h.tell(failing, Exit())
    # a worker raising: the error comes back as a message, nothing is logged
    inbox: list[object] = []
    actor = h.spawn("worker", inbox=inbox)

    async def fail() -> None:
        raise ValueError(SECRET)

    await h.call(actor, lambda s: s.run_worker(fail(), "w"))
    await h.wait_until(lambda: bool(inbox))
    # a supervised child crashing, and a start_child whose init fails
    sup = h.create(Supervisor, SupSpec(SupFlags(intensity=5), (ChildSpec("c", Child),)))
    [info] = h.instance(sup).which_children()
    h.tell(info.address, Crash(SECRET))
    await h.settle()
    from supervisors import api

    with pytest.raises(api.SupervisorError) as refused:
        await api.start_child(h.base, sup, ChildSpec("d", Child, Args("d", fail_init=SECRET)))
    assert SECRET not in refused.value.error
    await asyncio.sleep(0.01)
    assert caplog.records
    assert_secret_not_logged(caplog)


@actor_test
async def test_children_are_stopped_when_their_parent_crashes(h: Harness):
    events: list[tuple[object, ...]] = []
    inbox: list[object] = []
    grandparent = h.spawn("gp", inbox=inbox)
    parent = await h.call(grandparent, lambda s: s.createActor(Child, Args("p", events)))
    kids = []
    for name in "abc":
        kid = await h.call(parent, lambda s, n=name: s.createActor(Child, Args(n, events)))
        kids.append(kid)
    grandkid = await h.call(kids[0], lambda s: s.createActor(Child, Args("a1", events)))
    events.clear()
    h.tell(parent, Crash())
    await h.settle()
    assert events == [
        ("terminate", "p", "crash"),
        ("terminate", "c", "shutdown"),
        ("terminate", "b", "shutdown"),
        ("terminate", "a", "shutdown"),
        ("terminate", "a1", "shutdown"),
    ]
    assert not any(h.alive(a) for a in [parent, grandkid, *kids])
    # The grandparent hears of its own child only.
    assert [(e.childAddress, e.reason.kind) for e in of_type(inbox, ChildExited)] == [
        (parent, "crash")
    ]


# -- exit requests ---------------------------------------------------------------------------


@actor_test
async def test_exit_request_ends_a_non_trapping_actor_after_its_handler(h: Harness):
    events: list[tuple[object, ...]] = []
    actor = h.spawn("a", events=events)
    reasons: list[ExitReason] = []
    h.base.monitor_callback(actor, reasons.append)
    h.tell(actor, ActorExitRequest())
    await h.settle()
    assert events == [("init", "a"), ("exit_request", "a"), ("terminate", "a", "shutdown")]
    assert reasons == [SHUTDOWN]
    assert not h.alive(actor)


@actor_test
async def test_a_trapping_actor_runs_until_it_exits(h: Harness):
    events: list[tuple[object, ...]] = []
    actor = h.spawn("t", cls=Stubborn, events=events)
    h.tell(actor, ActorExitRequest())
    await h.settle()
    assert h.alive(actor)
    assert events == [("init", "t"), ("exit_request", "t")]
    assert await h.ask(actor, Ping()) == Pong("t", actor)
    h.tell(actor, Exit(NORMAL))
    await h.settle()
    assert not h.alive(actor)
    assert events[-1] == ("terminate", "t", "normal")


@actor_test
async def test_stop_kills_an_actor_that_ignores_its_exit_request(h: Harness):
    events: list[tuple[object, ...]] = []
    actor = h.spawn("t", cls=Stubborn, events=events)
    assert await h.base.stop(actor, 0.02) == KILLED
    assert not h.alive(actor)
    assert ("terminate", "t", "killed") not in events  # a kill does not run terminate
    assert await h.base.stop(actor, 0.02) == NOPROC


# -- creation, names -------------------------------------------------------------------------


@actor_test
async def test_init_failure_raises_init_failed_and_leaves_nothing(h: Harness):
    inbox: list[object] = []
    parent = h.spawn("parent", inbox=inbox)
    with pytest.raises(InitFailed) as raised:
        h.create(Child, Args("x", fail_init="no"), name="x")
    reason = raised.value.reason
    assert reason.kind == "crash"
    assert reason.exc_class == "ValueError"
    assert reason.frame.endswith("in init")
    assert h.base.whereis("x") is None
    assert len(h.base) == 1
    # Created by an actor: the creator gets the error, not a ChildExited.
    with pytest.raises(InitFailed):
        await h.call(parent, lambda s: s.createActor(Child, Args("y", fail_init="no")))
    await h.settle()
    assert of_type(inbox, ChildExited) == []
    parent_ref = h.base.ref(parent)
    assert parent_ref is not None
    assert not parent_ref.children
    assert len(h.base) == 1


@actor_test
async def test_global_name_is_registered_and_freed_on_exit(h: Harness):
    first = h.create(Child, Args("first"), name="registered")
    assert h.base.whereis("registered") == first
    # thespian's rule: creating under a taken name returns the registered actor.
    assert h.create(Child, Args("again"), name="registered") == first
    assert len(h.base) == 1
    assert h.instance(first).globalName == "registered"
    h.tell(first, Crash())
    await h.settle()
    assert h.base.whereis("registered") is None
    second = h.create(Child, Args("second"), name="registered")
    assert second != first
    assert h.base.whereis("registered") == second


# -- workers ---------------------------------------------------------------------------------


@actor_test
async def test_run_worker_delivers_its_result(h: Harness):
    inbox: list[object] = []
    actor = h.spawn("w", inbox=inbox)

    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    await h.call(actor, lambda s: s.run_worker(double(21), tag="job"))
    await h.wait_until(lambda: bool(inbox))
    assert inbox == [WorkerDone("job", 42, None)]
    assert inbox[0].ok


@actor_test
async def test_run_worker_delivers_its_error(h: Harness):
    inbox: list[object] = []
    actor = h.spawn("w", inbox=inbox)
    error = LookupError("nope")

    async def fail() -> None:
        await asyncio.sleep(0)
        raise error

    await h.call(actor, lambda s: s.run_worker(fail(), tag="job"))
    await h.wait_until(lambda: bool(inbox))
    [done] = inbox
    assert isinstance(done, WorkerDone)
    assert done.tag == "job"
    assert done.error is error
    assert done.result is None
    assert not done.ok
    assert h.alive(actor)  # a worker's failure is a message, not a crash


@actor_test
async def test_a_worker_is_cancelled_when_its_actor_dies(h: Harness):
    inbox: list[object] = []
    actor = h.spawn("w", inbox=inbox)
    started = asyncio.Event()
    cancelled: list[bool] = []

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    await h.call(actor, lambda s: s.run_worker(forever(), tag="job"))
    await asyncio.wait_for(started.wait(), 1)
    dead_letters = h.base.dead_letters
    h.tell(actor, Crash())
    await h.wait_until(lambda: bool(cancelled), what="the worker's cancellation")
    await h.settle()
    assert inbox == []
    assert h.base.dead_letters == dead_letters  # no WorkerDone for a cancelled worker


# -- Process services -----------------------------------------------------------------------


class Clocked(Process):
    def receiveMessage(self, msg: object, sender: object) -> None:
        self.send(sender, (self.now(), self.parent_address, self.runtime is not None))


@actor_test
async def test_process_now_is_the_loop_clock(h: Harness):
    actor = h.create(Clocked)
    before = asyncio.get_running_loop().time()
    now, parent, has_runtime = await h.ask(actor, "now?")
    assert before <= now <= asyncio.get_running_loop().time()
    assert parent is None
    assert has_runtime


@actor_test
async def test_a_raising_exit_hook_does_not_stall_the_scheduler(h, caplog):
    """Code outside the actor world that fails when an actor ends must not stop the
    scheduler, and its failure is logged by class and frame only."""

    def bad_hook(_reason):
        raise RuntimeError("SECRET-HOOK-MARKER")

    victim = h.spawn("victim")
    h.base.monitor_callback(victim, bad_hook)
    other = h.spawn("other")
    h.base.kill(victim)
    assert isinstance(await h.ask(other, Ping()), Pong)
    assert "SECRET-HOOK-MARKER" not in caplog.text
    assert "exit hook raised: crash: RuntimeError" in caplog.text
