"""Supervisors: strategies, restart types, restart intensity and escalation, ordered start
and stop as the children see them, shutdown timeouts, start abort."""

from __future__ import annotations

import asyncio
import logging

import pytest
from thespian.actors import ActorExitRequest

from supervisors import api
from supervisors.address import Address
from supervisors.errors import InitFailed
from supervisors.messages import ChildExited
from supervisors.reason import KILLED, NORMAL, SHUTDOWN, ExitReason
from supervisors.supervisor import (
    DEFAULT_WORKER_SHUTDOWN_S,
    ChildSpec,
    Supervisor,
    SupFlags,
    SupSpec,
)
from tests.support.actors import (
    Args,
    Child,
    ClockedSupervisor,
    Crash,
    Exit,
    Harness,
    ManualClock,
    Stubborn,
    TrapChild,
    actor_test,
)

Events = list[tuple[object, ...]]
SECRET = "SECRET-TOKEN-123"


def spec(id: str, events: Events, cls: type = Child, **kw: object) -> ChildSpec:
    return ChildSpec(id, cls, Args(id, events), **kw)  # type: ignore[arg-type]


async def children(h: Harness, sup: Address) -> dict[str | None, Address | None]:
    return {c.id: c.address for c in await api.which_children(h.base, sup)}


def stopped(*ids: str) -> list[tuple[object, ...]]:
    """What non-trapping `Child`ren record when stopped one after another."""
    return [e for i in ids for e in (("exit_request", i), ("terminate", i, "shutdown"))]


def exits_of(inbox: list[object]) -> list[tuple[Address, str]]:
    return [(m.childAddress, m.reason.kind) for m in inbox if isinstance(m, ChildExited)]


# -- strategies ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "restarted", "stop_order"),
    [
        ("one_for_one", "b", ""),
        ("one_for_all", "abc", "ca"),
        ("rest_for_one", "bc", "c"),
    ],
)
@actor_test
async def test_strategy_restarts_the_right_children_in_order(
    h: Harness, strategy: str, restarted: str, stop_order: str
):
    events: Events = []
    specs = tuple(spec(i, events) for i in "abc")
    sup = h.create(Supervisor, SupSpec(SupFlags(strategy, 5, 10), specs))  # type: ignore[arg-type]
    assert events == [("init", i) for i in "abc"]
    before = await children(h, sup)
    events.clear()
    h.tell(before["b"], Crash())
    await h.settle()
    assert events == [
        ("terminate", "b", "crash"),
        *stopped(*stop_order),
        *[("init", i) for i in restarted],
    ]
    after = await children(h, sup)
    for i in "abc":
        assert h.alive(after[i])
        assert (after[i] != before[i]) == (i in restarted), i
    assert h.alive(sup)


@pytest.mark.parametrize(
    ("restart", "end", "restarted", "kept"),
    [
        ("permanent", Crash(), True, True),
        ("permanent", Exit(NORMAL), True, True),
        ("transient", Crash(), True, True),
        ("transient", Exit(ExitReason("other")), True, True),
        ("transient", Exit(NORMAL), False, True),
        ("transient", Exit(SHUTDOWN), False, True),
        ("temporary", Crash(), False, False),
        ("temporary", Exit(NORMAL), False, False),
    ],
)
@actor_test
async def test_restart_types(h: Harness, restart: str, end: object, restarted: bool, kept: bool):
    events: Events = []
    sup = h.create(
        Supervisor,
        SupSpec(SupFlags(intensity=5), (spec("a", events), spec("x", events, restart=restart))),
    )
    before = await children(h, sup)
    h.tell(before["x"], end)
    await h.settle()
    after = await children(h, sup)
    assert ("x" in after) == kept
    if restarted:
        assert h.alive(after["x"])
        assert after["x"] != before["x"]
        assert events.count(("init", "x")) == 2
    elif kept:
        assert after["x"] is None
    assert after["a"] == before["a"]
    assert h.alive(sup)


