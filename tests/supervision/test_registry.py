"""The `registry` actor: the Register / Subscribe / owner flow, the cap with in-flight
reservations, the same-agent rule, owners monitored, the sweeps, heartbeat admission, and what a
registry kill or restart means (SPEC_INDEX PEND-01..08, ADM-01..09, ADM-13).

The cores' rules are proved in tests/unit/actors/core/test_reservations.py and test_pending.py;
these tests
check the wiring: that one message does the whole atomic step, that the tables say what the
cores hold, and that the tables die with the actor.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from actors.core.pending import PendingPolicy
from actors.core.reservations import SlotPolicy
from actors.node.api import Readiness
from actors.registry.actor import Registry, RegistryArgs
from actors.registry.api import (
    AGENTS_TABLE,
    CONNECTIONS_TABLE,
    OWNERS_TABLE,
    PENDING_TABLE,
    REGISTRY_NAME,
    SESSIONS_INDEX,
    SUPERSEDED_LOG,
    Binding,
    Commit,
    CommitRefused,
    Committed,
    ConnectionDown,
    ConnUsage,
    GetCounts,
    OwnerRefused,
    OwnerRegistered,
    OwnerUp,
    RegistryCounts,
    Release,
    ReleaseTaken,
    Reserve,
    Reserved,
    ReserveRefused,
    Taken,
    TakePending,
    TakeRefused,
    Unregister,
    admit,
    agent_session,
    binding_of,
    install_readiness,
    pending_of,
    readiness_checks,
    session_of,
)
from actors.registry.registration import RegistryUnavailable, SlotRefused, reserve_slot
from gateway.node.children.registry import registry_child_spec
from supervisors.errors import TableGone
from supervisors.supervisor import ChildSpec, Supervisor, SupFlags, SupSpec
from tests.support.actors import Child, Crash, Exit, Harness, actor_test
from tests.support.fake_channel import upstream_context

TABLES = (AGENTS_TABLE, PENDING_TABLE, CONNECTIONS_TABLE, SESSIONS_INDEX)


def start(h: Harness, cap: int = 8, ttl: float = 120.0, grace: float = 15.0, **kw):
    args = RegistryArgs(
        SlotPolicy(max_sessions_per_connection=cap, reservation_ttl_s=ttl),
        PendingPolicy(ttl_s=ttl, grace_s=grace),
        **kw,
    )
    return h.create(Registry, args, name=REGISTRY_NAME)


async def counts(h: Harness, registry) -> RegistryCounts:
    return await h.ask(registry, GetCounts())


async def register(h: Harness, registry, rid, conn, agent, session) -> object:  # noqa: PLR0917
    """Reserve and commit, as a Register handler does; the commit's answer (or the refusal)."""
    answer = await h.ask(registry, Reserve(rid, conn, agent))
    if not isinstance(answer, Reserved):
        return answer
    return await h.ask(registry, Commit(rid, session, peer="10.0.0.1", plugins=("p",)))


async def owner_up(h: Harness, registry, owner, session, conn, agent="agent") -> object:  # noqa: PLR0917
    return await h.ask(
        registry, OwnerUp(session, agent, owner, conn, stream_home_id="f" * 32, connected_at=1.0)
    )


# --- the flow -------------------------------------------------------------------------------------


