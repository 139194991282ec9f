"""The router actor (actors/router/actor.py) with the real registry, real owners under `agent_sup`
and a
recording sink in place of the SendCommand handler: fan-out, answers in order, the gateway's own
terminal answers (not_connected, agent_disconnected, duplicate_command_id, TIMEOUT), the timeout
clamp read per command, abandonment, the owner's duplicate rule, the agents_by_id index, the
WatchEvents publish point, and a crash that leaks nothing. The rules themselves are proved in
tests/unit/actors/core/test_router_core.py; these tests check the wiring."""

from __future__ import annotations

import logging
from typing import Any

import attrs

from actors.agents.api import (
    AGENT_SUP_NAME,
    AgentFrame,
    CommandFailed,
    DeliverCommand,
    ForgetCommand,
    OwnerArgs,
    StreamClosed,
    StreamHandle,
    create_owner_table,
)
from actors.agents.sup import AgentSup
from actors.agents.watch import WATCHERS_TABLE, Watcher, create_watch_table
from actors.node.api import StopRouting
from actors.registry.actor import Registry, RegistryArgs
from actors.registry.api import (
    REGISTRY_NAME,
    Commit,
    OwnerUp,
    Reserve,
    TakePending,
    agent_session,
    held_agent_ids,
)
from actors.router.actor import Router, RouterArgs
from actors.router.api import ROUTER_NAME, AbandonCommand, LocalRouteCommand, RouteCommand
from actors.upstream.api import UPSTREAM_NAME
from gateway.node.children.agents import agent_sup_args
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2
from supervisors.address import Address
from supervisors.api import start_child
from supervisors.supervisor import ChildSpec, Supervisor, SupFlags, SupSpec
from tests.support.actors import Args, Child, Harness, actor_test
from tests.support.fake_channel import upstream_context

Response = agent_pb2.CommandResponse
S = Response.Status
MARKER = "param-marker-5f3a"


class Root(Supervisor):
    """The test tree's root: owns the owner and watcher tables, as gateway_sup does."""

    def supervisor_spec(self, args: Any) -> SupSpec:
        create_owner_table(self)
        create_watch_table(self)
        assert isinstance(args, SupSpec)
        return args


class Sink:
    """The handler's side, recorded."""

    def __init__(self) -> None:
        self.puts: list[tuple[str, int, str, str, bool]] = []
        self.raw: list[management_pb2.SendCommandResponse] = []
        self.outcome: str | None = None

    def put(self, response: management_pb2.SendCommandResponse, kind: str, final: bool) -> None:
        self.raw.append(response)
        answer = response.response
        self.puts.append((response.agent_id, answer.status, answer.output, kind, final))

    def finish(self, outcome: str) -> None:
        assert self.outcome is None, "finished twice"
        self.outcome = outcome


@attrs.define
class Tree:
    h: Harness
    root: Address
    rids: int = 0

    def whereis(self, name: str) -> Address:
        address = self.h.base.whereis(name)
        assert address is not None
        return address

    async def take(self, session: str, agent: str, conn: str) -> None:
        self.rids += 1
        registry = self.whereis(REGISTRY_NAME)
        await self.h.ask(registry, Reserve(self.rids, conn, agent))
        await self.h.ask(registry, Commit(self.rids, session, peer="10.0.0.9"))
        await self.h.ask(registry, TakePending(session, conn))

    async def agent(self, agent: str, session: str | None = None) -> tuple[Address, StreamHandle]:
        """A real owner for `agent`, on its own connection; its stream stands in for the agent."""
        session = session or f"s-{agent}-{self.rids}"
        await self.take(session, agent, f"conn-{session}")
        stream = StreamHandle()
        register = agent_pb2.RegisterRequest()
        register.info.agent_id = agent
        register.info.hostname = f"host-{agent}"
        args = OwnerArgs(session, agent, f"conn-{session}", "10.0.0.9:1", register, stream)
        owner = await start_child(self.h.base, self.whereis(AGENT_SUP_NAME), args)
        await self.h.settle()
        return owner, stream

    async def fake_owner(self, agent: str) -> tuple[Address, list[Any]]:
        """A `Child` registered as `agent`'s owner: its inbox shows what the router sends."""
        session = f"f-{agent}"
        await self.take(session, agent, f"conn-{session}")
        inbox: list[Any] = []
        child = self.h.spawn(agent, inbox=inbox)
        up = OwnerUp(session, agent, child, f"conn-{session}", stream_home_id="a" * 32)
        await self.h.ask(self.whereis(REGISTRY_NAME), up)
        return child, inbox

    def route(
        self, command: agent_pb2.CommandRequest, agents: tuple[str, ...] = (), timeout: int = 60
    ) -> Sink:
        sink = Sink()
        self.h.tell(self.whereis(ROUTER_NAME), RouteCommand(command, agents, timeout, sink))
        return sink