@pytest.mark.parametrize(
    ("restart", "end", "restarted"),
    [
        ("permanent", Crash(), True),
        ("permanent", Exit(NORMAL), True),
        ("transient", Crash(), True),
        ("transient", Exit(NORMAL), False),
        ("transient", Exit(SHUTDOWN), False),
        ("temporary", Crash(), False),
    ],
)
@actor_test
async def test_simple_one_for_one(h: Harness, restart: str, end: object, restarted: bool):
    events: Events = []
    template = ChildSpec("", Child, restart=restart)  # type: ignore[arg-type]
    sup = h.create(Supervisor, SupSpec(SupFlags("simple_one_for_one", 5, 10), (template,)))
    assert await api.which_children(h.base, sup) == []
    workers = [await api.start_child(h.base, sup, Args(f"w{i}", events)) for i in range(3)]
    assert events == [("init", f"w{i}") for i in range(3)]
    h.tell(workers[1], end)
    await h.settle()
    infos = await api.which_children(h.base, sup)
    addresses = [c.address for c in infos]
    assert all(c.id is None for c in infos)
    assert all(h.alive(a) for a in addresses)
    if restarted:
        assert len(addresses) == 3
        assert addresses[0] == workers[0]
        assert addresses[2] == workers[2]
        assert addresses[1] not in (None, workers[1])
        assert h.instance(addresses[1]).args.id == "w1"  # restarted with its own args
    else:
        assert addresses == [workers[0], workers[2]]
    counts = await api.count_children(h.base, sup)
    assert counts.active == len(addresses)


# -- restart intensity -----------------------------------------------------------------------


async def clocked_under_parent(
    h: Harness, flags: SupFlags, specs: tuple[ChildSpec, ...], clock: ManualClock
) -> tuple[Address, list[object]]:
    inbox: list[object] = []
    parent = h.spawn("parent", inbox=inbox)
    sup = await h.call(
        parent, lambda s: s.createActor(ClockedSupervisor, (SupSpec(flags, specs), clock))
    )
    return sup, inbox


@pytest.mark.parametrize("strategy", ["one_for_one", "one_for_all", "rest_for_one"])
@pytest.mark.parametrize("intensity", [0, 1, 3])
@actor_test
async def test_intensity_restarts_are_absorbed_and_the_next_one_escalates(
    h: Harness, intensity: int, strategy: str
):
    events: Events = []
    clock = ManualClock()
    flags = SupFlags(strategy, intensity, 10.0)  # type: ignore[arg-type]
    sup, inbox = await clocked_under_parent(h, flags, (spec("a", events), spec("b", events)), clock)
    for _ in range(intensity):
        before = await children(h, sup)
        h.tell(before["a"], Crash())
        await h.settle()
        clock.advance(1.0)  # all inside the 10 s period
        after = await children(h, sup)
        assert h.alive(sup)
        assert h.alive(after["a"])
        assert after["a"] != before["a"]
    last = await children(h, sup)
    events.clear()
    h.tell(last["a"], Crash())
    await h.settle()
    assert not h.alive(sup)
    assert not h.alive(last["b"])
    assert exits_of(inbox) == [(sup, "reached_max_restart_intensity")]
    # It gave up: the crashed child is not restarted, the others are stopped in reverse order.
    assert events == [("terminate", "a", "crash"), *stopped("b")]


@actor_test
async def test_intensity_window_slides_with_the_clock(h: Harness):
    events: Events = []
    clock = ManualClock()
    sup, inbox = await clocked_under_parent(
        h, SupFlags("one_for_one", 2, 10.0), (spec("a", events),), clock
    )

    async def crash_at(t: float) -> None:
        clock.t = t
        h.tell((await children(h, sup))["a"], Crash())
        await h.settle()

    await crash_at(0.0)
    await crash_at(1.0)
    await crash_at(10.5)  # the restart at 0.0 has left the window: 2 in window
    assert h.alive(sup)
    assert h.instance(sup).format_status()["restarts_in_window"] == 2
    await crash_at(10.6)  # 1.0, 10.5, 10.6: three within 10 s
    assert not h.alive(sup)
    assert exits_of(inbox) == [(sup, "reached_max_restart_intensity")]


@actor_test
async def test_intensity_in_real_time(h: Harness):
    events: Events = []
    sup = h.create(Supervisor, SupSpec(SupFlags("one_for_one", 1, 0.2), (spec("a", events),)))

    async def crash() -> None:
        h.tell((await children(h, sup))["a"], Crash())
        await h.settle()

    await crash()
    await asyncio.sleep(0.25)  # the first restart leaves the 0.2 s window
    await crash()
    assert h.alive(sup)
    await crash()
    assert not h.alive(sup)