@actor_test
async def test_register_subscribe_owner_and_unregister(h: Harness):
    registry = start(h)
    rt = h.base
    assert await h.ask(registry, Reserve(1, "c1", "agent")) == Reserved(
        1, pytest.approx(h.loop.time(), abs=1)
    )
    assert rt.table(CONNECTIONS_TABLE)["c1"] == ConnUsage(reservations=1)
    assert await h.ask(registry, Commit(1, "s1", peer="10.0.0.1", register=b"token")) == Committed(
        "s1"
    )

    # Pending: bound to the Register's connection.
    row = pending_of(rt, "s1")
    assert row is not None and (row.agent_id, row.conn_key, row.peer) == ("agent", "c1", "10.0.0.1")
    assert row.register == b"token"
    assert binding_of(rt, "s1") == Binding("c1", "pending")
    assert rt.table(CONNECTIONS_TABLE)["c1"] == ConnUsage(pending=1)
    assert admit(rt, "s1", "c1") is None
    assert admit(rt, "s1", "c2") == "connection_mismatch"
    assert admit(rt, "nope", "c1") == "unknown_session"
    assert admit(rt, "s1", None) == "no_connection"

    # Subscribe on another connection: the slot and the binding move there in one step.
    taken = await h.ask(registry, TakePending("s1", "c2"))
    assert isinstance(taken, Taken) and taken.row.session_id == "s1"
    assert pending_of(rt, "s1") is None
    assert binding_of(rt, "s1") == Binding("c2", "subscribing")
    assert admit(rt, "s1", "c2") is None and admit(rt, "s1", "c1") == "connection_mismatch"
    assert "c1" not in rt.table(CONNECTIONS_TABLE)
    assert rt.table(CONNECTIONS_TABLE)["c2"] == ConnUsage(subscribing=1)
    assert await h.ask(registry, TakePending("s1", "c2")) == TakeRefused("not_found")

    # The owner registers the live session.
    owner = h.spawn("owner")
    assert await owner_up(h, registry, owner, "s1", "c2") == OwnerRegistered("s1")
    agent = session_of(rt, "s1")
    assert agent is not None and (agent.owner, agent.conn_key, agent.stream_home_id) == (
        owner,
        "c2",
        "f" * 32,
    )
    assert binding_of(rt, "s1") == Binding("c2", "live")
    assert rt.table(CONNECTIONS_TABLE)["c2"] == ConnUsage(live=1)

    # Only the session's owner can end it.
    h.tell(registry, Unregister("s1", h.spawn("stranger")))
    await h.settle()
    assert session_of(rt, "s1") is not None
    h.tell(registry, Unregister("s1", owner))
    await h.settle()
    assert session_of(rt, "s1") is None and binding_of(rt, "s1") is None
    assert admit(rt, "s1", "c2") == "unknown_session"
    assert len(rt.table(CONNECTIONS_TABLE)) == 0
    assert await counts(h, registry) == RegistryCounts(0, 0, 0, 0, 0, 0, 8)


@actor_test
async def test_an_owner_that_ends_loses_its_session_at_once(h: Harness):
    registry = start(h)
    for end in (Exit(), Crash()):
        owner = h.spawn("owner")
        assert await owner_up(h, registry, owner, "s", "c") == OwnerRegistered("s")
        h.tell(owner, end)
        await h.settle()
        assert session_of(h.base, "s") is None
        assert admit(h.base, "s", "c") == "unknown_session"
        assert (await counts(h, registry)).agents == 0
    # An owner already dead when it registers is dropped as soon as its monitor fires.
    ghost = h.spawn("ghost")
    h.tell(ghost, Exit())
    await h.settle()
    assert await owner_up(h, registry, ghost, "g", "c") == OwnerRegistered("g")
    await h.settle()
    assert session_of(h.base, "g") is None and len(h.base.table(CONNECTIONS_TABLE)) == 0


@actor_test
async def test_a_restarted_owner_re_registers_and_replaces_the_old_one(h: Harness):
    registry = start(h)
    first, second = h.spawn("first"), h.spawn("second")
    await owner_up(h, registry, first, "s", "c")
    assert await owner_up(h, registry, second, "s", "c") == OwnerRegistered("s")
    # The first owner no longer speaks for the session: its end changes nothing.
    h.tell(first, Exit())
    await h.settle()
    assert session_of(h.base, "s").owner == second
    assert h.base.table(CONNECTIONS_TABLE)["c"] == ConnUsage(live=1)


# --- the cap --------------------------------------------------------------------------------------


@actor_test
async def test_nine_distinct_ids_then_no_leaked_slot(h: Harness):
    registry = start(h)
    answers = [await register(h, registry, i, "c", f"agent-{i}", f"s{i}") for i in range(9)]
    assert answers[:8] == [Committed(f"s{i}") for i in range(8)]
    assert answers[8] == ReserveRefused(8, "cap")
    # The 8 sessions subscribe, go live, and close: the cap is reached again exactly.
    for i in range(8):
        assert isinstance(await h.ask(registry, TakePending(f"s{i}", "c")), Taken)
        owner = h.spawn(f"o{i}")
        assert await owner_up(h, registry, owner, f"s{i}", "c") == OwnerRegistered(f"s{i}")
        h.tell(owner, Exit())
    await h.settle()
    again = [await register(h, registry, 100 + i, "c", f"agent-{i}", f"t{i}") for i in range(9)]
    assert sum(isinstance(a, Committed) for a in again) == 8
    assert again[8] == ReserveRefused(108, "cap")