def tree(h: Harness, default_timeout: object = 300) -> Tree:
    spec = SupSpec(
        SupFlags("one_for_one", 10, 60.0),
        (
            ChildSpec(REGISTRY_NAME, Registry, RegistryArgs(), name=REGISTRY_NAME),
            ChildSpec(UPSTREAM_NAME, Child, Args(id=UPSTREAM_NAME), name=UPSTREAM_NAME),
            ChildSpec(
                AGENT_SUP_NAME,
                AgentSup,
                agent_sup_args(upstream_context()),
                type="supervisor",
                name=AGENT_SUP_NAME,
            ),
            ChildSpec(ROUTER_NAME, Router, RouterArgs(lambda: default_timeout), name=ROUTER_NAME),
        ),
    )
    return Tree(h, h.create(Root, spec))


def drain(stream: StreamHandle) -> list[Any]:
    out = []
    while (item := stream.take_nowait()) is not None:
        out.append(item)
    return out


def command(command_id: str = "c1") -> agent_pb2.CommandRequest:
    return agent_pb2.CommandRequest(
        command_id=command_id,
        plugin="shell",
        action="run",
        parameters={"secret": MARKER},
        payload=b"\x00\x01payload",
        dispatch_tag="tag-7",
    )


# --- fan-out and answers --------------------------------------------------------------------------


@actor_test
async def test_round_trip_mixed_targets_in_order(h: Harness):
    t = tree(h)
    _, s1 = await t.agent("a1")
    owner2, s2 = await t.agent("a2")
    cmd = command()
    sink = t.route(cmd, ("a1", "ghost", "a2", "a1"))
    await h.settle()
    # Each held target's stream got the command untouched (payload and dispatch_tag included),
    # once even though a1 was named twice; the unknown target is answered at once.
    assert drain(s1) == [cmd] and drain(s2) == [cmd]
    assert sink.puts == [("ghost", S.FAILURE, "not_connected", "not_connected", True)]

    running = Response(command_id="c1", status=S.RUNNING, output="half")
    for frame in (running, Response(command_id="c1", status=S.SUCCESS, output="done")):
        h.tell(owner2, AgentFrame(frame))
    await h.settle()
    assert sink.puts[1:] == [
        ("a2", S.RUNNING, "half", "agent", False),
        ("a2", S.SUCCESS, "done", "agent", True),
    ]
    assert sink.raw[1].response == running  # the agent's frame, forwarded as it came
    assert sink.outcome is None  # a1 still owes
    owner1 = agent_session(h.base, "a1")
    assert owner1 is not None
    h.tell(owner1.owner, AgentFrame(Response(command_id="c1", status=S.FAILURE, output="x")))
    await h.settle()
    assert sink.puts[-1] == ("a1", S.FAILURE, "x", "agent", True)
    assert sink.outcome == "completed"
    # A repeated final frame after the end is dropped by the owner (nobody waits for it).
    h.tell(owner1.owner, AgentFrame(Response(command_id="c1", status=S.SUCCESS)))
    await h.settle()
    assert len(sink.puts) == 4
    status = h.instance(t.whereis(ROUTER_NAME)).format_status()
    assert status["commands_completed"] == 1 and status["commands_in_flight"] == 0
    assert status["answers_forwarded"] == 3


