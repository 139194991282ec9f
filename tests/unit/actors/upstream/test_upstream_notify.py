"""The `upstream` actor's notification and Guardian lanes: the wiring around the held store.

The store's rules are tested on the core (test_notify_store.py, test_resend.py). Here the real
actor runs on a runtime with an in-memory channel (tests/support/fake_channel.py) playing the
server, and the tests check what reaches the channel, the breaker's part, the timers, the metrics
and the lines.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import attrs
import pytest
from prometheus_client import CollectorRegistry
from thespian.actors import ActorExitRequest

from actors.core.breaker import State
from actors.core.notify_store import Event
from actors.core.permits import Caller
from actors.registry.api import OWNERS_TABLE
from actors.upstream.actor import FlushDone, FlushNotifications, RaiseNotifyCap, breaker_view
from actors.upstream.api import PROXY_REGISTER, ForwardGuardian, Notify, UpstreamCallError
from actors.upstream.guardian import MAX_INFLIGHT as GUARDIAN_MAX
from actors.upstream.notify import NotifyLane
from gateway.node.children.upstream import notify_pending_max
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2
from tests.support.actors import Harness, actor_test
from tests.support.fake_channel import (
    FakeChannel,
    UpstreamActors,
    start_upstream_actors,
    status_error,
    upstream_context,
)

C, D = Event.CONNECTED, Event.DISCONNECTED
WIRE = gateway_pb2.StreamStatusNotification
UNAVAILABLE = 14
LOGGER = "yuzu_gw.upstream"
NOTIFY = "NotifyStreamStatus"
GUARDIAN = "ForwardGuardianMessage"


def start(
    h: Harness, extra: str = "", channel: FakeChannel | None = None, reset_ms: int = 100
) -> tuple[UpstreamActors, FakeChannel]:
    """The upstream actors on a fake channel, with a fast breaker (`reset_ms` open, doubling to
    4 x that)."""
    channel = channel or FakeChannel()
    # The in-memory channel answers an empty message by default; the server acknowledges.
    channel.set_rule(NOTIFY, gateway_pb2.StreamStatusAck(acknowledged=True))
    channel.set_rule(GUARDIAN, gateway_pb2.ForwardGuardianAck(acknowledged=True))
    fast = (
        f"{{circuit_breaker_reset_timeout_ms, {reset_ms}}},"
        f" {{circuit_breaker_max_reset_timeout_ms, {4 * reset_ms}}}"
    )
    # No listener here: the lab-rig acknowledgement lets the config resolve without one.
    config = f"[{{allow_no_listeners, true}}, {fast}{', ' + extra if extra else ''}]"
    return start_upstream_actors(h.create, upstream_context(config), channel), channel


def notify(n: int, event: Event = C, *, session: str | None = None) -> Notify:
    return Notify(
        agent_id=f"agent-{n}",
        session_id=session or f"gw-session-{n:032x}",
        stream_home_id=f"{n:032x}",
        event=event,
        peer_addr="10.0.0.1",
    )


def lane(h: Harness, actors: UpstreamActors) -> NotifyLane:
    return h.instance(actors.upstream).notify  # type: ignore[no-any-return]


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def state(h: Harness) -> State:
    view = breaker_view(h.base)
    assert view is not None
    return view.state


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


async def open_breaker(h: Harness, actors: UpstreamActors, channel: FakeChannel) -> None:
    """Five failed ProxyRegisters open the breaker (notifications never reach the channel)."""
    channel.fail("ProxyRegister", status_error(UNAVAILABLE), times=5)
    calls = actors.calls(h.base)
    for _ in range(5):
        with pytest.raises(UpstreamCallError):
            await calls.call(
                Caller.REGISTER,
                PROXY_REGISTER,
                agent_pb2.RegisterRequest(),
                agent_pb2.RegisterResponse,
                grpc_timeout_s=None,
            )
    await h.settle()
    assert state(h) is State.OPEN


@attrs.frozen
class OwnerRow:
    session_id: str
    agent_id: str
    state: str = "live"


def owners_table(h: Harness) -> Any:
    """The public owner table, as the root supervisor would own it."""
    owner = h.spawn("root")
    return asyncio.ensure_future(h.call(owner, lambda s: s.new_table(OWNERS_TABLE, "public")))


# --- the probe ----------------------------------------------------------------------------------


@actor_test
async def test_connected_then_disconnected_while_open_sends_only_the_disconnected_as_the_probe(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    actors, channel = start(h)
    await open_breaker(h, actors, channel)
    h.tell(actors.upstream, notify(1, C))
    h.tell(actors.upstream, notify(1, D))
    await h.settle()
    assert channel.calls(NOTIFY) == []  # held while open
    assert lane(h, actors).store.pending == 1  # replaced in place

    # The reset timeout (100 ms) passes: the DISCONNECTED is the probe, and it closes the breaker.
    await h.wait_until(lambda: state(h) is State.CLOSED, 2.0, "the probe closed it")
    await asyncio.sleep(0.05)
    await h.settle()
    [sent] = channel.calls(NOTIFY)
    request = sent.request
    assert request.event == WIRE.DISCONNECTED
    assert (request.agent_id, request.session_id) == ("agent-1", f"gw-session-{1:032x}")
    assert request.stream_home_id == f"{1:032x}"
    assert request.gateway_node == "test@127.0.0.1"
    assert request.cluster_id == "default"
    assert list(request.wire_capabilities) == ["command_dispatch_tag_v1"]
    assert request.peer_addr == "10.0.0.1"
    assert sent.timeout == 15.0  # the probe's own deadline, notify_probe_timeout_ms
    registry = actors.ctx.registry
    assert sample(registry, "yuzu_gw_upstream_notify_coalesced_total") == 1
    assert sample(registry, "yuzu_gw_upstream_notify_pending") == 0
    assert "Circuit breaker: half_open -> closed (probe succeeded)" in lines(caplog)


@actor_test
async def test_one_probe_then_the_rest_in_order_with_the_ordinary_timeout(h: Harness) -> None:
    actors, channel = start(h, "{upstream_rpc_timeout_ms, 3000}")
    await open_breaker(h, actors, channel)
    channel.latency[NOTIFY] = 0.05  # the probe stays out a while
    for n in range(5):
        h.tell(actors.upstream, notify(n, D))
    await h.wait_until(lambda: len(channel.calls(NOTIFY)) == 1, 2.0, "the probe")
    await asyncio.sleep(0.02)
    assert len(channel.calls(NOTIFY)) == 1  # nothing else while the probe is out
    assert lane(h, actors).store.pending == 4
    await h.wait_until(lambda: len(channel.calls(NOTIFY)) == 5, 2.0, "the rest")
    sent = channel.calls(NOTIFY)
    assert [s.request.agent_id for s in sent] == [f"agent-{n}" for n in range(5)]
    assert [s.timeout for s in sent] == [15.0, 3.0, 3.0, 3.0, 3.0]


class HangingChannel(FakeChannel):
    """Ignores the caller's timeout: only the actor's probe deadline ends a frozen call."""

    async def unary(self, method: str, request: Any, response_type: Any, **kw: Any) -> Any:
        kw["timeout"] = 3600.0
        return await super().unary(method, request, response_type, **kw)


@actor_test
async def test_a_probe_past_its_deadline_is_killed_and_counts_as_a_failed_probe(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    actors, channel = start(h, "{notify_probe_timeout_ms, 150}", channel=HangingChannel())
    await open_breaker(h, actors, channel)
    channel.freeze()
    h.tell(actors.upstream, notify(7, D))
    await h.wait_until(lambda: len(channel.calls(NOTIFY)) == 1, 2.0, "the probe")
    assert call_tasks() == Counter({"_unary": 1, "_relay": 1})  # a call the lane can kill
    await h.wait_until(lambda: state(h) is State.OPEN, 2.0, "killed probe reopens")
    await h.settle()
    assert channel.calls(NOTIFY)[0].outcome == "cancelled"  # killed, not answered
    assert lane(h, actors).store.pending == 1  # back at the head
    text = lines(caplog)
    assert any("did not answer within 150 ms" in line for line in text)
    assert any(line.startswith("Circuit breaker: half_open -> open") for line in text)
    registry = actors.ctx.registry
    assert sample(registry, "yuzu_gw_upstream_notify_requeued_total") == 1
    errors = "yuzu_gw_upstream_rpc_errors_total"
    assert sample(registry, errors, code="probe_killed", rpc_name="notify_stream") == 1

    channel.unfreeze()  # the server answers again: the next probe delivers it
    await h.wait_until(lambda: state(h) is State.CLOSED, 3.0, "the next probe closes it")
    await h.settle()
    assert [c.outcome for c in channel.calls(NOTIFY)] == ["cancelled", "ok"]
    assert lane(h, actors).store.pending == 0


# --- sending ------------------------------------------------------------------------------------


@actor_test
async def test_at_most_ten_in_flight(h: Harness) -> None:
    actors, channel = start(h)
    channel.latency[NOTIFY] = 0.05
    for n in range(30):
        h.tell(actors.upstream, notify(n))
    await h.settle()
    registry = actors.ctx.registry
    assert sample(registry, "yuzu_gw_upstream_notify_inflight") == 10
    assert sample(registry, "yuzu_gw_upstream_notify_pending") == 20
    assert sample(registry, "yuzu_gw_upstream_notify_pending_hwm") >= 20
    assert sample(registry, "yuzu_gw_upstream_notify_pending_max") == 15_000
    await h.wait_until(lambda: len(channel.calls(NOTIFY)) == 30, 3.0, "all sent")
    await h.wait_until(lambda: lane(h, actors).store.inflight == 0, 1.0, "all answered")
    assert channel.peak_in_flight == 10
    assert sorted(c.request.agent_id for c in channel.calls(NOTIFY)) == sorted(
        f"agent-{n}" for n in range(30)
    )


def call_tasks() -> Counter[str]:
    """The lanes' call tasks now pending, by coroutine: `_unary` (a call), `_relay` (the worker
    in front of a call the lane can kill)."""
    names = (t.get_coro().__qualname__ for t in asyncio.all_tasks() if not t.done())  # type: ignore[union-attr]
    return Counter(name for name in names if name in ("_unary", "_relay"))


@actor_test
async def test_an_ordinary_send_is_one_task_that_ends_with_the_actor(h: Harness) -> None:
    # A send is one worker task (the call itself): a relay in front of it would cost a second
    # task and a loop turn per notification. Only the probe, which the lane kills at its
    # deadline, runs behind one (test_a_probe_past_its_deadline_is_killed_...).
    actors, channel = start(h, channel=HangingChannel())
    channel.freeze()
    for n in range(3):
        h.tell(actors.upstream, notify(n))
    await h.wait_until(lambda: len(channel.calls(NOTIFY)) == 3, 2.0, "the sends")
    assert call_tasks() == Counter({"_unary": 3})

    h.tell(actors.upstream, ActorExitRequest())
    await h.settle()
    await asyncio.sleep(0.01)
    assert {c.outcome for c in channel.calls(NOTIFY)} == {"cancelled"}  # ended with the actor
    assert call_tasks() == Counter()


@actor_test
async def test_a_failed_send_is_requeued_and_feeds_the_breaker(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    actors, channel = start(h)
    channel.fail(NOTIFY, status_error(UNAVAILABLE, "busy"), times=2)
    h.tell(actors.upstream, notify(1, D))
    await h.wait_until(lambda: len(channel.calls(NOTIFY)) == 3, 2.0, "two retries")
    await h.settle()
    registry = actors.ctx.registry
    assert sample(registry, "yuzu_gw_upstream_notify_requeued_total") == 2
    errors = "yuzu_gw_upstream_rpc_errors_total"
    assert sample(registry, errors, code="unavailable", rpc_name="notify_stream") == 2
    assert h.instance(actors.upstream).breaker.failures == 0  # the success reset the run
    assert [c.outcome for c in channel.calls(NOTIFY)] == ["status", "status", "ok"]
    failed = [line for line in lines(caplog) if line.startswith("Failed to notify stream status")]
    assert (
        failed
        == ["Failed to notify stream status (DISCONNECTED) for agent-1: UNAVAILABLE; held again"]
        * 2
    )


@actor_test
async def test_five_failed_sends_open_the_breaker_and_the_notification_waits(h: Harness) -> None:
    actors, channel = start(h, reset_ms=3000)
    channel.set_rule(NOTIFY, status_error(UNAVAILABLE))
    h.tell(actors.upstream, notify(1, D))
    await h.wait_until(lambda: state(h) is State.OPEN, 2.0, "open")
    await h.settle()
    assert len(channel.calls(NOTIFY)) == 5  # the threshold, then the probe takes over
    assert lane(h, actors).store.pending == 1


@actor_test
async def test_request_faults_and_encode_failures_are_lost_rejected_and_leave_the_breaker(
    h: Harness,
) -> None:
    actors, channel = start(h)
    channel.fail(NOTIFY, status_error(3, "bad"))  # INVALID_ARGUMENT
    h.tell(actors.upstream, notify(1, C))
    h.tell(actors.upstream, Notify("\udc80", "s-2", "h-2", D, "10.0.0.1"))  # cannot be encoded
    await h.settle()
    await h.wait_until(
        lambda: lane(h, actors).store.inflight == 0 and lane(h, actors).store.pending == 0
    )
    await h.settle()
    registry = actors.ctx.registry
    lost = "yuzu_gw_upstream_notify_lost_total"
    assert sample(registry, lost, event="connected", reason="rejected") == 1
    assert sample(registry, lost, event="disconnected", reason="rejected") == 1
    errors = "yuzu_gw_upstream_rpc_errors_total"
    assert sample(registry, errors, code="encode", rpc_name="notify_stream") == 1
    assert sample(registry, errors, code="invalid_argument", rpc_name="notify_stream") == 1
    assert len(channel.calls(NOTIFY)) == 1  # the unencodable one never reached the channel
    assert state(h) is State.CLOSED and h.instance(actors.upstream).breaker.failures == 0


# --- acknowledged=false ---------------------------------------------------------------------------


@actor_test
async def test_acknowledged_false_goes_to_the_resends_while_the_session_is_held(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    table = await owners_table(h)
    table.insert(f"gw-session-{1:032x}", OwnerRow(f"gw-session-{1:032x}", "agent-1"))
    actors, channel = start(
        h, "{notify_unacked_retry_base_ms, 20}, {notify_unacked_retry_max_ms, 40}"
    )
    refused = gateway_pb2.StreamStatusAck(acknowledged=False)
    channel.script(NOTIFY, refused, refused)
    channel.set_rule(NOTIFY, gateway_pb2.StreamStatusAck(acknowledged=True))
    h.tell(actors.upstream, notify(1, C))
    await h.wait_until(lambda: len(channel.calls(NOTIFY)) == 3, 2.0, "two resends")
    await h.wait_until(lambda: lane(h, actors).store.inflight == 0)
    registry = actors.ctx.registry
    assert sample(registry, "yuzu_gw_upstream_notify_unacknowledged_total", event="connected") == 2
    ended = "yuzu_gw_upstream_notify_unacked_ended_total"
    assert sample(registry, ended, outcome="acknowledged") == 1
    assert sample(registry, "yuzu_gw_upstream_notify_unacked_keys") == 0
    assert state(h) is State.CLOSED  # acknowledged=false never moves the breaker
    warned = [line for line in lines(caplog) if line.startswith("Server did not record")]
    assert warned and warned[0].startswith(
        "Server did not record the CONNECTED stream status notice for agent-1"
        " (acknowledged=false; refused 1 time(s) over 0 ms); sending it again in"
    )


@actor_test
async def test_a_refused_connected_is_not_resent_once_the_session_is_gone(h: Harness) -> None:
    await owners_table(h)  # no row for the session: the node no longer holds it
    actors, channel = start(h, "{notify_unacked_retry_base_ms, 20}")
    channel.set_rule(NOTIFY, gateway_pb2.StreamStatusAck(acknowledged=False))
    h.tell(actors.upstream, notify(1, C))
    ended = "yuzu_gw_upstream_notify_unacked_ended_total"
    registry = actors.ctx.registry
    await h.wait_until(lambda: sample(registry, ended, outcome="session_ended") == 1, 2.0)
    assert len(channel.calls(NOTIFY)) == 1
    assert sample(registry, "yuzu_gw_upstream_notify_unacked_keys") == 0


# --- the planned stop -----------------------------------------------------------------------------


@actor_test
async def test_the_flush_sends_everything_held_whatever_the_breaker(h: Harness) -> None:
    actors, channel = start(h)
    await open_breaker(h, actors, channel)
    for n in range(3):
        h.tell(actors.upstream, notify(n, D))
    h.tell(actors.upstream, RaiseNotifyCap(10))
    await h.settle()
    assert lane(h, actors).store.cap == 15_010
    done = await h.ask(actors.upstream, FlushNotifications(2.0))
    assert done == FlushDone(sent=3, left=0)
    assert len(channel.calls(NOTIFY)) == 3
    # Later notifications are counted, not sent; a second ask gets the same report.
    h.tell(actors.upstream, notify(9, D))
    assert await h.ask(actors.upstream, FlushNotifications(1.0)) == FlushDone(3, 0)
    registry = actors.ctx.registry
    lost = "yuzu_gw_upstream_notify_lost_total"
    assert sample(registry, lost, event="disconnected", reason="shutdown") == 1
    assert len(channel.calls(NOTIFY)) == 3


@actor_test
async def test_the_flush_ends_at_its_budget(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    actors, channel = start(h)
    await open_breaker(h, actors, channel)
    channel.freeze()
    for n in range(70):
        h.tell(actors.upstream, notify(n, D))
    await h.settle()
    started = h.loop.time()
    done = await h.ask(actors.upstream, FlushNotifications(0.2))
    assert 0.15 <= h.loop.time() - started < 1.0
    assert done == FlushDone(sent=64, left=6)  # 64 at a time, the rest lost
    registry = actors.ctx.registry
    lost = "yuzu_gw_upstream_notify_lost_total"
    assert sample(registry, lost, event="disconnected", reason="shutdown") == 6
    assert all(c.timeout <= 0.2 for c in channel.calls(NOTIFY))  # never past the budget
    assert any(
        r.getMessage()
        == "Planned stop: 64 stream-status notification(s) sent, 6 not sent by the flush deadline"
        and r.levelno == logging.WARNING
        for r in caplog.records
    )
    channel.unfreeze()


# --- guardian -------------------------------------------------------------------------------------


def guard(n: int) -> ForwardGuardian:
    frame = agent_pb2.CommandResponse(plugin="__guard__", action="drift", output=f"event-{n}")
    return ForwardGuardian(agent_id=f"agent-{n}", response=frame)


@actor_test
async def test_guardian_frames_are_forwarded_with_the_asserted_agent_id(h: Harness) -> None:
    actors, channel = start(h)
    h.tell(actors.upstream, guard(4))
    await h.wait_until(lambda: len(channel.calls(GUARDIAN)) == 1)
    await h.settle()
    [sent] = channel.calls(GUARDIAN)
    assert sent.request.agent_id == "agent-4"
    assert sent.request.response.plugin == "__guard__"
    assert sent.request.response.output == "event-4"
    assert sent.timeout == 5.0  # upstream_rpc_timeout_ms
    forwarded = "yuzu_gw_upstream_guardian_forwarded_total"
    assert sample(actors.ctx.registry, forwarded, outcome="acknowledged") == 1


@actor_test
async def test_guardian_drops_while_the_breaker_is_open(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    actors, channel = start(h)
    await open_breaker(h, actors, channel)
    for n in range(3):
        h.tell(actors.upstream, guard(n))
    await h.settle()
    assert channel.calls(GUARDIAN) == []
    registry = actors.ctx.registry
    dropped = "yuzu_gw_upstream_guardian_dropped_total"
    assert sample(registry, dropped, reason="circuit_open") == 3
    assert sample(registry, dropped, reason="at_capacity") == 0
    # one line a second at most
    drops = [line for line in lines(caplog) if line.startswith("Guardian frame")]
    assert drops == ["Guardian frame from agent-0 not forwarded upstream: circuit_open"]


@actor_test
async def test_guardian_drops_past_fifty_in_flight_and_feeds_the_breaker(h: Harness) -> None:
    actors, channel = start(h)
    channel.freeze()
    for n in range(GUARDIAN_MAX + 5):
        h.tell(actors.upstream, guard(n))
    await h.settle()
    await asyncio.sleep(0.01)
    registry = actors.ctx.registry
    assert len(channel.calls(GUARDIAN)) == 50
    assert sample(registry, "yuzu_gw_upstream_guardian_inflight") == 50
    dropped = "yuzu_gw_upstream_guardian_dropped_total"
    assert sample(registry, dropped, reason="at_capacity") == 5
    channel.set_rule(GUARDIAN, status_error(UNAVAILABLE))
    channel.unfreeze()
    await h.wait_until(lambda: state(h) is State.OPEN, 2.0, "guardian failures open it")
    await h.settle()
    forwarded = "yuzu_gw_upstream_guardian_forwarded_total"
    assert sample(registry, forwarded, outcome="failed") == 50
    assert sample(registry, "yuzu_gw_upstream_guardian_inflight") == 0
    errors = "yuzu_gw_upstream_rpc_errors_total"
    assert sample(registry, errors, code="unavailable", rpc_name="guardian") == 50


# --- configuration and status ---------------------------------------------------------------------


def test_notify_pending_max_follows_the_agent_listeners() -> None:
    agent = (
        "#{name => agent, service_protos => [agent_pb],"
        " services => #{'yuzu.agent.v1.AgentService' => yuzu_gw_agent_service},"
        " listen => #{port => 50051, ip => {0,0,0,0}}, limits => #{max_connections => %d}}"
    )
    mgmt = (
        "#{name => mgmt, service_protos => [management_pb],"
        " services => #{'yuzu.server.v1.ManagementService' => yuzu_gw_mgmt_service},"
        " listen => #{port => 50063, ip => {0,0,0,0}}, limits => #{max_connections => 9000}}"
    )
    ctx = upstream_context(f"[{{grpc_listeners, [{agent % 7000}, {mgmt}]}}]")
    assert notify_pending_max(ctx.config) == 21_000  # the mgmt listener does not count
    bare = upstream_context("[{allow_no_listeners, true}]")
    assert notify_pending_max(bare.config) == 15_000  # no listener
    ctx = upstream_context(f"[{{grpc_listeners, [{agent % 1000}]}}]")
    assert notify_pending_max(ctx.config) == 15_000  # the floor
    configured = upstream_context("[{allow_no_listeners, true}, {notify_pending_max, 42}]")
    assert notify_pending_max(configured.config) == 42


@actor_test
async def test_format_status_shows_counts_only(h: Harness) -> None:
    actors, channel = start(h)
    channel.freeze()
    h.tell(actors.upstream, notify(1, C))
    h.tell(actors.upstream, guard(2))
    await h.settle()
    status = dict(h.instance(actors.upstream).format_status())
    assert status["notify_inflight"] == 1
    assert status["guardian_inflight"] == 1
    assert status["breaker"] == "closed"
    text = repr(status)
    assert "agent-" not in text and "gw-session" not in text
    assert all(isinstance(v, (int, str, bool)) for v in status.values())
    channel.unfreeze()


@actor_test
async def test_a_stopped_actor_reports_zero_gauges(h: Harness) -> None:
    actors, channel = start(h)
    channel.freeze()
    for n in range(3):
        h.tell(actors.upstream, notify(n))
    h.tell(actors.upstream, guard(9))
    await h.settle()
    registry = actors.ctx.registry
    assert sample(registry, "yuzu_gw_upstream_notify_inflight") == 3
    assert sample(registry, "yuzu_gw_upstream_guardian_inflight") == 1
    h.tell(actors.upstream, ActorExitRequest())
    await h.settle()
    assert not h.alive(actors.upstream)
    # The store was memory only: nothing is held any more, whatever the last actor had.
    assert sample(registry, "yuzu_gw_upstream_notify_inflight") == 0
    assert sample(registry, "yuzu_gw_upstream_notify_pending_max") == 0
    assert sample(registry, "yuzu_gw_upstream_guardian_inflight") == 0
    # Its calls were cancelled with it.
    await asyncio.sleep(0.01)
    assert {c.outcome for c in channel.calls()} == {"cancelled"}