@actor_test
async def test_twenty_concurrent_same_id_registers_exactly_eight_reach_upstream(h: Harness):
    """The handler-level test of the seed's review: 20 concurrent calls with one agent id at
    cap 8; 8 reach the upstream call, 12 are refused, one pending row is left."""
    start(h)
    upstream_calls = 0
    go = asyncio.Event()
    outcomes: list[str] = []

    async def handler(i: int) -> None:
        nonlocal upstream_calls
        try:
            async with reserve_slot(h.base, "conn", "same-agent") as slot:
                upstream_calls += 1
                await go.wait()  # the ProxyRegister
                committed = await slot.commit(f"session-{i}")
                outcomes.append("ok" if committed else "superseded")
        except SlotRefused as refused:
            outcomes.append(refused.reason)

    tasks = [asyncio.create_task(handler(i)) for i in range(20)]
    await h.wait_until(lambda: upstream_calls + outcomes.count("cap") == 20)
    assert upstream_calls == 8 and outcomes.count("cap") == 12
    go.set()
    await asyncio.gather(*tasks)
    # Same agent: one row is left; the others were answered superseded.
    assert outcomes.count("ok") + outcomes.count("superseded") == 8
    assert outcomes.count("ok") >= 1
    assert len(h.base.table(PENDING_TABLE)) == 1
    assert h.base.table(CONNECTIONS_TABLE)["conn"] == ConnUsage(pending=1)


@actor_test
async def test_the_same_agent_registering_forty_times_leaves_one_pending_row(h: Harness):
    registry = start(h)
    for i in range(40):
        assert await register(h, registry, i, "conn", "agent", f"s{i}") == Committed(f"s{i}")
        assert len(h.base.table(PENDING_TABLE)) == 1
    assert pending_of(h.base, "s39") is not None
    assert admit(h.base, "s38", "conn") == "unknown_session"  # the replaced row's binding went
    assert h.base.table(CONNECTIONS_TABLE)["conn"] == ConnUsage(pending=1)


@actor_test
async def test_an_older_register_committing_late_is_superseded(h: Harness, caplog):
    registry = start(h)
    assert isinstance(await h.ask(registry, Reserve("old", "c", "agent")), Reserved)
    await asyncio.sleep(0.01)  # a later stamp
    assert isinstance(await h.ask(registry, Reserve("new", "c", "agent")), Reserved)
    assert await h.ask(registry, Commit("new", "s-new")) == Committed("s-new")
    with caplog.at_level(logging.INFO, logger="yuzu_gw.registry"):
        assert await h.ask(registry, Commit("old", "s-old")) == CommitRefused()
    assert [r.getMessage() for r in caplog.records] == [SUPERSEDED_LOG]
    assert "agent" not in caplog.text and "s-old" not in caplog.text
    assert pending_of(h.base, "s-old") is None and pending_of(h.base, "s-new") is not None
    assert h.base.table(CONNECTIONS_TABLE)["c"] == ConnUsage(pending=1)


@actor_test
async def test_a_subscribe_on_a_full_connection_is_refused_and_the_row_stays(h: Harness):
    registry = start(h, cap=1)
    await register(h, registry, 1, "boot", "agent", "s")
    await register(h, registry, 2, "full", "other", "t")
    assert await h.ask(registry, TakePending("s", "full")) == TakeRefused("cap")
    assert pending_of(h.base, "s") is not None
    assert await h.ask(registry, TakePending("s", None)) == TakeRefused("no_connection")
    assert isinstance(await h.ask(registry, TakePending("s", "boot")), Taken)


@actor_test
async def test_a_taken_row_whose_owner_never_comes_is_released(h: Harness):
    registry = start(h, cap=1)
    await register(h, registry, 1, "c", "agent", "s")
    await h.ask(registry, TakePending("s", "c"))
    h.tell(registry, ReleaseTaken("s"))
    await h.settle()
    assert binding_of(h.base, "s") is None and len(h.base.table(CONNECTIONS_TABLE)) == 0
    # A live insert refused (no room on its connection) frees the take as well.
    await register(h, registry, 2, "c", "agent", "s2")
    await h.ask(registry, TakePending("s2", "c"))
    await register(h, registry, 3, "d", "x", "x")
    owner = h.spawn("owner")
    assert await owner_up(h, registry, owner, "s2", "d") == OwnerRefused("s2", "cap")
    assert binding_of(h.base, "s2") is None and "c" not in h.base.table(CONNECTIONS_TABLE)


