"""Stream-status notifications and Guardian forwards end to end: the `upstream` actor on a real
runtime, the real upstream channel (grpclib) and the grpcio fake server in the same loop.

What the server receives is read from the fake; what the gateway counted from its metrics.
"""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import grpc
import pytest
from prometheus_client import CollectorRegistry

from actors.core.breaker import State
from actors.core.notify_store import Event
from actors.registry.api import OWNERS_TABLE
from actors.upstream.actor import Upstream, breaker_view
from actors.upstream.api import (
    CHANNEL_ACTOR_NAME,
    UPSTREAM_NAME,
    ForwardGuardian,
    Notify,
    create_notify_hold,
    post,
    upstream_channel,
)
from gateway.devstack.fake_upstream import Call, FakeUpstream
from gateway.node.children.upstream import upstream_args
from gateway.upstream.channel_actor import UpstreamChannelActor
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2
from tests.support.actors import Harness, actor_test
from tests.support.fake_channel import UpstreamActors, start_upstream_actors, upstream_context

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

C, D = Event.CONNECTED, Event.DISCONNECTED
WIRE = gateway_pb2.StreamStatusNotification
NOTIFY = "NotifyStreamStatus"
LOST = "yuzu_gw_upstream_notify_lost_total"
DROPPED = "yuzu_gw_upstream_notify_dropped_total"


async def start(h: Harness, fake: FakeUpstream, extra: str = "") -> UpstreamActors:
    """The channel actor dialling `fake`, then the upstream actors; waits for the connection."""
    endpoint = f'{{http, "127.0.0.1", {fake.port}, []}}'
    ctx = upstream_context(
        f"[{{upstream_client, #{{channels => [{{default_channel, [{endpoint}], #{{}}}}]}}}},"
        " {allow_no_listeners, true},"
        " {circuit_breaker_reset_timeout_ms, 200}, {circuit_breaker_max_reset_timeout_ms, 800}"
        f"{extra}]"
    )
    h.create(UpstreamChannelActor, ctx, CHANNEL_ACTOR_NAME)
    actors = start_upstream_actors(h.create, ctx)
    channel = upstream_channel(h.base)
    assert channel is not None
    await h.wait_until(lambda: channel.live_connections() == 1, 5.0, "a live connection")  # type: ignore[attr-defined]
    return actors


def notify(n: int, event: Event = C) -> Notify:
    return Notify(
        agent_id=f"agent-{n}",
        session_id=f"gw-session-{n:032x}",
        stream_home_id=f"{n:032x}",
        event=event,
        peer_addr=f"10.0.{n // 256 % 256}.{n % 256}",
    )


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def total(registry: CollectorRegistry, name: str) -> float:
    """The sum over every series of a counter family."""
    return sum(s.value for m in registry.collect() for s in m.samples if s.name == name)


def peak_concurrency(calls: list[Call]) -> int:
    """The most calls the server held unanswered at once."""
    edges = sorted(
        [(c.received_at, 1) for c in calls] + [(c.answered_at or c.received_at, -1) for c in calls],
        key=lambda e: (e[0], e[1]),
    )
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


@attrs.frozen
class OwnerRow:
    session_id: str
    agent_id: str
    state: str = "live"


