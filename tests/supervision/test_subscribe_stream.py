"""The Subscribe handler (gateway/agent/subscribe.py) on the real registry, `agent_sup` and owners,
with a fake gRPC stream and connection: a Subscribe that ends before an owner registers its
session leaves no slot and no heartbeat binding behind, and the stream's wait for a restarted
owner (the manual, "When an agent's owner process crashes", step 3: "after an abnormal owner
exit it waits up to 5 s for the restarted owner to re-attach, and ends the stream otherwise").

The owner's side of the same paths: tests/supervision/test_agent_owner.py.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from prometheus_client import CollectorRegistry
from thespian.actors import WakeupMessage

from actors.agents.api import CommandAnswer, DeliverCommand, OwnerArgs, owner_row
from actors.agents.owner import AgentOwner
from actors.core.notify_store import Event
from actors.registry.actor import Registry, RegistryArgs
from actors.registry.api import (
    ReleaseTaken,
    TakePending,
    admit,
    binding_of,
    session_of,
)
from actors.upstream.api import (
    SESSION_ID_METADATA,
    DisconnectSettled,
    SessionPresented,
    SettleDisconnected,
)
from gateway.agent import subscribe as subscribe_module
from gateway.agent.metrics import agent_metrics
from gateway.agent.plane import AgentPlane
from gateway.agent.subscribe import OWNER_GONE_DETAILS, REATTACH_WAIT_S, subscribe
from gateway.listeners.connection import CURRENT_CALL, CallInfo, ConnectionInfo, next_key
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.address import Address
from supervisors.api import start_child
from supervisors.supervisor import ChildSpec, Supervisor, SupFlags, SupSpec
from tests.supervision.test_agent_owner import Tree, tree
from tests.support.actors import Harness, actor_test

Response = agent_pb2.CommandResponse
# The manual's number (K32), not the constant read back: a test that keeps the wait.
MANUAL_REATTACH_WAIT_S = 5.0


class FakeStream:
    """The server side of one Subscribe stream, as grpclib gives it to the handler."""

    def __init__(self, session_id: str) -> None:
        self.metadata = {SESSION_ID_METADATA: session_id}
        self.sent: list[agent_pb2.CommandRequest] = []
        self.end: tuple[Status, str | None] | None = None
        self._frames: asyncio.Queue[Response | Exception] = asyncio.Queue()

    async def send_initial_metadata(self) -> None:
        pass

    async def send_message(self, message: agent_pb2.CommandRequest) -> None:
        self.sent.append(message)

    async def send_trailing_metadata(
        self, *, status: Status = Status.OK, status_message: str | None = None, metadata: Any = None
    ) -> None:
        self.end = (status, status_message)

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> Response:
        frame = await self._frames.get()
        if isinstance(frame, Exception):
            raise frame
        return frame

    def write(self, response: Response) -> None:
        """The agent sends a frame."""
        self._frames.put_nowait(response)

    def reset(self) -> None:
        """The agent's stream is reset (it went away)."""
        self._frames.put_nowait(StreamTerminatedError("reset"))


class Agent:
    """One agent's Subscribe: its connection, its stream and the handler serving it."""

    def __init__(self, t: Tree, session_id: str) -> None:
        self.connection = ConnectionInfo(next_key(), "agent", "10.0.0.9", 5555)
        self.stream = FakeStream(session_id)
        runtime = t.h.base
        metrics = agent_metrics(CollectorRegistry(), lambda: 0)
        self.plane = AgentPlane(runtime, None, None, metrics)  # type: ignore[arg-type]
        self.task: asyncio.Task[None] | None = None

    @property
    def key(self) -> int:
        return self.connection.key

    def subscribe(self) -> asyncio.Task[None]:
        async def call() -> None:
            CURRENT_CALL.set(CallInfo(self.connection, ""))
            await subscribe(self.plane, self.stream)  # type: ignore[arg-type]

        self.task = asyncio.ensure_future(call())
        return self.task


def nothing_held(t: Tree, agent: Agent, session_id: str) -> None:
    """No slot on the agent's connection and no binding: the session is simply unknown."""
    assert t.held(agent.key) is None
    assert binding_of(t.h.base, session_id) is None
    assert admit(t.h.base, session_id, agent.key) == "unknown_session"


