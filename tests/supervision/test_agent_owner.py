"""The agent owner under `agent_sup`, with the real registry and a fake `upstream` that records
what it is told: registration, the owner-table row, CONNECTED and exactly one DISCONNECTED with
the same stream home id, commands to the stream and answers back, Guardian forwarding with the
gateway-asserted agent id, a stuck stream, a refused registration, crashes, kills and the restart
intensity from the configuration (SPEC_INDEX OC-01, OC-02, OC-07; seed "Subscribe Stream Proxy",
"Stream Status Notification", "When an agent's owner process crashes").

The lifecycle's rules are proved in tests/unit/actors/core/test_owner_lifecycle.py; these tests
check the
wiring.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import attrs
from grpclib.const import Status

from actors.agents.api import (
    AGENT_SUP_NAME,
    OWNERS_TABLE,
    AgentFrame,
    CommandAnswer,
    CommandFailed,
    DeliverCommand,
    ForgetCommand,
    OwnerArgs,
    OwnerRow,
    StreamClosed,
    StreamEnd,
    StreamHandle,
    create_owner_table,
    owner_row,
)
from actors.agents.owner import AgentOwner
from actors.agents.sup import AgentSup
from actors.core.notify_store import Event
from actors.core.owner_lifecycle import (
    OWNER_CONFLICT_DETAILS,
    REFUSED_DETAILS,
    STOPPING_DETAILS,
    STUCK_DETAILS,
)
from actors.registry.actor import Registry, RegistryArgs
from actors.registry.api import (
    AGENTS_BY_ID,
    CONNECTIONS_TABLE,
    REGISTRY_NAME,
    Binding,
    Commit,
    Committed,
    ConnectionDown,
    ConnUsage,
    GetCounts,
    RegistryCounts,
    Reserve,
    Reserved,
    Taken,
    TakePending,
    admit,
    agent_session,
    binding_of,
    session_of,
)
from actors.upstream.api import (
    UPSTREAM_NAME,
    DisconnectSettled,
    ForwardGuardian,
    NotificationsPosted,
    Notify,
    PresentSession,
    SessionPresented,
    SettleDisconnected,
    create_notify_hold,
    notify_hold,
)
from gateway.node.children.agents import agent_sup_args, agent_sup_child_spec
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.address import Address
from supervisors.api import count_children, restart_child, start_child, terminate_child
from supervisors.supervisor import ChildSpec, Supervisor, SupFlags, SupSpec
from tests.support.actors import Args, Child, Harness, actor_test
from tests.support.fake_channel import upstream_context

UNAVAILABLE = Status.UNAVAILABLE.value
Response = agent_pb2.CommandResponse


class Root(Supervisor):
    """The test tree's root: owns the owner table and the notification hold, as gateway_sup
    does."""

    def supervisor_spec(self, args: Any) -> SupSpec:
        create_owner_table(self)
        create_notify_hold(self)
        assert isinstance(args, SupSpec)
        return args


class FakeUpstream(Child):
    """Records what it is told, the owners' posts in the notification hold included (taken on
    `NotificationsPosted` and when it starts, as the `upstream` actor does)."""

    def init(self, args: Any) -> None:
        super().init(args)
        self._take()

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        if isinstance(msg, NotificationsPosted):
            self._take()
        else:
            super().receiveMessage(msg, sender)

    def _take(self) -> None:
        hold = notify_hold(self.runtime)
        assert hold is not None
        self.inbox.extend(msg for msg, _sender in hold.take())


@attrs.define
class Tree:
    h: Harness
    root: Address
    upstream_inbox: list[Any]
    rids: int = 0

    @property
    def agent_sup(self) -> Address:
        address = self.h.base.whereis(AGENT_SUP_NAME)
        assert address is not None
        return address

    @property
    def registry(self) -> Address:
        address = self.h.base.whereis(REGISTRY_NAME)
        assert address is not None
        return address

    def notes(self, event: Event | None = None) -> list[Notify]:
        return [
            m
            for m in self.upstream_inbox
            if isinstance(m, Notify) and (event is None or m.event is event)
        ]

    async def register(self, session: str, conn: Any = "c1", agent: str = "agent-1") -> None:
        """Store the pending row, as the Register handler does."""
        self.rids += 1
        reserved = await self.h.ask(self.registry, Reserve(self.rids, conn, agent))
        assert isinstance(reserved, Reserved)
        commit = Commit(self.rids, session, peer="10.0.0.9", register=agent_pb2.RegisterRequest())
        assert await self.h.ask(self.registry, commit) == Committed(session)

    async def take(self, session: str, conn: str = "c1", agent: str = "agent-1") -> None:
        """Register and take the pending row, as the Register and Subscribe handlers do."""
        await self.register(session, conn, agent)
        assert isinstance(await self.h.ask(self.registry, TakePending(session, conn)), Taken)

    def held(self, conn: Any) -> ConnUsage | None:
        """The slots `conn` holds in the registry (None: none)."""
        table = self.h.base.table(CONNECTIONS_TABLE)
        assert table is not None
        usage = table.get(conn)
        assert usage is None or isinstance(usage, ConnUsage)
        return usage

    async def owner(
        self,
        session: str = "s1",
        conn: str = "c1",
        agent: str = "agent-1",
        stream: StreamHandle | None = None,
        take: bool = True,
    ) -> tuple[Address, StreamHandle]:
        if take:
            await self.take(session, conn, agent)
        stream = stream if stream is not None else StreamHandle()
        args = OwnerArgs(
            session_id=session,
            agent_id=agent,
            conn_key=conn,
            peer="10.0.0.9:5555",
            register=agent_pb2.RegisterRequest(),
            stream=stream,
            plugins=("shell",),
        )
        owner = await start_child(self.h.base, self.agent_sup, args)
        await self.h.settle()
        return owner, stream

    async def children(self) -> int:
        return (await count_children(self.h.base, self.agent_sup)).active


def tree(
    h: Harness,
    sup_args: Any = None,
    registry: type[Registry] = Registry,
    sup: type[Supervisor] = AgentSup,
) -> Tree:
    """The registry, a fake `upstream` that records what it is told, and the owners'
    supervisor (`registry` and `sup`: test doubles of theirs, registered by the same names)."""
    inbox: list[Any] = []
    spec = SupSpec(
        SupFlags("one_for_one", 10, 60.0),
        (
            ChildSpec(REGISTRY_NAME, registry, RegistryArgs(), name=REGISTRY_NAME),
            ChildSpec(
                UPSTREAM_NAME,
                FakeUpstream,
                Args(id=UPSTREAM_NAME, inbox=inbox),
                name=UPSTREAM_NAME,
            ),
            ChildSpec(
                AGENT_SUP_NAME,
                sup,
                sup_args if sup_args is not None else agent_sup_args(context()),
                type="supervisor",
                name=AGENT_SUP_NAME,
            ),
        ),
    )
    return Tree(h, h.create(Root, spec), inbox)


def context(terms: str = "") -> Any:
    """A node context from these config terms (no listeners: nothing binds here)."""
    return upstream_context("[{allow_no_listeners, true}" + (", " + terms if terms else "") + "]")


def drain(stream: StreamHandle) -> list[Any]:
    out = []
    while (item := stream.take_nowait()) is not None:
        out.append(item)
    return out


def crash(h: Harness, owner: Address) -> None:
    """Make the owner raise on its next message (a defect), then send it one."""

    def boom(msg: Any, sender: Address) -> None:
        raise RuntimeError("boom")

    h.instance(owner).receiveMessage = boom
    h.tell(owner, "anything")


# --- the session ----------------------------------------------------------------------------------


@actor_test
async def test_owner_registers_writes_its_row_and_announces_once(h: Harness, caplog):
    caplog.set_level(logging.INFO, logger="yuzu_gw.agent")
    t = tree(h)
    owner, stream = await t.owner()
    home = h.instance(owner).stream_home_id
    assert re.fullmatch(r"[0-9a-f]{32}", home)

    row = session_of(h.base, "s1")
    assert row is not None and (row.owner, row.stream_home_id) == (owner, home)
    assert row.peer == "10.0.0.9:5555" and row.plugins == ("shell",)
    assert owner_row(h.base, "s1") == OwnerRow(owner, "s1", "agent-1", "c1", home, "live")
    assert t.notes() == [Notify("agent-1", "s1", home, Event.CONNECTED, "10.0.0.9:5555")]
    assert admit(h.base, "s1", "c1") is None
    assert "Agent agent-1 connected from 10.0.0.9:5555" in caplog.messages

    # Counts only: no session id, agent id, peer or request in the status.
    status = h.instance(owner).format_status()
    assert status["phase"] == "streaming"
    assert not any(s in repr(status) for s in ("s1", "agent-1", "10.0.0.9"))

    # The agent goes away: exactly one DISCONNECTED with the same stream home id.
    h.tell(owner, StreamClosed())
    await h.settle()
    assert not h.alive(owner)
    assert t.notes(Event.DISCONNECTED) == [
        Notify("agent-1", "s1", home, Event.DISCONNECTED, "10.0.0.9:5555")
    ]
    assert len(t.notes()) == 2
    assert session_of(h.base, "s1") is None
    assert owner_row(h.base, "s1") is None
    assert not stream.ended  # nobody to tell: the agent already went away
    assert await t.children() == 0  # a normal end is not restarted (OC-01)


@actor_test
async def test_a_disconnected_posted_while_upstream_restarts_reaches_the_next_one(h: Harness):
    # The notification hold outlives the upstream actor: an owner ending while it is down
    # posts its DISCONNECTED there, and the restarted actor takes it as it starts.
    t = tree(h)
    owner, _stream = await t.owner()
    await terminate_child(h.base, t.root, UPSTREAM_NAME)
    h.tell(owner, StreamClosed())
    await h.settle()
    assert [n.event for n in t.notes()] == [Event.CONNECTED]
    await restart_child(h.base, t.root, UPSTREAM_NAME)
    await h.settle()
    assert [n.event for n in t.notes()] == [Event.CONNECTED, Event.DISCONNECTED]


@actor_test
async def test_two_sessions_have_their_own_stream_home_ids(h: Harness):
    t = tree(h)
    a, _ = await t.owner("s1", "c1", "agent-1")
    b, _ = await t.owner("s2", "c2", "agent-2")
    homes = {h.instance(a).stream_home_id, h.instance(b).stream_home_id}
    assert len(homes) == 2
    assert {n.stream_home_id for n in t.notes(Event.CONNECTED)} == homes


@actor_test
async def test_planned_stop_sends_disconnected_and_ends_the_stream(h: Harness):
    t = tree(h)
    owner, stream = await t.owner()
    home = h.instance(owner).stream_home_id
    await terminate_child(h.base, t.agent_sup, owner, timeout=2.0)
    await h.settle()
    assert [n.stream_home_id for n in t.notes(Event.DISCONNECTED)] == [home]
    # UNAVAILABLE; when to come back is the stream process's to say, from its connection's
    # GOAWAY (a planned stop drains the listeners first: tests/integration/test_planned_stop.py).
    [end] = drain(stream)
    assert (end.status, end.details, end.trailers) == (UNAVAILABLE, STOPPING_DETAILS, ())
    assert owner_row(h.base, "s1") is None and session_of(h.base, "s1") is None
    assert await t.children() == 0


# --- commands -------------------------------------------------------------------------------------


@actor_test
async def test_commands_reach_the_stream_and_answers_the_caller(h: Harness):
    t = tree(h)
    owner, stream = await t.owner()
    inbox: list[Any] = []
    router = h.spawn("router", inbox=inbox)
    command = agent_pb2.CommandRequest(command_id="c1", plugin="shell", action="run")
    h.tell(owner, DeliverCommand(command, reply_to=router))
    await h.settle()
    assert drain(stream) == [command]

    running = Response(command_id="c1", status=Response.Status.RUNNING, output="half")
    done = Response(command_id="c1", status=Response.Status.SUCCESS, output="done")
    for response in (running, done, done):  # the third has nobody waiting: dropped
        h.tell(owner, AgentFrame(response))
    await h.settle()
    assert inbox == [CommandAnswer("agent-1", running), CommandAnswer("agent-1", done)]
    status = h.instance(owner).format_status()
    assert (status["delivered"], status["answers"], status["unmatched_frames"]) == (1, 2, 1)

    # A caller that stops waiting gets nothing more; what is still waiting at the end fails.
    h.tell(owner, DeliverCommand(agent_pb2.CommandRequest(command_id="c2"), reply_to=router))
    h.tell(owner, DeliverCommand(agent_pb2.CommandRequest(command_id="c3"), reply_to=router))
    h.tell(owner, ForgetCommand("c2"))
    h.tell(owner, AgentFrame(Response(command_id="c2", status=Response.Status.SUCCESS)))
    h.tell(owner, StreamClosed())
    await h.settle()
    assert inbox[2:] == [CommandFailed("agent-1", "c3", "agent_disconnected")]


@actor_test
async def test_guardian_frame_goes_upstream_with_the_owners_agent_id(h: Harness):
    t = tree(h)
    owner, _ = await t.owner(agent="agent-1")
    # The frame cannot carry an identity the gateway trusts: whatever it says, the forward names
    # the agent this stream registered as.
    frame = Response(plugin="__guard__", action="agent-666", output='{"agent_id": "agent-666"}')
    h.tell(owner, AgentFrame(frame))
    await h.settle()
    forwards = [m for m in t.upstream_inbox if isinstance(m, ForwardGuardian)]
    assert forwards == [ForwardGuardian("agent-1", frame)]
    # A __guard__ frame with a command id is an answer, not an unsolicited event.
    h.tell(owner, AgentFrame(Response(plugin="__guard__", command_id="x")))
    await h.settle()
    assert len([m for m in t.upstream_inbox if isinstance(m, ForwardGuardian)]) == 1


@actor_test
async def test_a_full_stream_is_ended_as_stuck(h: Harness):
    t = tree(h)
    owner, stream = await t.owner(stream=StreamHandle(maxsize=2))
    home = h.instance(owner).stream_home_id
    inbox: list[Any] = []
    router = h.spawn("router", inbox=inbox)
    for n in range(3):
        cmd = agent_pb2.CommandRequest(command_id=f"c{n}")
        h.tell(owner, DeliverCommand(cmd, reply_to=router))
    await h.settle()
    assert not h.alive(owner)
    assert CommandFailed("agent-1", "c2", "stream_stuck") in inbox
    assert {m.command_id for m in inbox if m.reason == "agent_disconnected"} == {"c0", "c1"}
    assert [n.stream_home_id for n in t.notes(Event.DISCONNECTED)] == [home]
    assert drain(stream)[-1] == StreamEnd(UNAVAILABLE, STUCK_DETAILS)
    assert await t.children() == 0


# --- refusals and restarts ------------------------------------------------------------------------


@actor_test
async def test_refused_registration_ends_the_stream_and_exits_normal(h: Harness):
    t = tree(h)
    await t.take("s1", "c1")
    h.tell(t.registry, ConnectionDown("c1"))
    owner, stream = await t.owner(take=False)
    assert not h.alive(owner)
    assert drain(stream) == [StreamEnd(UNAVAILABLE, REFUSED_DETAILS["connection_down"])]
    assert t.notes() == []  # never announced, so nothing to take back
    assert owner_row(h.base, "s1") is None
    assert await t.children() == 0


@actor_test
async def test_an_ended_stream_makes_the_owner_exit_at_init(h: Harness):
    t = tree(h)
    stream = StreamHandle()
    stream.close(StreamEnd(UNAVAILABLE, "gone"))
    owner, _ = await t.owner(stream=stream)
    assert not h.alive(owner)
    assert t.notes() == [] and session_of(h.base, "s1") is None
    assert await t.children() == 0
    # The agent left while this owner started: nobody will register the session, so the slot
    # the Subscribe took and the heartbeat binding go now, not at the take's 120 s expiry.
    assert t.held("c1") is None
    assert binding_of(h.base, "s1") is None and admit(h.base, "s1", "c1") == "unknown_session"


@actor_test
async def test_a_second_owner_of_a_held_session_gives_the_slot_back_at_once(h: Harness):
    t = tree(h)
    first, _ = await t.owner("s1", "c1")
    home = h.instance(first).stream_home_id
    # The session taken again on another connection while its owner runs (the two-owners
    # conflict): the second owner leaves the first's row, notifications and registration alone.
    second, stream = await t.owner("s1", "c2")
    assert not h.alive(second)
    assert drain(stream) == [StreamEnd(UNAVAILABLE, OWNER_CONFLICT_DETAILS)]
    assert t.held("c2") is None  # not held against c2's cap for 120 s
    assert t.held("c1") == ConnUsage(live=1)
    assert binding_of(h.base, "s1") == Binding("c1", "live")
    # When the first owner ends, no heartbeat for the session is admitted on c2, and the
    # first owner's DISCONNECTED went out once.
    h.tell(first, StreamClosed())
    await h.settle()
    assert binding_of(h.base, "s1") is None and admit(h.base, "s1", "c2") == "unknown_session"
    assert [(n.event, n.stream_home_id) for n in t.notes()] == [
        (Event.CONNECTED, home),
        (Event.DISCONNECTED, home),
    ]
    counts = await h.ask(t.registry, GetCounts())
    assert isinstance(counts, RegistryCounts)
    assert (counts.agents, counts.subscribing, counts.connections) == (0, 0, 0)


def settle_requests(t: Tree) -> list[SettleDisconnected]:
    return [m for m in t.upstream_inbox if isinstance(m, SettleDisconnected)]


def present_requests(t: Tree) -> list[PresentSession]:
    return [m for m in t.upstream_inbox if isinstance(m, PresentSession)]


@actor_test
async def test_a_crashed_owners_restart_recovers_the_session_on_the_same_stream(h: Harness):
    # The recovery's wiring (docs/owner-recovery.md); the rules:
    # tests/unit/actors/core/test_owner_recovery.py.
    t = tree(h)
    owner, stream = await t.owner()
    home = h.instance(owner).stream_home_id
    crash(h, owner)
    await h.settle()
    # The crashed owner left the row, the DISCONNECTED and the stream to its restart, which
    # took the row over (`recovering`, so heartbeats stay admitted) and sent the DISCONNECTED.
    restarted = owner_row(h.base, "s1")
    assert restarted is not None and restarted.owner != owner
    assert (restarted.state, restarted.stream_home_id) == ("recovering", home)
    assert admit(h.base, "s1", "c1") is None
    assert [
        (n.agent_id, n.session_id, n.stream_home_id, n.event)
        for n in (m.notify for m in settle_requests(t))
    ] == [("agent-1", "s1", home, Event.DISCONNECTED)]
    assert drain(stream) == [] and not stream.ended
    assert h.instance(t.agent_sup).format_status()["restarts_in_window"] == 1
    # Settled: registered again, then presented to the server again...
    h.tell(restarted.owner, DisconnectSettled("s1", "delivered"))
    await h.settle()
    assert session_of(h.base, "s1") is not None
    [present] = present_requests(t)
    assert (present.session_id, present.agent_id) == ("s1", "agent-1")
    # ...and, adopted, CONNECTED again with the same stream home id.
    h.tell(restarted.owner, SessionPresented("s1", True))
    await h.settle()
    assert [(n.event, n.stream_home_id) for n in t.notes()] == [
        (Event.CONNECTED, home),
        (Event.CONNECTED, home),
    ]
    row = owner_row(h.base, "s1")
    assert row is not None and row.state == "live" and row.restarts == restarted.restarts
    cmd = agent_pb2.CommandRequest(command_id="after")
    h.tell(restarted.owner, DeliverCommand(cmd))
    await h.settle()
    assert drain(stream) == [cmd]


@actor_test
async def test_a_killed_owners_restart_that_cannot_present_the_session_ends_it(h: Harness):
    t = tree(h)
    owner, stream = await t.owner()
    home = h.instance(owner).stream_home_id
    h.base.kill(owner)  # no terminate: the row says a DISCONNECTED is owed
    await h.settle()
    [settle] = settle_requests(t)
    assert (settle.notify.event, settle.notify.stream_home_id) == (Event.DISCONNECTED, home)
    restarted = owner_row(h.base, "s1")
    assert restarted is not None
    h.tell(restarted.owner, DisconnectSettled("s1", "delivered"))
    await h.settle()
    h.tell(restarted.owner, SessionPresented("s1", False, "refused", "not_accepted"))
    await h.settle()
    # The DISCONNECTED went once (with the settle request); the agent registers again.
    assert [n.event for n in t.notes()] == [Event.CONNECTED]
    assert drain(stream) == [StreamEnd(UNAVAILABLE, "refused")]
    assert owner_row(h.base, "s1") is None and session_of(h.base, "s1") is None
    assert await t.children() == 0


@actor_test
async def test_intensity_comes_from_the_config_and_escalates(h: Harness):
    ctx = context("{agent_restart_intensity, 2}, {agent_restart_period_s, 30}")
    assert agent_sup_child_spec(ctx).args == agent_sup_args(ctx)
    t = tree(h, agent_sup_args(ctx))
    first_sup = t.agent_sup
    assert h.instance(first_sup).flags == SupFlags("simple_one_for_one", 2, 30.0)
    owners = [(await t.owner(f"s{n}", f"c{n}"))[0] for n in range(4)]
    for owner in owners[:3]:
        h.base.kill(owner)
        await h.settle()
    # The third restart passes the intensity: agent_sup stops the owners still running (which
    # settle their sessions) and the root starts a new agent_sup, which restarts an owner for
    # the one orphaned session (the third killed owner's row).
    assert t.agent_sup != first_sup
    assert await t.children() == 1
    disconnected = {n.session_id for n in t.notes(Event.DISCONNECTED)}
    assert disconnected == {"s3"}  # the running owner, on the way down
    # s0 and s1 were restarted and sent their DISCONNECTED before they were stopped; the
    # orphan's restart sends s2's.
    assert sorted(m.notify.session_id for m in settle_requests(t)) == ["s0", "s1", "s2"]
    orphan = owner_row(h.base, "s2")
    assert orphan is not None and orphan.owner != owners[2] and orphan.state == "recovering"
    assert admit(h.base, "s2", "c2") is None
    assert owner_row(h.base, "s0") is None and owner_row(h.base, "s1") is None
    assert h.base.table(OWNERS_TABLE) is not None  # the root owns it, not agent_sup


@actor_test
async def test_default_intensity_is_the_seeds(h: Harness):
    sup = h.create(AgentSup, agent_sup_args(context()))
    assert h.instance(sup).flags == SupFlags("simple_one_for_one", 2000, 10.0)
    assert h.instance(sup).template.restart == "transient"
    assert h.instance(sup).template.start is AgentOwner


@actor_test
async def test_a_restarted_owner_superseded_by_a_newer_session_neither_registers_nor_presents(
    h: Harness,
):
    # Seed, "When an agent's owner process crashes", step 3: the agent registered a newer
    # session meanwhile, so the restarted owner ends after the DISCONNECTED; the registry never
    # indexes the old session again and commands go to the live stream.
    t = tree(h)
    owner, stream = await t.owner("s1", "c1")
    home = h.instance(owner).stream_home_id
    h.base.kill(owner)
    await h.settle()
    restarted = owner_row(h.base, "s1")
    assert restarted is not None and restarted.state == "recovering"
    # Before the DISCONNECTED settles, the agent registers s2 on a new connection and subscribes.
    newer, newer_stream = await t.owner("s2", "c2")
    h.tell(restarted.owner, DisconnectSettled("s1", "delivered"))
    await h.settle()

    assert present_requests(t) == []
    assert not h.alive(restarted.owner)
    assert drain(stream) == [StreamEnd(UNAVAILABLE, REFUSED_DETAILS["superseded"])]
    assert session_of(h.base, "s1") is None and binding_of(h.base, "s1") is None
    assert admit(h.base, "s1", "c1") == "unknown_session"
    assert owner_row(h.base, "s1") is None
    live = agent_session(h.base, "agent-1")
    assert live is not None and (live.session_id, live.owner) == ("s2", newer)
    assert h.base.table(AGENTS_BY_ID).get("agent-1") == "s2"  # type: ignore[union-attr]
    # A command for the agent reaches s2's stream (the router resolves it the same way).
    cmd = agent_pb2.CommandRequest(command_id="after")
    h.tell(live.owner, DeliverCommand(cmd))
    await h.settle()
    assert drain(newer_stream) == [cmd]
    # s1: one CONNECTED, one DISCONNECTED (the settled one), nothing announced again.
    assert [m.notify.session_id for m in settle_requests(t)] == ["s1"]
    s1_notes = [(n.event, n.stream_home_id) for n in t.notes() if n.session_id == "s1"]
    assert s1_notes == [(Event.CONNECTED, home)]
    assert await t.children() == 1
    counts = await h.ask(t.registry, GetCounts())
    assert isinstance(counts, RegistryCounts) and counts.agents == 1
    assert t.held("c1") is None