@actor_test
async def test_broadcast_reaches_every_held_agent_and_none_is_a_completed_end(h: Harness):
    t = tree(h)
    streams = [(await t.agent(f"b{n}"))[1] for n in range(3)]
    assert sorted(held_agent_ids(h.base) or []) == ["b0", "b1", "b2"]
    sink = t.route(command(), ())
    await h.settle()
    assert all(drain(s) == [command()] for s in streams)
    for n in range(3):
        row = agent_session(h.base, f"b{n}")
        assert row is not None
        h.tell(row.owner, AgentFrame(Response(command_id="c1", status=S.SUCCESS)))
    await h.settle()
    assert sorted(p[0] for p in sink.puts) == ["b0", "b1", "b2"]
    assert sink.outcome == "completed"
    # A command to nobody (no agent named, none held... here: only unknown ids) ends at once.
    ghosts = t.route(command("c2"), ("x", "y"))
    await h.settle()
    assert [p[2] for p in ghosts.puts] == ["not_connected", "not_connected"]
    assert ghosts.outcome == "completed"


@actor_test
async def test_a_stopping_router_refuses_only_what_it_holds(h: Harness):
    t = tree(h)
    _, stream = await t.agent("mine")
    h.tell(t.whereis(ROUTER_NAME), StopRouting(5.0))
    await h.settle()
    # A peer's forwarded command for an agent held here and one held elsewhere: the held one is
    # refused (nothing delivered), the other is "not held here" (not_connected, which the
    # forwarded command's sink sends bare), never agent_disconnected for another node's agent.
    sink = Sink()
    h.tell(t.whereis(ROUTER_NAME), LocalRouteCommand(command(), ("mine", "theirs"), 60, sink))
    await h.settle()
    assert drain(stream) == []
    assert sorted(sink.puts) == [
        ("mine", S.FAILURE, "agent_disconnected", "agent_disconnected", True),
        ("theirs", S.FAILURE, "not_connected", "not_connected", True),
    ]
    assert sink.outcome == "completed"


@actor_test
async def test_an_agent_that_disconnects_mid_command_fails_agent_disconnected(h: Harness):
    t = tree(h)
    owner, _ = await t.agent("a1")
    sink = t.route(command(), ("a1",))
    await h.settle()
    h.tell(owner, AgentFrame(Response(command_id="c1", status=S.RUNNING)))
    h.tell(owner, StreamClosed())
    await h.settle()
    assert [p[1:4] for p in sink.puts] == [
        (S.RUNNING, "", "agent"),
        (S.FAILURE, "agent_disconnected", "agent_disconnected"),
    ]
    assert sink.outcome == "completed"
    # The session is gone from the index too: a new command finds it not connected.
    assert agent_session(h.base, "a1") is None


@actor_test(timeout=15)
async def test_timeout_answers_timeout_and_tells_the_owner_to_forget(h: Harness):
    t = tree(h, default_timeout=1)
    owner, _ = await t.agent("a1")
    _, _ = await t.agent("a2")
    # Zero and negative use the configured default (1 s here); 1 is the request's own.
    sinks = [t.route(command(f"c{n}"), ("a1", "a2"), timeout) for n, timeout in enumerate((0, -5))]
    await h.settle()
    h.tell(owner, AgentFrame(Response(command_id="c0", status=S.SUCCESS)))
    await h.settle()
    assert h.instance(owner).format_status()["pending_commands"] == 1  # c1 waits
    await h.wait_until(lambda: all(s.outcome for s in sinks), 3.0, "both timeouts")
    assert sinks[0].puts == [
        ("a1", S.SUCCESS, "", "agent", True),
        ("a2", S.TIMEOUT, "", "timeout", True),
    ]
    assert [(p[0], p[1]) for p in sinks[1].puts] == [("a1", S.TIMEOUT), ("a2", S.TIMEOUT)]
    assert {s.outcome for s in sinks} == {"timeout"}
    await h.settle()
    # ForgetCommand reached the owners: nothing is waiting there any more.
    assert h.instance(owner).format_status()["pending_commands"] == 0
    status = h.instance(t.whereis(ROUTER_NAME)).format_status()
    assert status["commands_timed_out"] == 2 and status["targets_owed"] == 0