# --- cancellation ---------------------------------------------------------------------------------


@actor_test
async def test_a_cancelled_register_releases_its_reservation_at_once(h: Harness):
    registry = start(h)
    entered = asyncio.Event()

    async def held() -> None:
        async with reserve_slot(h.base, "c", "agent"):
            entered.set()
            await asyncio.Event().wait()  # the upstream call that never ends

    task = asyncio.create_task(held())
    await entered.wait()
    assert (await counts(h, registry)).reservations == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert (await counts(h, registry)).reservations == 0

    # Cancelled while its Reserve is still in the registry's mailbox: released behind it.
    early = asyncio.create_task(held())
    await asyncio.sleep(0)  # the Reserve is sent, not yet handled
    early.cancel()
    await asyncio.gather(early, return_exceptions=True)
    await h.settle()
    assert (await counts(h, registry)).reservations == 0
    assert len(h.base.table(CONNECTIONS_TABLE)) == 0


@actor_test
async def test_a_failed_register_releases_and_refusals_are_typed(h: Harness):
    registry = start(h, cap=1)
    with pytest.raises(RuntimeError):
        async with reserve_slot(h.base, "c", "agent"):
            raise RuntimeError("upstream refused")
    assert (await counts(h, registry)).reservations == 0
    with pytest.raises(SlotRefused) as refused:
        async with reserve_slot(h.base, None, "agent"):
            pass
    assert refused.value.reason == "no_connection"
    assert await h.ask(registry, Reserve(1, "c", "a")) == Reserved(
        1, pytest.approx(h.loop.time(), abs=1)
    )
    assert await h.ask(registry, Reserve(1, "c", "a")) == ReserveRefused(1, "duplicate_request")
    h.tell(registry, Release(1))
    h.base.kill(registry)
    with pytest.raises(RegistryUnavailable):
        async with reserve_slot(h.base, "c", "agent"):
            pass


# --- connections going down, and time -------------------------------------------------------------


@actor_test
async def test_rows_of_a_closed_connection_go_after_the_grace(h: Harness):
    registry = start(h, grace=0.1)
    await register(h, registry, 1, "boot", "a", "s1")
    await register(h, registry, 2, "boot", "b", "s2")
    assert isinstance(await h.ask(registry, Reserve(3, "boot", "c")), Reserved)
    h.tell(registry, ConnectionDown("boot"))
    h.tell(registry, ConnectionDown("never-registered"))  # costs nothing
    await h.settle()
    assert h.base.table(CONNECTIONS_TABLE)["boot"].down
    # In the grace: a commit for the closed connection is refused (its answer cannot arrive),
    # a new Register there too, and the agent can still subscribe from its next connection.
    assert await h.ask(registry, Commit(3, "s3")) == CommitRefused()
    assert await h.ask(registry, Reserve(4, "boot", "d")) == ReserveRefused(4, "connection_down")
    assert isinstance(await h.ask(registry, TakePending("s2", "next")), Taken)
    assert pending_of(h.base, "s1") is not None
    await h.wait_until(lambda: pending_of(h.base, "s1") is None, timeout=2.0)
    assert binding_of(h.base, "s1") is None
    assert "boot" not in h.base.table(CONNECTIONS_TABLE)
    assert binding_of(h.base, "s2") == Binding("next", "subscribing")


@actor_test
async def test_pending_rows_reservations_and_abandoned_takes_expire(h: Harness):
    registry = start(h, ttl=0.2)
    await register(h, registry, 1, "c", "a", "row")
    assert isinstance(await h.ask(registry, Reserve(2, "c", "b")), Reserved)  # never committed
    await register(h, registry, 3, "c", "x", "taken")
    await h.ask(registry, TakePending("taken", "c"))  # no owner ever comes
    assert (await counts(h, registry)).subscribing == 1
    await h.wait_until(
        lambda: (
            len(h.base.table(CONNECTIONS_TABLE)) == 0 and len(h.base.table(SESSIONS_INDEX)) == 0
        ),
        timeout=2.0,
    )
    assert await counts(h, registry) == RegistryCounts(0, 0, 0, 0, 0, 0, 8)
    # A live session does not expire.
    owner = h.spawn("owner")
    await owner_up(h, registry, owner, "live", "c")
    await asyncio.sleep(0.3)
    assert session_of(h.base, "live") is not None


