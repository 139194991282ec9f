"""The loop system base's priority run queue: registered actors (the node's singletons) take
every other turn, so they do not wait behind a backlog of per-agent actors, and the ordinary
actors are still all served while a registered actor is flooded."""

from __future__ import annotations

from typing import Any

from supervisors.address import Address
from tests.support.actors import Args, Call, Child, Harness, actor_test

BACKLOG = 5000
# More than OTHERS turns of the flooded actor hold (200 x 64), so a strict priority queue
# would drain the whole flood before the last ordinary actor got its turn.
OTHERS = 200
FLOOD = 20_000


def ordinary(h: Harness, n: int, log: list[Any]) -> list[Address]:
    return [h.spawn(f"a{i}", inbox=log) for i in range(n)]


@actor_test
async def test_registered_actors_are_on_the_priority_queue(h: Harness):
    named = h.create(Child, Args(), name="svc")
    plain = h.spawn("plain")
    assert h.base.ref(named).priority  # type: ignore[union-attr]
    assert not h.base.ref(plain).priority  # type: ignore[union-attr]


@actor_test
async def test_a_registered_actor_is_served_before_a_backlog_of_others_is_drained(h: Harness):
    log: list[Any] = []
    svc = h.create(Child, Args("svc", inbox=log), name="svc")
    first, *rest = ordinary(h, BACKLOG, log)
    # The first ordinary actor sends to `svc` while thousands of others wait their turn.
    h.tell(first, Call(lambda actor: actor.send(svc, "urgent")))
    for i, address in enumerate(rest):
        h.tell(address, i)
    await h.wait_until(lambda: len(log) == BACKLOG, timeout=10)
    # Served after at most one ordinary turn (one message each here), not after the backlog.
    assert log.index("urgent") <= 1, log.index("urgent")
    assert [m for m in log if m != "urgent"] == list(range(BACKLOG - 1))  # in order, all served


@actor_test
async def test_ordinary_actors_are_all_served_while_a_registered_actor_is_flooded(h: Harness):
    log: list[Any] = []
    svc = h.create(Child, Args("svc", inbox=log), name="svc")
    others = ordinary(h, OTHERS, log)
    for i in range(FLOOD):
        h.tell(svc, ("flood", i))
    for i, address in enumerate(others):
        h.tell(address, i)
    await h.wait_until(lambda: len(log) == FLOOD + OTHERS, timeout=10)
    flood = [m for m in log if isinstance(m, tuple)]
    assert flood == [("flood", i) for i in range(FLOOD)]  # one mailbox: arrival order
    # Turns alternate: each ordinary actor waited at most one priority turn per actor ahead
    # of it, so every ordinary message is handled before the flood is drained.
    last_ordinary = max(i for i, m in enumerate(log) if isinstance(m, int))
    assert last_ordinary < len(log) - 1
    assert last_ordinary <= OTHERS * (h.base.per_actor + 1)


@actor_test
async def test_the_priority_flag_follows_the_name_across_a_restart(h: Harness):
    log: list[Any] = []
    first = h.create(Child, Args("svc", inbox=log), name="svc")
    h.base.kill(first)
    again = h.create(Child, Args("svc", inbox=log), name="svc")
    assert again != first
    assert h.base.ref(again).priority  # type: ignore[union-attr]
    await h.settle()
    assert h.base.idle
