"""The replay lane of the `upstream` actor, and the heartbuffer's verdict cast, on a runtime.

The rules are the cores' (test_replay_queue.py, test_verdicts.py); these tests check the wiring:
what reaches the channel (the stored request, the session id in `x-yuzu-session-id`, at most the
replay permits at once), what the owners are told, what is announced again, the breaker, the
metrics, the lines and the redacted status. A fake channel plays the server; stand-in actors own
the `owners` and `agents` tables and play the owners (their inbox records `EndSession`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from prometheus_client import CollectorRegistry

from actors.agents.api import OwnerRow
from actors.core.breaker import ResultKind, State
from actors.core.notify_store import Event
from actors.core.permits import Caller
from actors.core.replay_queue import Phase, ReplayQueue
from actors.core.verdicts import HeartbeatVerdict
from actors.heartbeat.api import NAME as BUFFER
from actors.heartbeat.api import BufferHeartbeat
from actors.heartbeat.buffer import HeartbeatBufferActor
from actors.registry.api import AGENTS_TABLE, OWNERS_TABLE, AgentRow
from actors.upstream.actor import breaker_view
from actors.upstream.api import (
    CHANNEL_ACTOR_NAME,
    PROXY_REGISTER,
    SESSION_ID_METADATA,
    EndSession,
    Notify,
    UpstreamCallError,
)
from actors.upstream.api import UPSTREAM_NAME as UPSTREAM
from actors.upstream.replay import NOT_ACCEPTED_DETAILS, SUPERSEDED_DETAILS
from gateway.node.children.heartbeat import heartbeat_buffer_args
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2
from supervisors.address import Address
from tests.support.actors import Args, Child, Harness, actor_test
from tests.support.fake_channel import (
    FakeChannel,
    FakeChannelOwner,
    UpstreamActors,
    start_upstream_actors,
    status_error,
    upstream_context,
)

LOGGER = "yuzu_gw.upstream"
UNAVAILABLE, FAILED_PRECONDITION = 14, 9
# A fast breaker.
FAST = (
    "{circuit_breaker_failure_threshold, 5}, {circuit_breaker_reset_timeout_ms, 100},"
    " {circuit_breaker_max_reset_timeout_ms, 400}"
)
TOKEN = "enrol-token-do-not-log"


def sid(n: int) -> str:
    return f"gw-session-{n:032x}"


def home(n: int) -> str:
    return f"{n:032x}"


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@attrs.define
class Node:
    h: Harness
    actors: UpstreamActors
    channel: FakeChannel
    registry_standin: Address
    owners: dict[int, Address]
    inboxes: dict[int, list[Any]]
    owners_table: Any
    agents_table: Any

    @property
    def upstream(self) -> Address:
        return self.actors.upstream

    @property
    def metrics(self) -> CollectorRegistry:
        return self.actors.ctx.registry

    async def hold(self, n: int, agent: str | None = None) -> None:
        """A session this node holds: its owner's row (with the stored request) and its
        registry row, as an owner and the registry write them."""
        agent_id = agent or f"agent-{n}"
        inbox: list[Any] = []
        owner = self.h.spawn(f"owner-{n}", inbox=inbox)
        self.owners[n], self.inboxes[n] = owner, inbox
        request = agent_pb2.RegisterRequest(enrollment_token=TOKEN)
        request.info.agent_id = agent_id
        self.owners_table.insert(
            sid(n), OwnerRow(owner, sid(n), agent_id, f"c{n}", home(n), "live", request)
        )
        row = AgentRow(sid(n), agent_id, owner, f"c{n}", f"10.0.0.{n % 250}", (), 0.0, home(n))
        table = self.agents_table
        await self.h.call(self.registry_standin, lambda _s: table.insert(sid(n), row))

    def replays(self) -> list[Any]:
        return self.channel.calls("ProxyRegister")

    def replayed(self) -> list[str]:
        return [c.metadata[SESSION_ID_METADATA] for c in self.replays() if c.metadata]

    def announced(self) -> list[Any]:
        return [c.request for c in self.channel.calls("NotifyStreamStatus")]

    def status(self) -> dict[str, Any]:
        return dict(self.h.instance(self.upstream).format_status())


def accept(request: agent_pb2.RegisterRequest) -> agent_pb2.RegisterResponse:
    return agent_pb2.RegisterResponse(accepted=True)


async def start(h: Harness, held: int = 0, extra: str = "", jitter_ms: int = 0) -> Node:
    """No start jitter by default: a replay's timing is the test's."""
    tables = h.spawn("root")
    owners_table = await h.call(tables, lambda s: s.new_table(OWNERS_TABLE, "public"))
    registry = h.spawn("registry")
    agents_table = await h.call(registry, lambda s: s.new_table(AGENTS_TABLE))
    channel = FakeChannel()
    channel.set_rule("ProxyRegister", accept)
    channel.set_rule("NotifyStreamStatus", gateway_pb2.StreamStatusAck(acknowledged=True))
    jitter = f"{{registration_replay_start_jitter_ms, {jitter_ms}}}"
    ctx = upstream_context(f"[{FAST}, {jitter}{extra}]")
    actors = start_upstream_actors(h.create, ctx, channel)
    node = Node(h, actors, channel, registry, {}, {}, owners_table, agents_table)
    for n in range(held):
        await node.hold(n)
    return node


def verdict(*ns: int, batch: int = 1000, truncated: bool = False) -> HeartbeatVerdict:
    return HeartbeatVerdict(tuple(sorted(sid(n) for n in ns)), batch, truncated)


def ends(node: Node, n: int) -> list[EndSession]:
    return [m for m in node.inboxes[n] if isinstance(m, EndSession)]


def logged(caplog: pytest.LogCaptureFixture, level: int | None = None) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and (level is None or r.levelno == level)
    ]


def nothing_secret(texts: list[str], node: Node) -> None:
    for text in texts:
        assert TOKEN not in text
        assert "gw-session-" not in text, text


# --- targeted replays ---------------------------------------------------------------------------


@actor_test
async def test_a_verdict_replays_the_named_sessions_it_holds_and_announces_them_again(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    node = await start(h, held=3)
    h.tell(node.upstream, verdict(0, 1, 9))
    await h.wait_until(lambda: len(node.announced()) == 2, what="two CONNECTED again")
    replays = node.replays()
    assert sorted(node.replayed()) == [sid(0), sid(1)]
    for call in replays:
        n = int(call.metadata[SESSION_ID_METADATA][-2:], 16)
        assert call.request.info.agent_id == f"agent-{n}"
        assert call.request.enrollment_token == TOKEN  # the stored request, as it was
        assert call.timeout == 5.0  # upstream_rpc_timeout_ms
    for note in node.announced():
        n = int(note.session_id[-2:], 16)
        assert (note.agent_id, note.stream_home_id) == (f"agent-{n}", home(n))
        assert note.event == gateway_pb2.StreamStatusNotification.CONNECTED
        assert note.peer_addr == f"10.0.0.{n}"
    await h.settle()
    metrics = node.metrics
    assert sample(metrics, "yuzu_gw_registration_replay_total") == 2
    assert sample(metrics, "yuzu_gw_registration_replay_triggered_total", trigger="heartbeat") == 1
    assert sample(metrics, "yuzu_gw_heartbeat_verdict_dropped_total", reason="not_local") == 1
    assert sample(metrics, "yuzu_gw_registration_replay_queue_depth") == 0
    assert (
        "Registration replay: heartbeat verdict named 3 session(s); queued 2, not local 1,"
        " already queued 0, within guard 0, queue full 0"
    ) in logged(caplog, logging.INFO)
    assert "Registration replay: re-proxied agent-0" in logged(caplog, logging.DEBUG)
    nothing_secret(logged(caplog), node)
    status = node.status()
    assert status["replay_adopted"] == 2 and status["replay_queue"] == 0
    assert "gw-session-" not in repr(status) and TOKEN not in repr(status)
    # Within the guard window the same verdict queues nothing.
    h.tell(node.upstream, verdict(0, 1))
    await h.settle()
    assert len(node.replays()) == 2


@actor_test
async def test_accepted_false_ends_only_that_owner_and_announces_nothing(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    node = await start(h, held=3)
    reason = "enrollment denied " + "x" * 300

    def answer(request: agent_pb2.RegisterRequest) -> agent_pb2.RegisterResponse:
        if request.info.agent_id == "agent-1":
            return agent_pb2.RegisterResponse(accepted=False, reject_reason=reason)
        return agent_pb2.RegisterResponse(accepted=True)

    node.channel.set_rule("ProxyRegister", answer)
    h.tell(node.upstream, verdict(0, 1, 2))
    await h.wait_until(lambda: len(node.announced()) == 2, what="two CONNECTED again")
    await h.wait_until(lambda: bool(ends(node, 1)), what="EndSession to owner 1")
    assert ends(node, 1) == [EndSession(sid(1), NOT_ACCEPTED_DETAILS)]
    assert ends(node, 0) == ends(node, 2) == []
    assert sorted(n.agent_id for n in node.announced()) == ["agent-0", "agent-2"]
    [line] = [t for t in logged(caplog, logging.WARNING) if "not accepted" in t]
    assert line.startswith("Registration replay: agent-1 was not accepted by the server (")
    assert line.endswith("); disconnecting so the agent follows its own registration path")
    shown = line.split("(", 1)[1].rsplit(")", 1)[0]
    assert len(shown.encode()) <= 128 and shown.startswith("enrollment denied x")
    nothing_secret(logged(caplog), node)
    view = breaker_view(h.base)
    assert view is not None and view.state is State.CLOSED


@actor_test
async def test_superseded_ends_the_owner_and_counts_as_a_success_for_the_breaker(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    node = await start(h, held=1)
    calls = node.actors.calls(h.base)
    node.channel.fail("ProxyRegister", status_error(UNAVAILABLE), times=4)
    for _ in range(4):
        with pytest.raises(UpstreamCallError):
            await calls.call(
                Caller.REGISTER,
                PROXY_REGISTER,
                agent_pb2.RegisterRequest(),
                agent_pb2.RegisterResponse,
                grpc_timeout_s=None,
            )
    await h.settle()
    assert node.status()["consecutive_failures"] == 4
    node.channel.fail("ProxyRegister", status_error(FAILED_PRECONDITION, "superseded"))
    h.tell(node.upstream, verdict(0))
    await h.wait_until(lambda: bool(ends(node, 0)), what="EndSession")
    await h.settle()
    assert ends(node, 0) == [EndSession(sid(0), SUPERSEDED_DETAILS)]
    assert "Registration replay: agent-0's presented session was superseded" in logged(
        caplog, logging.WARNING
    )
    assert node.status()["consecutive_failures"] == 0  # a success: the count restarts
    assert node.announced() == []


@actor_test
async def test_a_request_that_cannot_be_encoded_is_skipped_and_the_drip_goes_on(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    node = await start(h, held=3, extra=", {upstream_replay_concurrency, 1}")
    node.channel.fail("ProxyRegister", UpstreamCallError(ResultKind.ENCODE, detail="EncodeError"))
    h.tell(node.upstream, verdict(0, 1, 2))
    await h.wait_until(lambda: len(node.announced()) == 2, what="the two others announced")
    assert (
        "Registration replay: agent-0's stored registration cannot be encoded (EncodeError);"
        " skipped"
    ) in logged(caplog, logging.WARNING)
    assert node.status()["consecutive_failures"] == 0  # an encode failure is not the server's
    assert ends(node, 0) == []


@actor_test
async def test_never_more_replays_in_flight_than_the_replay_permits(h: Harness) -> None:
    node = await start(h, held=60)
    node.channel.freeze()
    h.tell(node.upstream, verdict(*range(60)))
    await h.wait_until(lambda: len(node.replays()) == 24, what="24 replays out")
    await asyncio.sleep(0.05)
    assert len(node.replays()) == 24  # the 25th waits for a free replay permit
    assert sample(node.metrics, "yuzu_gw_registration_replay_queue_depth") == 36
    node.channel.unfreeze()
    await h.wait_until(lambda: len(node.announced()) == 60, 5.0, "all 60 announced")
    assert sorted(node.replayed()) == sorted(sid(n) for n in range(60))


@actor_test
async def test_an_open_breaker_drops_the_verdict_and_pauses_the_drip_until_it_recovers(
    h: Harness,
) -> None:
    node = await start(h, held=8, extra=", {upstream_replay_concurrency, 1}")
    node.channel.fail("ProxyRegister", status_error(UNAVAILABLE), times=5)
    h.tell(node.upstream, verdict(*range(8)))

    def state() -> State | None:
        view = breaker_view(h.base)
        return None if view is None else view.state

    await h.wait_until(lambda: state() is State.OPEN, what="the breaker open")
    sent_when_open = len(node.replays())
    assert sent_when_open == 5
    h.tell(node.upstream, verdict(5, 6))  # while open: dropped whole
    await h.settle()
    assert (
        sample(node.metrics, "yuzu_gw_heartbeat_verdict_dropped_total", reason="circuit_open") == 2
    )
    await asyncio.sleep(0.05)  # still inside the 100 ms open period
    assert len(node.replays()) == sent_when_open
    # Half open admits the next replay; its success closes the breaker and the rest follow.
    await h.wait_until(lambda: len(node.announced()) == 3, 5.0, "the three left announced")
    assert state() is State.CLOSED
    assert sorted(node.replayed()[5:]) == [sid(5), sid(6), sid(7)]


# --- full replays -------------------------------------------------------------------------------


@actor_test
async def test_a_truncated_verdict_replays_every_held_agent_once(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    node = await start(h, held=30)
    h.tell(node.upstream, verdict(3, truncated=True))
    await h.wait_until(lambda: len(node.announced()) == 30, 5.0, "all 30 announced")
    assert sorted(node.replayed()) == sorted(sid(n) for n in range(30))
    await h.settle()
    lost = "yuzu_gw_registration_replay_triggered_total"
    assert sample(node.metrics, lost, trigger="server_lost_state") == 1
    info = logged(caplog, logging.INFO)
    assert any(t.startswith("Registration replay: the server listed more than 4096") for t in info)
    assert "Registration replay: every agent replayed (30 session(s) walked)" in info
    # Within 60 s of its end, another truncated verdict starts no second one.
    h.tell(node.upstream, verdict(truncated=True))
    await h.settle()
    assert sample(node.metrics, lost, trigger="server_lost_state") == 1
    assert len(node.replays()) == 30


@actor_test
async def test_a_walk_whose_registry_went_away_is_aborted(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    node = await start(h, held=3, jitter_ms=200)
    lane = h.instance(node.upstream).replay
    lane.core = ReplayQueue(lane.core.policy, uniform=lambda _lo, hi: hi)  # the whole 200 ms
    h.tell(node.upstream, verdict(truncated=True))
    await h.settle()
    assert lane.core.phase is Phase.WAITING
    h.base.kill(node.registry_standin)  # its `agents` table goes with it
    await h.wait_until(lambda: lane.core.phase is Phase.IDLE, 2.0, "the walk's start")
    assert "Registration replay aborted: registry unavailable" in logged(caplog, logging.WARNING)
    assert node.replays() == []


@actor_test(timeout=20)
async def test_a_lost_connected_replays_every_agent_once_the_store_drains(h: Harness) -> None:
    node = await start(h, held=4, extra=", {notify_pending_max, 2}")
    node.channel.freeze()
    for n in range(4):  # 2 held, then 2 refused at the cap: a CONNECTED lost arms the replay
        h.tell(node.upstream, Notify(f"agent-{n}", sid(n), home(n), Event.CONNECTED, "x"))
    await h.settle()
    assert node.status()["replay_armed"] is True
    node.channel.unfreeze()
    trigger = "yuzu_gw_registration_replay_triggered_total"
    await h.wait_until(
        lambda: sample(node.metrics, trigger, trigger="notify_loss") == 1, 5.0, "the replay"
    )
    await h.wait_until(lambda: len(node.replays()) == 4, 5.0, "every agent replayed")


# --- the heartbeat buffer's cast ----------------------------------------------------------------


def buffer_node(h: Harness, answer: Callable[[Any], Any]) -> tuple[Address, list[Any], Any]:
    """The buffer actor on a fake channel, and a stand-in `upstream` that records its inbox."""
    channel = FakeChannel()
    channel.set_rule("BatchHeartbeat", answer)
    ctx = upstream_context("[{heartbeat_batch_interval_ms, 100}]")
    h.create(FakeChannelOwner, channel, CHANNEL_ACTOR_NAME)
    inbox: list[Any] = []
    h.create(Child, Args(UPSTREAM, inbox=inbox), UPSTREAM)
    return h.create(HeartbeatBufferActor, heartbeat_buffer_args(ctx), BUFFER), inbox, ctx


def beat(n: int) -> BufferHeartbeat:
    return BufferHeartbeat(agent_pb2.HeartbeatRequest(session_id=sid(n)))


def unknown(request: gateway_pb2.BatchHeartbeatRequest) -> gateway_pb2.BatchHeartbeatResponse:
    return gateway_pb2.BatchHeartbeatResponse(
        acknowledged_count=len(request.heartbeats),
        unknown_session_ids=[*reversed([hb.session_id for hb in request.heartbeats]), "", "y" * 65],
    )


@actor_test
async def test_the_buffer_casts_each_verdict_with_its_batch(h: Harness) -> None:
    buffer, inbox, ctx = buffer_node(h, unknown)
    for n in range(3):
        h.tell(buffer, beat(n))
    await h.wait_until(lambda: bool(inbox), what="a verdict")
    [cast] = [m for m in inbox if isinstance(m, HeartbeatVerdict)]
    assert cast == HeartbeatVerdict((sid(0), sid(1), sid(2)), 3, False)
    registry = ctx.registry
    assert sample(registry, "yuzu_gw_heartbeat_verdict_dropped_total", reason="malformed") == 2
    status = h.instance(buffer).format_status()
    assert status["verdicts_cast"] == 1


@actor_test
async def test_an_older_servers_answer_casts_nothing(h: Harness) -> None:
    buffer, inbox, _ = buffer_node(h, lambda _r: gateway_pb2.BatchHeartbeatResponse())
    h.tell(buffer, beat(1))
    await h.wait_until(lambda: h.instance(buffer).buffer.sessions == 0, what="the flush")
    await h.settle()
    assert inbox == []


@actor_test(budget_messages=4, per_actor=1)
async def test_a_long_upstream_mailbox_skips_the_cast(h: Harness) -> None:
    buffer, inbox, ctx = buffer_node(h, unknown)
    upstream = h.base.whereis(UPSTREAM)
    assert upstream is not None
    done = asyncio.Event()

    async def keep_busy() -> None:
        # The runtime drains 4 messages a tick; keep more than 100 waiting all along.
        while not done.is_set():
            if (h.base.mailbox_len(upstream) or 0) < 200:
                for _ in range(200):
                    h.tell(upstream, "busy")
            await asyncio.sleep(0)

    busy = asyncio.ensure_future(keep_busy())
    try:
        h.tell(buffer, beat(1))
        dropped = "yuzu_gw_heartbeat_verdict_dropped_total"
        await h.wait_until(
            lambda: sample(ctx.registry, dropped, reason="queue_full") == 1, 3.0, "a skipped cast"
        )
    finally:
        done.set()
        await busy
    assert not any(isinstance(m, HeartbeatVerdict) for m in inbox)
    assert h.instance(buffer).format_status()["verdicts_skipped"] == 1