# --- a registry kill or restart -------------------------------------------------------------------


class Sup(Supervisor):
    def supervisor_spec(self, args: SupSpec) -> SupSpec:
        return args


@actor_test
async def test_a_killed_registry_takes_its_tables_and_a_restarted_one_starts_empty(h: Harness):
    readiness = Readiness()
    spec = ChildSpec(REGISTRY_NAME, Registry, RegistryArgs(readiness=readiness), name=REGISTRY_NAME)
    h.create(Sup, SupSpec(SupFlags("one_for_one", 5, 10.0), (spec,)))
    registry = h.base.whereis(REGISTRY_NAME)
    rt = h.base
    await register(h, registry, 1, "c1", "a", "pending-session")
    owner = h.spawn("owner")
    await owner_up(h, registry, owner, "live-session", "c2")
    assert admit(rt, "live-session", "c2") is None
    assert readiness.evaluate() == {"registry": True, "sessions_index": True}
    tables = {name: rt.table(name) for name in TABLES}

    h.base.kill(registry)
    # Gone with it: reads of the old tables raise, the names are free, admission fails closed.
    for name, table in tables.items():
        assert rt.table(name) is None
        with pytest.raises(TableGone):
            table.get("live-session")
    assert admit(rt, "live-session", "c2") == "registry_unavailable"
    assert session_of(rt, "live-session") is None
    assert readiness.evaluate() == {"registry": False, "sessions_index": False}

    # The supervisor restarts it, empty: the agents it held must register again.
    await h.settle()
    restarted = h.base.whereis(REGISTRY_NAME)
    assert restarted is not None and restarted != registry
    for name in TABLES:
        assert len(rt.table(name)) == 0
    assert admit(rt, "live-session", "c2") == "unknown_session"
    assert admit(rt, "pending-session", "c1") == "unknown_session"
    assert await counts(h, restarted) == RegistryCounts(0, 0, 0, 0, 0, 0, 8)
    assert readiness.evaluate() == {"registry": True, "sessions_index": True}
    # Writes stay the registry's own.
    with pytest.raises(PermissionError):
        rt.table(SESSIONS_INDEX).insert("forged", Binding("c2", "live"))


@actor_test
async def test_the_child_spec_reads_the_cap_from_the_config(h: Harness):
    ctx = upstream_context("[{max_sessions_per_connection, 2}]")
    spec = registry_child_spec(ctx)
    assert (spec.id, spec.name, spec.restart, spec.start) == (
        REGISTRY_NAME,
        REGISTRY_NAME,
        "permanent",
        Registry,
    )
    h.create(Sup, SupSpec(SupFlags("one_for_one", 1, 5.0), (spec,)))
    registry = h.base.whereis(REGISTRY_NAME)
    assert (await counts(h, registry)).max_sessions_per_connection == 2
    assert ctx.readiness.evaluate() == {"registry": True, "sessions_index": True}
    answers = [await h.ask(registry, Reserve(i, "c", "a")) for i in range(3)]
    assert answers[2] == ReserveRefused(2, "cap")


@actor_test
async def test_readiness_checks_install_once(h: Harness):
    readiness = Readiness()
    install_readiness(readiness, h.base)
    install_readiness(readiness, h.base)
    assert readiness.names() == ["registry", "sessions_index"]
    assert readiness.evaluate() == {"registry": False, "sessions_index": False}
    start(h)
    assert {name: check() for name, check in readiness_checks(h.base).items()} == {
        "registry": True,
        "sessions_index": True,
    }


@actor_test
async def test_format_status_shows_counts_only(h: Harness):
    registry = start(h)
    await register(h, registry, 1, "c", "secret-agent", "secret-session")
    status = h.instance(registry).format_status()
    assert status == {
        "agents": 0,
        "pending": 1,
        "reservations": 0,
        "subscribing": 0,
        "connections": 1,
        "connections_down": 0,
        "max_sessions_per_connection": 8,
    }
    assert "secret" not in repr(status)


# --- admission while an owner recovers ------------------------------------------------------------


class OwnersTableHolder(Child):
    """Stands in for the root supervisor, which owns the public owner table."""

    def init(self, args: object) -> None:
        super().init(args)
        self.new_table(OWNERS_TABLE, "public")


class OwnerRow:
    def __init__(self, owner, conn_key, state) -> None:
        self.owner, self.conn_key, self.state = owner, conn_key, state