@actor_test
async def test_the_deadline_each_owner_gets_follows_the_clamp(h: Harness, caplog):
    caplog.set_level(logging.WARNING, logger="yuzu_gw.router")
    configured: list[object] = [45]
    t = tree(h)
    h.instance(t.whereis(ROUTER_NAME)).timeouts.read_default = lambda: configured[0]
    _, inbox = await t.fake_owner("a1")
    cases = [(0, 45), (-7, 45), (5, 5), (99_999, 3600)]
    for n, (requested, _) in enumerate(cases):
        t.route(command(f"c{n}"), ("a1",), requested)
    await h.settle()
    configured[0] = 0  # invalid: 300, warned once
    t.route(command("c8"), ("a1",), 0)
    t.route(command("c9"), ("a1",), 0)
    await h.settle()
    delivered = [m for m in inbox if isinstance(m, DeliverCommand)]
    now = h.loop.time()
    waits = [round(m.deadline - now) for m in delivered]
    assert waits == [45, 45, 5, 3600, 300, 300]
    assert all(m.reply_to == t.whereis(ROUTER_NAME) for m in delivered)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "default_command_timeout_s" in warnings[0]


# --- duplicates, abandonment ----------------------------------------------------------------------


@actor_test
async def test_a_command_id_in_flight_is_a_duplicate_and_not_sent_again(h: Harness):
    t = tree(h)
    owner, stream = await t.agent("a1")
    _, s2 = await t.agent("a2")
    first = t.route(command(), ("a1",))
    await h.settle()
    second = t.route(command(), ("a1", "a2"))
    await h.settle()
    assert second.puts == [("a1", S.FAILURE, "duplicate_command_id", "duplicate_command_id", True)]
    assert drain(stream) == [command()] and drain(s2) == [command()]
    # The first command still gets a1's answers; the second gets a2's.
    h.tell(owner, AgentFrame(Response(command_id="c1", status=S.SUCCESS)))
    row = agent_session(h.base, "a2")
    assert row is not None
    h.tell(row.owner, AgentFrame(Response(command_id="c1", status=S.SUCCESS)))
    await h.settle()
    assert first.puts == [("a1", S.SUCCESS, "", "agent", True)] and first.outcome == "completed"
    assert second.puts[1][0] == "a2" and second.outcome == "completed"

    # The owner's own rule, whoever asks (a restarted router's predecessor, say): one FAILURE for
    # the caller, nothing written to the agent.
    inbox: list[Any] = []
    other = h.spawn("other", inbox=inbox)
    h.tell(owner, DeliverCommand(command("c5"), reply_to=other))
    h.tell(owner, DeliverCommand(command("c5"), reply_to=other))
    await h.settle()
    assert drain(stream) == [command("c5")]
    assert inbox == [CommandFailed("a1", "c5", "duplicate_command_id")]
    # Once its caller's deadline passed, the id is free again.
    h.tell(owner, ForgetCommand("c5"))
    h.tell(owner, DeliverCommand(command("c5"), reply_to=other, deadline=h.loop.time() - 1))
    h.tell(owner, DeliverCommand(command("c5"), reply_to=other))
    await h.settle()
    assert drain(stream) == [command("c5"), command("c5")]