@actor_test
async def test_escalation_reaches_the_supervisor_above(h: Harness, caplog):
    caplog.set_level(logging.INFO)
    events: Events = []
    clock = ManualClock()
    inner_args = (SupSpec(SupFlags("one_for_one", 0, 10.0), (spec("a", events),)), clock)
    top_specs = (
        spec("first", events),
        ChildSpec("inner", ClockedSupervisor, inner_args, type="supervisor"),
    )
    top, inbox = await clocked_under_parent(h, SupFlags("one_for_one", 1, 10.0), top_specs, clock)
    first = (await children(h, top))["first"]
    inner = (await children(h, top))["inner"]
    assert inner is not None
    a = (await children(h, inner))["a"]
    events.clear()
    h.tell(a, Crash())  # inner gives up at once (intensity 0); top restarts it (1 of 1)
    await h.settle()
    new_inner = (await children(h, top))["inner"]
    assert not h.alive(inner)
    assert h.alive(new_inner)
    assert new_inner != inner
    assert events == [("terminate", "a", "crash"), ("init", "a")]
    assert (await children(h, top))["first"] == first
    assert any(
        "child inner (ClockedSupervisor) ended: reached_max_restart_intensity" in r.getMessage()
        for r in caplog.records
        if r.name == "supervisors.supervisor"
    )
    # Again: now the top supervisor exceeds its own intensity and its parent decides.
    assert new_inner is not None
    h.tell((await children(h, new_inner))["a"], Crash())
    await h.settle()
    assert not h.alive(top)
    assert not h.alive(first)
    assert exits_of(inbox) == [(top, "reached_max_restart_intensity")]


# -- ordered start and stop, seen by the children --------------------------------------------


@actor_test
async def test_start_in_order_and_stop_in_reverse_one_at_a_time(h: Harness):
    events: Events = []
    specs = tuple(spec(i, events, TrapChild) for i in "abcd")
    sup = h.create(Supervisor, SupSpec(SupFlags(), specs))
    assert events == [("init", i) for i in "abcd"]
    kids = await children(h, sup)
    events.clear()
    assert await h.base.stop(sup, 2.0) == SHUTDOWN
    # Each child is asked only after the one before it has ended.
    assert events == stopped(*"dcba")
    assert not any(h.alive(a) for a in kids.values())


@actor_test
async def test_stop_order_is_spec_order_after_restarts(h: Harness):
    events: Events = []
    sup = h.create(
        Supervisor, SupSpec(SupFlags(intensity=5), tuple(spec(i, events) for i in "abc"))
    )
    h.tell((await children(h, sup))["a"], Crash())
    await h.settle()
    events.clear()
    assert await h.base.stop(sup, 2.0) == SHUTDOWN
    assert events == stopped(*"cba")


@actor_test
async def test_parent_crash_ends_a_supervisors_children_in_reverse_spec_order(h: Harness):
    events: Events = []
    inbox: list[object] = []
    parent = h.spawn("parent", inbox=inbox)
    sup_spec = SupSpec(SupFlags(intensity=5), tuple(spec(i, events) for i in "abc"))
    sup = await h.call(parent, lambda s: s.createActor(Supervisor, sup_spec))
    h.tell((await children(h, sup))["a"], Crash())  # `a` is now the newest actor
    await h.settle()
    kids = await children(h, sup)
    events.clear()
    h.tell(parent, Crash())
    await h.settle()
    assert events == [("terminate", i, "shutdown") for i in "cba"]
    assert not h.alive(sup)
    assert not any(h.alive(a) for a in kids.values())


# -- shutdown timeouts -----------------------------------------------------------------------


