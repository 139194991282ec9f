"""`supervisors.api`: which_children, count_children, start_child, terminate_child,
restart_child, delete_child, with their error replies (OTP's names)."""

from __future__ import annotations

import pytest

from supervisors import api
from supervisors.api import SupervisorError
from supervisors.supervisor import ChildCounts, ChildInfo, ChildSpec, Supervisor, SupFlags, SupSpec
from tests.support.actors import Args, Child, Crash, Harness, actor_test

Events = list[tuple[object, ...]]


def spec(id: str, events: Events, **kw: object) -> ChildSpec:
    return ChildSpec(id, Child, Args(id, events), **kw)  # type: ignore[arg-type]


async def refused(call: object) -> str:
    with pytest.raises(SupervisorError) as raised:
        await call  # type: ignore[misc]
    return raised.value.error


@actor_test
async def test_which_and_count_children(h: Harness):
    events: Events = []
    inner = SupSpec(SupFlags(), ())
    sup = h.create(
        Supervisor,
        SupSpec(
            SupFlags(),
            (spec("a", events), ChildSpec("inner", Supervisor, inner, type="supervisor")),
        ),
    )
    infos = await api.which_children(h.base, sup)
    assert [(c.id, c.type, c.start) for c in infos] == [
        ("a", "worker", "Child"),
        ("inner", "supervisor", "Supervisor"),
    ]
    assert all(h.alive(c.address) for c in infos)
    assert await api.count_children(h.base, sup) == ChildCounts(
        specs=2, active=2, supervisors=1, workers=1
    )


@actor_test
async def test_start_child(h: Harness):
    events: Events = []
    sup = h.create(Supervisor, SupSpec(SupFlags(), (spec("a", events),)))
    b = await api.start_child(h.base, sup, spec("b", events))
    assert h.alive(b)
    infos = await api.which_children(h.base, sup)
    assert [(c.id, c.address) for c in infos][1] == ("b", b)
    assert await refused(api.start_child(h.base, sup, spec("b", events))) == "already_started"
    assert await refused(api.start_child(h.base, sup, "not a spec")) == "bad_child_spec"
    failing = ChildSpec("bad", Child, Args("bad", events, fail_init="no"))
    error = await refused(api.start_child(h.base, sup, failing))
    assert error.startswith("crash")
    assert "ValueError" in error
    assert [c.id for c in await api.which_children(h.base, sup)] == ["a", "b"]
    # A started child is supervised like the others.
    h.tell(b, Crash())
    await h.settle()
    restarted = {c.id: c.address for c in await api.which_children(h.base, sup)}["b"]
    assert restarted != b
    assert h.alive(restarted)


@actor_test
async def test_terminate_restart_and_delete_child(h: Harness):
    events: Events = []
    sup = h.create(Supervisor, SupSpec(SupFlags(), (spec("a", events), spec("b", events))))
    before = {c.id: c.address for c in await api.which_children(h.base, sup)}
    b = before["b"]
    events.clear()
    await api.terminate_child(h.base, sup, "b")
    assert events == [("exit_request", "b"), ("terminate", "b", "shutdown")]
    assert not h.alive(b)
    assert await api.which_children(h.base, sup) == [
        ChildInfo("a", before["a"], "worker", "Child"),
        ChildInfo("b", None, "worker", "Child"),
    ]
    assert await api.count_children(h.base, sup) == ChildCounts(2, 1, 0, 2)
    await api.terminate_child(h.base, sup, "b")  # already stopped: ok
    assert await refused(api.terminate_child(h.base, sup, "nope")) == "not_found"
    assert await refused(api.start_child(h.base, sup, spec("b", events))) == "already_present"
    # A terminated child is not restarted by the supervisor...
    await h.settle()
    assert {c.id: c.address for c in await api.which_children(h.base, sup)}["b"] is None
    # ...but restart_child starts it again.
    new_b = await api.restart_child(h.base, sup, "b")
    assert h.alive(new_b)
    assert new_b != b
    assert await refused(api.restart_child(h.base, sup, "b")) == "running"
    assert await refused(api.restart_child(h.base, sup, "nope")) == "not_found"
    # delete_child only removes a stopped child's spec.
    assert await refused(api.delete_child(h.base, sup, "b")) == "running"
    await api.terminate_child(h.base, sup, "b")
    await api.delete_child(h.base, sup, "b")
    assert [c.id for c in await api.which_children(h.base, sup)] == ["a"]
    assert await refused(api.delete_child(h.base, sup, "b")) == "not_found"
    assert await refused(api.restart_child(h.base, sup, "b")) == "not_found"


@actor_test
async def test_terminate_child_removes_a_temporary_childs_spec(h: Harness):
    events: Events = []
    sup = h.create(
        Supervisor, SupSpec(SupFlags(), (spec("a", events), spec("t", events, restart="temporary")))
    )
    await api.terminate_child(h.base, sup, "t")
    assert [c.id for c in await api.which_children(h.base, sup)] == ["a"]


@actor_test
async def test_simple_one_for_one_api(h: Harness):
    events: Events = []
    sup = h.create(
        Supervisor, SupSpec(SupFlags("simple_one_for_one"), (ChildSpec("", Child, shutdown=1),))
    )
    w0 = await api.start_child(h.base, sup, Args("w0", events))
    w1 = await api.start_child(h.base, sup, Args("w1", events))
    assert [c.address for c in await api.which_children(h.base, sup)] == [w0, w1]
    error = await refused(api.start_child(h.base, sup, Args("bad", fail_init="no")))
    assert "ValueError" in error
    await api.terminate_child(h.base, sup, w0)
    assert not h.alive(w0)
    assert [c.address for c in await api.which_children(h.base, sup)] == [w1]
    assert await refused(api.terminate_child(h.base, sup, w0)) == "not_found"
    assert await refused(api.terminate_child(h.base, sup, "w1")) == "not_found"
    assert await api.count_children(h.base, sup) == ChildCounts(1, 1, 0, 1)


@actor_test
async def test_a_named_child_is_registered_and_reregistered_on_restart(h: Harness):
    events: Events = []
    sup = h.create(Supervisor, SupSpec(SupFlags(), (spec("svc", events, name="service"),)))
    first = h.base.whereis("service")
    assert first == {c.id: c.address for c in await api.which_children(h.base, sup)}["svc"]
    h.tell(first, Crash())
    await h.settle()
    second = h.base.whereis("service")
    assert second not in (None, first)
    assert second == {c.id: c.address for c in await api.which_children(h.base, sup)}["svc"]


@actor_test
async def test_a_name_taken_by_another_actor_fails_the_start(h: Harness):
    events: Events = []
    foreign = h.create(Child, Args("foreign"), name="taken")
    sup = h.create(Supervisor, SupSpec(SupFlags(), (spec("a", events),)))
    error = await refused(api.start_child(h.base, sup, spec("n", events, name="taken")))
    assert error.startswith("already_started")
    assert [c.id for c in await api.which_children(h.base, sup)] == ["a"]
    assert h.base.whereis("taken") == foreign
    assert ("init", "n") not in events


@actor_test
async def test_calls_to_a_dead_supervisor_raise_noproc(h: Harness):
    from supervisors.errors import NoProc

    sup = h.create(Supervisor, SupSpec(SupFlags(), ()))
    await h.base.stop(sup, 1.0)
    with pytest.raises(NoProc):
        await api.which_children(h.base, sup)