@actor_test
async def test_abandon_forgets_the_command_everywhere(h: Harness):
    t = tree(h)
    owner, _ = await t.agent("a1")
    sink = t.route(command(), ("a1",))
    await h.settle()
    assert h.instance(owner).format_status()["pending_commands"] == 1
    h.tell(t.whereis(ROUTER_NAME), AbandonCommand(sink))
    await h.settle()
    assert h.instance(owner).format_status()["pending_commands"] == 0
    h.tell(owner, AgentFrame(Response(command_id="c1", status=S.SUCCESS)))
    await h.settle()
    assert sink.puts == [] and sink.outcome is None
    assert h.instance(t.whereis(ROUTER_NAME)).format_status()["commands_abandoned"] == 1
    # The id is free again for a new command.
    again = t.route(command(), ("a1",))
    await h.settle()
    assert again.puts == []


# --- crashes ----------------------------------------------------------------------------------


class ExplodingSink(Sink):
    def put(self, response: management_pb2.SendCommandResponse, kind: str, final: bool) -> None:
        raise RuntimeError(f"leak {MARKER} {response}")


@actor_test
async def test_a_crash_reports_counts_only_and_the_router_restarts(h: Harness, caplog):
    caplog.set_level(logging.DEBUG)
    t = tree(h)
    owner, _ = await t.agent("a1")
    router = t.whereis(ROUTER_NAME)
    t.route(command(), ("a1",))
    await h.settle()
    status = h.instance(router).format_status()
    assert MARKER not in repr(status) and "a1" not in repr(status)
    assert all(isinstance(v, int) for v in status.values())
    h.tell(router, RouteCommand(command("c2"), ("ghost",), 5, ExplodingSink()))
    await h.settle()
    assert not h.alive(router)
    assert h.base.whereis(ROUTER_NAME) not in (None, router)  # restarted by its supervisor
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "crashed" in text and MARKER not in text and "shell" not in text
    # Its terminate told the owner to forget the command it had in flight.
    assert h.instance(owner).format_status()["pending_commands"] == 0


# --- the index and the publish point ------------------------------------------------------------


@actor_test
async def test_agents_by_id_follows_the_newest_live_session(h: Harness):
    t = tree(h)
    old, _ = await t.agent("a1", session="s-old")
    new, _ = await t.agent("a1", session="s-new")
    row = agent_session(h.base, "a1")
    assert row is not None and (row.session_id, row.owner) == ("s-new", new)
    assert row.info is not None and row.info.hostname == "host-a1"
    h.tell(new, StreamClosed())
    await h.settle()
    row = agent_session(h.base, "a1")
    assert row is not None and row.session_id == "s-old"  # falls back to the older one
    h.tell(old, StreamClosed())
    await h.settle()
    assert agent_session(h.base, "a1") is None and held_agent_ids(h.base) == []


@actor_test
async def test_owners_publish_connected_and_disconnected_to_watchers(h: Harness):
    t = tree(h)
    table = h.base.table(WATCHERS_TABLE)
    assert table is not None
    dropped: list[int] = []

    class Count:
        def inc(self) -> None:
            dropped.append(1)

    everything = Watcher(frozenset(), Count(), maxlen=2)  # type: ignore[arg-type]
    only_a2 = Watcher(frozenset({"a2"}), Count())  # type: ignore[arg-type]
    table.insert(1, everything)
    table.insert(2, only_a2)
    owner, _ = await t.agent("a1")
    await t.agent("a2", session="s-a2")
    h.tell(owner, StreamClosed())
    await h.settle()
    seen = [(await only_a2.next()).WhichOneof("event")]
    assert seen == ["connected"]
    # The unfiltered watcher holds two: the oldest of its three went, counted.
    events = [await everything.next(), await everything.next()]
    assert [(e.agent_id, e.WhichOneof("event")) for e in events] == [
        ("a2", "connected"),
        ("a1", "disconnected"),
    ]
    assert events[0].connected.session_id == "s-a2"
    assert events[1].disconnected.reason == "stream_closed"
    assert events[0].occurred_at.millis_epoch > 0
    assert dropped == [1]