@actor_test
async def test_a_child_that_ignores_its_stop_is_killed_after_its_shutdown_timeout(h: Harness):
    events: Events = []
    specs = (spec("s", events, Stubborn, shutdown=0.1), spec("t", events, TrapChild, shutdown=5))
    sup = h.create(Supervisor, SupSpec(SupFlags(), specs))
    kids = await children(h, sup)
    reasons: dict[str, list[ExitReason]] = {"s": [], "t": []}
    for i, address in kids.items():
        assert i is not None
        assert address is not None
        h.base.monitor_callback(address, reasons[i].append)
    events.clear()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await h.base.stop(sup, 5.0) == SHUTDOWN
    elapsed = loop.time() - started
    assert 0.09 <= elapsed < 1.0
    # `t` stopped cleanly, then `s` was asked, ignored it, and was killed (no terminate).
    assert events == [*stopped("t"), ("exit_request", "s")]
    assert reasons == {"t": [SHUTDOWN], "s": [KILLED]}


@actor_test
async def test_brutal_kill_kills_at_once(h: Harness):
    events: Events = []
    sup = h.create(
        Supervisor, SupSpec(SupFlags(), (spec("s", events, Stubborn, shutdown="brutal_kill"),))
    )
    kid = (await children(h, sup))["s"]
    assert kid is not None
    reasons: list[ExitReason] = []
    h.base.monitor_callback(kid, reasons.append)
    events.clear()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await h.base.stop(sup, 5.0) == SHUTDOWN
    assert loop.time() - started < 0.05
    assert events == []  # never asked, terminate never ran
    assert reasons == [KILLED]


@actor_test
async def test_infinity_waits_for_the_child(h: Harness):
    events: Events = []
    sup = h.create(
        Supervisor, SupSpec(SupFlags(), (spec("s", events, Stubborn, shutdown="infinity"),))
    )
    kid = (await children(h, sup))["s"]
    assert kid is not None
    stopping = asyncio.ensure_future(h.base.stop(sup, None))
    await asyncio.sleep(0.15)
    assert not stopping.done()
    assert h.alive(sup)
    assert h.alive(kid)
    h.tell(kid, Exit(SHUTDOWN))  # the child finishes its cleanup when it likes
    assert await asyncio.wait_for(stopping, 1.0) == SHUTDOWN
    assert events[-2:] == [("exit_request", "s"), ("terminate", "s", "shutdown")]


def test_default_shutdown_timeouts_are_otps():
    assert ChildSpec("w", Child).shutdown_timeout == DEFAULT_WORKER_SHUTDOWN_S
    assert ChildSpec("s", Supervisor, type="supervisor").shutdown_timeout == "infinity"
    assert ChildSpec("w", Child, shutdown="brutal_kill").shutdown_timeout == "brutal_kill"


@actor_test
async def test_simple_one_for_one_stops_all_children_at_once(h: Harness):
    events: Events = []
    n = 8
    template = ChildSpec("", Stubborn, shutdown=0.1)
    sup = h.create(Supervisor, SupSpec(SupFlags("simple_one_for_one"), (template,)))
    workers = [await api.start_child(h.base, sup, Args(f"w{i}", events)) for i in range(n)]
    events.clear()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await h.base.stop(sup, 5.0) == SHUTDOWN
    elapsed = loop.time() - started
    # One shutdown timeout for all, not n of them (0.8 s).
    assert 0.09 <= elapsed < 0.4
    assert sorted(events) == sorted(("exit_request", f"w{i}") for i in range(n))
    assert not any(h.alive(w) for w in workers)


@actor_test
async def test_messages_to_a_stopping_supervisor_are_answered_after(h: Harness):
    events: Events = []
    specs = (spec("a", events), spec("s", events, Stubborn, shutdown=0.1))
    sup = h.create(Supervisor, SupSpec(SupFlags(), specs))
    terminating = asyncio.ensure_future(api.terminate_child(h.base, sup, "s"))
    await h.settle()
    assert h.instance(sup).stopping is not None
    asking = asyncio.ensure_future(api.which_children(h.base, sup))
    await asyncio.sleep(0.03)
    assert not asking.done()
    assert not terminating.done()
    infos = await asyncio.wait_for(asking, 1.0)
    assert terminating.done()
    # The answer reflects the finished stop.
    assert {c.id: c.address for c in infos}["s"] is None
    assert h.alive({c.id: c.address for c in infos}["a"])


# -- ordered start abort ---------------------------------------------------------------------