# --- a Subscribe that ends before an owner registers --------------------------------------------

# How far behind the busy registry's mailbox is, and the Subscribe's shortened take time-out.
HOLD_S = 0.3
TAKE_TIMEOUT_S = 0.05
_CATCH_UP = "catch_up"


class BusyRegistry(Registry):
    """A registry whose Subscribe messages wait HOLD_S in its mailbox, in order, as behind a
    burst of work."""

    def init(self, args: RegistryArgs | None) -> None:
        super().init(args)
        self._held: collections.deque[tuple[Any, Address]] = collections.deque()

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        if isinstance(msg, WakeupMessage) and msg.payload == _CATCH_UP:
            while self._held:
                super().receiveMessage(*self._held.popleft())
            return
        if isinstance(msg, (TakePending, ReleaseTaken)) or self._held:
            if not self._held:
                self.wakeupAfter(HOLD_S, _CATCH_UP)
            self._held.append((msg, sender))
            return
        super().receiveMessage(msg, sender)


@actor_test
async def test_a_take_that_timed_out_gives_its_slot_back_when_it_is_handled(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(subscribe_module, "RESERVE_TIMEOUT_S", TAKE_TIMEOUT_S)
    t = tree(h, registry=BusyRegistry)
    agent = Agent(t, "s1")
    await t.register("s1", agent.key)
    with pytest.raises(GRPCError) as refused:
        await agent.subscribe()
    assert refused.value.status is Status.INTERNAL
    # The take is handled after the Subscribe gave up on it: nobody will use the session.
    await asyncio.sleep(HOLD_S + 0.1)
    await h.settle()
    assert (await t.children()) == 0
    nothing_held(t, agent, "s1")


@actor_test
async def test_an_agent_leaving_while_its_owner_starts_leaves_nothing_held(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    t = tree(h)
    agent = Agent(t, "s1")
    await t.register("s1", agent.key)

    async def leaving(runtime: Any, sup: Address, args: OwnerArgs) -> Address:
        # The agent goes away once the owner's start is under way, before agent_sup starts it.
        assert agent.task is not None
        agent.task.cancel()
        await asyncio.sleep(0)
        return await start_child(runtime, sup, args)

    monkeypatch.setattr(subscribe_module, "start_child", leaving)
    with pytest.raises(asyncio.CancelledError):
        await agent.subscribe()
    await h.settle()
    assert (await t.children()) == 0
    assert t.notes() == []  # no CONNECTED went out, so no DISCONNECTED is owed
    nothing_held(t, agent, "s1")


# --- the wait for a restarted owner -------------------------------------------------------------


def test_the_wait_is_the_manuals() -> None:
    assert REATTACH_WAIT_S == MANUAL_REATTACH_WAIT_S


async def streaming(t: Tree, agent: Agent) -> Address:
    """Register, subscribe and wait until the owner holds the session; its address."""
    await t.register("s1", agent.key)
    agent.subscribe()
    await t.h.wait_until(lambda: session_of(t.h.base, "s1") is not None, what="the owner")
    row = session_of(t.h.base, "s1")
    assert row is not None
    return row.owner


@actor_test(timeout=20.0)
async def test_the_stream_follows_an_owner_restarted_within_the_wait(h: Harness):
    t = tree(h)
    agent = Agent(t, "s1")
    first = await streaming(t, agent)
    home = h.instance(first).stream_home_id
    killed_at = h.loop.time()
    h.base.kill(first)
    await h.settle()
    restarted = owner_row(h.base, "s1")
    assert restarted is not None and restarted.owner != first
    # The restart recovers the session on the same stream (docs/owner-recovery.md).
    assert [m.notify.event for m in t.upstream_inbox if isinstance(m, SettleDisconnected)] == [
        Event.DISCONNECTED
    ]
    h.tell(restarted.owner, DisconnectSettled("s1", "delivered"))
    await h.settle()
    h.tell(restarted.owner, SessionPresented("s1", True))
    await h.settle()
    # Past the wait, the stream is still open and carries the restarted owner's commands both
    # ways.
    await asyncio.sleep(killed_at + REATTACH_WAIT_S + 0.5 - h.loop.time())
    assert agent.stream.end is None and agent.task is not None and not agent.task.done()
    inbox: list[Any] = []
    router = h.spawn("router", inbox=inbox)
    command = agent_pb2.CommandRequest(command_id="after", plugin="os", action="info")
    h.tell(restarted.owner, DeliverCommand(command, reply_to=router))
    await h.wait_until(lambda: agent.stream.sent == [command], what="the command")
    done = Response(command_id="after", status=Response.Status.SUCCESS)
    agent.stream.write(done)
    await h.wait_until(lambda: inbox == [CommandAnswer("agent-1", done)], what="the answer")
    # The agent leaving is told to the restarted owner, which sends the session's DISCONNECTED.
    agent.stream.reset()
    with pytest.raises(GRPCError):
        await agent.task
    await h.settle()
    assert not h.alive(restarted.owner)
    assert [(n.event, n.stream_home_id) for n in t.notes()] == [
        (Event.CONNECTED, home),
        (Event.CONNECTED, home),
        (Event.DISCONNECTED, home),
    ]


class TemporaryOwners(Supervisor):
    """An `agent_sup` that never restarts an owner."""

    def supervisor_spec(self, args: Any) -> SupSpec:
        return SupSpec(
            SupFlags("simple_one_for_one", 10, 10.0),
            (ChildSpec("agent", AgentOwner, restart="temporary"),),
        )


@actor_test(timeout=20.0)
async def test_with_no_restarted_owner_the_stream_ends_unavailable_after_the_wait(h: Harness):
    t = tree(h, sup=TemporaryOwners)
    agent = Agent(t, "s1")
    first = await streaming(t, agent)
    killed_at = h.loop.time()
    h.base.kill(first)
    assert agent.task is not None
    await asyncio.wait_for(agent.task, MANUAL_REATTACH_WAIT_S + 2.0)
    waited = h.loop.time() - killed_at
    assert MANUAL_REATTACH_WAIT_S - 0.1 <= waited <= MANUAL_REATTACH_WAIT_S + 1.0
    # The agent registers again (docs/owner-recovery.md: "ends the stream UNAVAILABLE").
    assert agent.stream.end == (Status.UNAVAILABLE, OWNER_GONE_DETAILS)


@actor_test(timeout=20.0)
async def test_an_owner_killed_before_the_stream_watches_it_is_followed_to_its_restart(
    h: Harness, monkeypatch: pytest.MonkeyPatch
):
    """The owner dies between its start and the stream's first look at it (a mass kill in a
    reconnect wave), and agent_sup restarts it before the stream runs: the stream follows the
    restarted owner, which hears the agent leave. Before, the stream took the dead owner for one
    that was never up, ended the session's stream and left the restarted owner holding it for
    good (the 10,000-agent soak's stale owners)."""
    t = tree(h)
    agent = Agent(t, "s1")
    await t.register("s1", agent.key)
    started: list[Address] = []

    async def killed_at_once(runtime: Any, sup: Address, args: OwnerArgs) -> Address:
        first = await start_child(runtime, sup, args)
        started.append(first)
        h.base.kill(first)
        await h.wait_until(
            lambda: (row := owner_row(h.base, "s1")) is not None and row.owner != first,
            what="the restarted owner",
        )
        return first

    monkeypatch.setattr(subscribe_module, "start_child", killed_at_once)
    agent.subscribe()
    await h.wait_until(lambda: bool(started), what="the first owner")
    await h.settle()
    restarted = owner_row(h.base, "s1")
    assert restarted is not None and restarted.owner != started[0]
    h.tell(restarted.owner, DisconnectSettled("s1", "delivered"))
    await h.settle()
    h.tell(restarted.owner, SessionPresented("s1", True))
    await h.settle()
    assert agent.stream.end is None and agent.task is not None and not agent.task.done()
    # The agent leaves: the restarted owner is told, and ends with the session's DISCONNECTED.
    agent.stream.reset()
    with pytest.raises(GRPCError):
        await agent.task
    await h.settle()
    assert not h.alive(restarted.owner)
    assert owner_row(h.base, "s1") is None
    assert [n.event for n in t.notes()][-1] is Event.DISCONNECTED