@actor_test(timeout=40)
async def test_a_cold_wave_of_1000_connected_is_delivered_with_none_dropped(h: Harness) -> None:
    async with FakeUpstream() as fake:
        fake.set_latency(0.002, NOTIFY)  # a server answering in about 2 ms
        actors = await start(h, fake)
        registry = actors.ctx.registry
        for n in range(1000):
            h.tell(actors.upstream, notify(n))
        calls = await fake.wait_for_calls(NOTIFY, 1000, answered=True, timeout=30.0)
        # The server has answered; the last answers may still be on their way to the gateway.
        await h.wait_until(
            lambda: sample(registry, "yuzu_gw_upstream_notify_inflight") == 0, 5.0, "answers"
        )

        assert len(calls) == 1000
        assert len({c.request.session_id for c in calls}) == 1000
        assert {c.request.event for c in calls} == {WIRE.CONNECTED}
        assert all(c.code == grpc.StatusCode.OK for c in calls)
        first = calls[0].request
        assert first.gateway_node == "test@127.0.0.1"
        assert first.cluster_id == "default"
        assert list(first.wire_capabilities) == ["command_dispatch_tag_v1"]
        assert first.stream_home_id == f"{0:032x}"
        # Each send carries the caller's deadline (upstream_rpc_timeout_ms, 5 s).
        assert all(c.deadline is not None and 0 < c.deadline <= 5.0 for c in calls)
        # Held, never dropped: at most 10 in flight at the server, the rest waited in the store.
        assert peak_concurrency(calls) <= 10
        assert total(registry, LOST) == 0
        assert total(registry, DROPPED) == 0
        assert sample(registry, "yuzu_gw_upstream_notify_pending") == 0
        assert sample(registry, "yuzu_gw_upstream_notify_inflight") == 0
        assert sample(registry, "yuzu_gw_upstream_notify_pending_hwm") > 10  # it did hold some
        assert len(fake.calls(NOTIFY)) == 1000  # nothing sent twice


@actor_test(timeout=30)
async def test_refused_notifications_are_sent_again_until_recorded(h: Harness) -> None:
    owner = h.spawn("root")
    table: Any = await h.call(owner, lambda s: s.new_table(OWNERS_TABLE, "public"))
    refused = [f"agent-{n}" for n in range(5)]
    for n in range(10):
        table.insert(f"gw-session-{n:032x}", OwnerRow(f"gw-session-{n:032x}", f"agent-{n}"))
    async with FakeUpstream() as fake:
        actors = await start(
            h, fake, ", {notify_unacked_retry_base_ms, 50}, {notify_unacked_retry_max_ms, 100}"
        )
        registry = actors.ctx.registry
        fake.refuse_notifications(agent_ids=refused, event=WIRE.CONNECTED)
        for n in range(10):
            h.tell(actors.upstream, notify(n))
        # Each refused agent is refused at least twice (the first send and a resend)...
        unacked = "yuzu_gw_upstream_notify_unacknowledged_total"

        def refused_twice() -> bool:
            sent = [c.request.agent_id for c in fake.calls(NOTIFY)]
            return all(sent.count(a) >= 2 for a in refused)

        await h.wait_until(refused_twice, 10.0, "resends refused")
        await h.wait_until(lambda: sample(registry, unacked, event="connected") >= 10, 5.0)
        assert sample(registry, "yuzu_gw_upstream_notify_unacked_keys") == 5
        # ...and recorded once the server takes them again.
        fake.acknowledge_notifications()
        ended = "yuzu_gw_upstream_notify_unacked_ended_total"
        await h.wait_until(
            lambda: sample(registry, ended, outcome="acknowledged") == 5, 10.0, "resends recorded"
        )
        await h.settle()
        assert sample(registry, "yuzu_gw_upstream_notify_unacked_keys") == 0
        for agent in refused:
            answers = [
                c.response.acknowledged
                for c in fake.calls(NOTIFY)
                if c.request.agent_id == agent and c.response is not None
            ]
            assert answers[-1] is True and not any(answers[:-1])
        accepted = [c for c in fake.calls(NOTIFY) if c.request.agent_id not in refused]
        assert len(accepted) == 5  # the others were recorded the first time
        view = breaker_view(h.base)
        assert view is not None and view.state is State.CLOSED  # refusals never move it
        assert total(registry, LOST) == 0