@actor_test
async def test_a_child_failing_to_start_aborts_the_start(h: Harness):
    events: Events = []
    specs = (
        spec("a", events),
        spec("b", events, TrapChild),
        ChildSpec("c", Child, Args("c", events, fail_init=SECRET)),
        spec("d", events),
    )
    with pytest.raises(InitFailed) as raised:
        h.create(Supervisor, SupSpec(SupFlags(), specs), name="sup")
    reason = raised.value.reason
    assert reason.kind == "failed_to_start_child"
    assert reason.detail == "c"
    assert reason.exc_class == "ValueError"
    assert SECRET not in str(reason)
    # a and b were started, then ended in reverse order; d was never started.
    assert events == [
        ("init", "a"),
        ("init", "b"),
        ("init", "c"),
        ("terminate", "b", "shutdown"),
        ("terminate", "a", "shutdown"),
    ]
    assert len(h.base) == 0
    assert h.base.whereis("sup") is None


@actor_test
async def test_a_nested_start_failure_names_the_child_supervisor(h: Harness):
    events: Events = []
    inner = SupSpec(SupFlags(), (ChildSpec("x", Child, Args("x", events, fail_init="no")),))
    specs = (spec("a", events), ChildSpec("inner", Supervisor, inner, type="supervisor"))
    with pytest.raises(InitFailed) as raised:
        h.create(Supervisor, SupSpec(SupFlags(), specs))
    assert raised.value.reason.kind == "failed_to_start_child"
    assert raised.value.reason.detail == "inner"
    assert events == [("init", "a"), ("init", "x"), ("terminate", "a", "shutdown")]
    assert len(h.base) == 0


# -- regressions -----------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["one_for_all", "rest_for_one"])
@actor_test(timeout=5)
async def test_a_sibling_dying_during_a_group_restart_does_not_stall_it(h: Harness, strategy: str):
    """Two children crash back to back: the second one's exit arrives while the supervisor
    is stopping the group and is postponed. The stop must not wait for it (with `infinity`
    it used to wait for ever) nor count it as a second restart."""
    events: Events = []
    specs = tuple(spec(i, events, TrapChild, shutdown="infinity") for i in "abc")
    sup = h.create(Supervisor, SupSpec(SupFlags(strategy, 1, 10), specs))  # type: ignore[arg-type]
    before = await children(h, sup)
    h.tell(before["a"], Crash())
    h.tell(before["b"], Crash())
    await h.settle()
    after = await asyncio.wait_for(children(h, sup), 1.0)
    assert h.alive(sup)
    for i in "abc":
        assert h.alive(after[i])
        assert after[i] != before[i]
    assert [e for e in events if e[0] == "init"][-3:] == [("init", i) for i in "abc"]
    assert h.instance(sup).postponed == type(h.instance(sup).postponed)()


@pytest.mark.parametrize("strategy", ["one_for_all", "rest_for_one"])
@actor_test
async def test_a_group_restart_drops_temporary_children(h: Harness, strategy: str):
    events: Events = []
    specs = (spec("a", events), spec("t", events, restart="temporary"), spec("b", events))
    sup = h.create(Supervisor, SupSpec(SupFlags(strategy, 5, 10), specs))  # type: ignore[arg-type]
    before = await children(h, sup)
    h.tell(before["a"], Crash())
    await h.settle()
    after = await children(h, sup)
    assert list(after) == ["a", "b"]
    assert not h.alive(before["t"])
    assert events.count(("init", "t")) == 1
    assert h.alive(after["a"])
    assert h.alive(after["b"])


@actor_test
async def test_exit_request_while_restarting_is_handled_after(h: Harness):
    events: Events = []
    specs = (spec("a", events), spec("s", events, Stubborn, shutdown=0.05))
    sup = h.create(Supervisor, SupSpec(SupFlags("one_for_all", 5, 10), specs))
    before = await children(h, sup)
    h.tell(before["a"], Crash())  # the group restart waits 0.05 s for `s`
    await h.settle()
    h.tell(sup, ActorExitRequest())
    await h.wait_until(lambda: not h.alive(sup), what="the supervisor to stop")
    # The restart completed first (a and s restarted), then both were stopped.
    inits = [e for e in events if e[0] == "init"]
    assert inits == [("init", "a"), ("init", "s")] * 2
    assert events[-3:] == [
        ("exit_request", "s"),
        ("exit_request", "a"),
        ("terminate", "a", "shutdown"),
    ]