@actor_test
async def test_admission_covers_a_dead_or_recovering_owner_but_not_a_registry_restart(
    h: Harness,
):
    registry = start(h)
    h.create(OwnersTableHolder)
    owners = h.base.table(OWNERS_TABLE)
    dead = h.spawn("dead")
    h.tell(dead, Exit())
    alive = h.spawn("alive")
    await h.settle()

    owners.insert("crashed", OwnerRow(dead, "c", "live"))
    owners.insert("recovering", OwnerRow(alive, "c", "recovering"))
    owners.insert("live-missing", OwnerRow(alive, "c", "live"))
    owners.insert("ending", OwnerRow(dead, "c", "ending"))
    owners.insert("superseded", OwnerRow(alive, "c", "superseded"))
    assert admit(h.base, "crashed", "c") is None  # its restart has not re-registered yet
    assert admit(h.base, "recovering", "c") is None
    assert admit(h.base, "crashed", "other") == "unknown_session"
    # A live owner the registry does not hold: the registry restarted; fail closed (ADM-09).
    assert admit(h.base, "live-missing", "c") == "unknown_session"
    assert admit(h.base, "ending", "c") == "unknown_session"
    assert admit(h.base, "superseded", "c") == "unknown_session"
    # The registry's binding, when there is one, decides.
    await owner_up(h, registry, alive, "recovering", "elsewhere")
    assert admit(h.base, "recovering", "c") == "connection_mismatch"


async def readopt(h: Harness, registry, owner, session, since, agent="agent") -> object:  # noqa: PLR0917
    """A restarted owner's OwnerUp: the session again, first registered at `since`."""
    up = OwnerUp(session, agent, owner, "c", stream_home_id="f" * 32, since=since)
    return await h.ask(registry, up)


@actor_test
async def test_a_readopted_session_whose_agent_has_a_newer_one_is_refused_superseded(h: Harness):
    # Seed, "When an agent's owner process crashes", step 3: a restarted owner whose agent
    # registered a newer session meanwhile does not register the old one again.
    registry = start(h)
    rt = h.base
    first = h.spawn("first")
    answer = await owner_up(h, registry, first, "s1", "c")
    assert isinstance(answer, OwnerRegistered)
    since = answer.since
    assert since == pytest.approx(h.loop.time(), abs=1)
    assert session_of(rt, "s1").since == since  # type: ignore[union-attr]
    h.base.kill(first)
    await h.settle()
    newer = h.spawn("newer")
    await owner_up(h, registry, newer, "s2", "c")
    restarted = h.spawn("restarted")
    assert await readopt(h, registry, restarted, "s1", since) == OwnerRefused("s1", "superseded")
    assert session_of(rt, "s1") is None and binding_of(rt, "s1") is None
    assert agent_session(rt, "agent").session_id == "s2"  # type: ignore[union-attr]
    assert rt.table(CONNECTIONS_TABLE)["c"] == ConnUsage(live=1)

    # A Register of the agent that no stream has taken yet is newer too.
    await register(h, registry, 1, "c", "other", "t2")
    assert await readopt(h, registry, restarted, "t1", since, agent="other") == OwnerRefused(
        "t1", "superseded"
    )
    assert session_of(rt, "t1") is None
    # So is one a Subscribe took whose owner has not registered it yet; once that owner has
    # registered it, it is a newer live session.
    assert isinstance(await h.ask(registry, TakePending("t2", "c")), Taken)
    assert await readopt(h, registry, restarted, "t1", since, agent="other") == OwnerRefused(
        "t1", "superseded"
    )
    await owner_up(h, registry, h.spawn("t2-owner"), "t2", "c", agent="other")
    assert await readopt(h, registry, restarted, "t1", since, agent="other") == OwnerRefused(
        "t1", "superseded"
    )
    assert agent_session(rt, "other").session_id == "t2"  # type: ignore[union-attr]

    # An older live session of the agent does not supersede a newer one being recovered: it is
    # registered again under its first time and the index names it (the newest).
    h.base.kill(newer)
    await h.settle()
    old = h.spawn("old")
    await owner_up(h, registry, old, "u0", "c", agent="third")
    later = since + 5.0
    answer = await readopt(h, registry, restarted, "u1", later, agent="third")
    assert answer == OwnerRegistered("u1") and answer.since == later  # type: ignore[union-attr]
    assert agent_session(rt, "third").session_id == "u1"  # type: ignore[union-attr]