@actor_test(timeout=30)
async def test_held_while_the_server_fails_then_only_the_disconnected_after_the_probe(
    h: Harness,
) -> None:
    async with FakeUpstream() as fake:
        actors = await start(h, fake)
        fake.fail(NOTIFY, grpc.StatusCode.UNAVAILABLE, times=None, details="down")
        h.tell(actors.upstream, notify(1, D))  # fails five times: the breaker opens

        def state() -> State | None:
            view = breaker_view(h.base)
            return None if view is None else view.state

        await h.wait_until(lambda: state() is State.OPEN, 5.0, "open")
        h.tell(actors.upstream, notify(2, C))
        h.tell(actors.upstream, notify(2, D))
        await h.settle()
        fake.reset_script(NOTIFY)  # the server recovers
        await fake.wait_for(
            lambda: sum(1 for c in fake.calls(NOTIFY) if c.code == grpc.StatusCode.OK) == 2,
            timeout=10.0,
        )
        await h.settle()
        await asyncio.sleep(0.05)
        ok = [c.request for c in fake.calls(NOTIFY) if c.code == grpc.StatusCode.OK]
        # The requeued DISCONNECTED of agent 1 is the probe (head of the queue), then agent 2's.
        assert [(r.agent_id, r.event) for r in ok] == [
            ("agent-1", WIRE.DISCONNECTED),
            ("agent-2", WIRE.DISCONNECTED),
        ]
        assert not any(
            c.request.agent_id == "agent-2" and c.code != grpc.StatusCode.OK
            for c in fake.calls(NOTIFY)
        )
        assert state() is State.CLOSED
        registry = actors.ctx.registry
        assert sample(registry, "yuzu_gw_upstream_notify_coalesced_total") == 1
        assert sample(registry, "yuzu_gw_upstream_notify_requeued_total") == 5
        errors = "yuzu_gw_upstream_rpc_errors_total"
        assert sample(registry, errors, code="unavailable", rpc_name="notify_stream") == 5


@actor_test(timeout=60)
async def test_held_notifications_and_posts_outlive_a_killed_upstream_actor(h: Harness) -> None:
    # 2,000 notices held (the server frozen: 10 out, the rest queued) when the actor is killed,
    # 1,000 more posted while none runs: the restarted actor sends every one, none lost.
    root = h.spawn("root")
    await h.call(root, create_notify_hold)
    async with FakeUpstream() as fake:
        fake.freeze(NOTIFY)
        actors = await start(h, fake)
        for n in range(2000):
            assert post(h.base, notify(n), root)
        await fake.wait_for(lambda: len(fake.calls(NOTIFY)) == 10, timeout=5.0)
        h.base.kill(actors.upstream)
        await h.settle()
        for n in range(2000, 3000):
            assert post(h.base, notify(n), root)
        fake.unfreeze(NOTIFY)
        h.create(Upstream, upstream_args(actors.ctx), UPSTREAM_NAME)

        def delivered() -> set[str]:
            return {
                c.request.session_id for c in fake.calls(NOTIFY) if c.code == grpc.StatusCode.OK
            }

        await fake.wait_for(lambda: len(delivered()) == 3000, timeout=40.0)
        registry = actors.ctx.registry
        await h.wait_until(
            lambda: sample(registry, "yuzu_gw_upstream_notify_inflight") == 0, 5.0, "answers"
        )
        assert delivered() == {notify(n).session_id for n in range(3000)}
        assert total(registry, LOST) == 0
        assert total(registry, DROPPED) == 0
        # The 10 the killed actor had out went again: the server may see those twice, no more.
        assert len(fake.calls(NOTIFY)) <= 3000 + 2 * 10
        assert sample(registry, "yuzu_gw_upstream_notify_pending") == 0


@actor_test(timeout=30)
async def test_a_guardian_frame_reaches_the_server_with_the_asserted_agent_id(h: Harness) -> None:
    async with FakeUpstream() as fake:
        actors = await start(h, fake)
        frame = agent_pb2.CommandResponse(plugin="__guard__", action="drift", output="x")
        h.tell(actors.upstream, ForwardGuardian(agent_id="agent-7", response=frame))
        [call] = await fake.wait_for_calls("ForwardGuardianMessage", answered=True)
        assert call.request.agent_id == "agent-7"
        assert call.request.response.plugin == "__guard__"
        await h.settle()
        forwarded = "yuzu_gw_upstream_guardian_forwarded_total"
        await h.wait_until(
            lambda: sample(actors.ctx.registry, forwarded, outcome="acknowledged") == 1
        )
