"""The `heartbeat_buffer` actor: the I/O around the buffer core, on an in-memory channel.

The buffer's rules are the core's (tests/unit); here the real actor runs on a runtime with a
fake channel (tests/support/fake_channel.py) playing the server, and the tests check what
reaches the channel, the metrics and the planned stop.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from thespian.actors import ActorExitRequest

from actors.core.breaker import ResultKind
from actors.core.heartbeat_buffer import HeartbeatBuffer, HeartbeatPolicy
from actors.heartbeat.api import NAME, BufferHeartbeat
from actors.heartbeat.buffer import HeartbeatBufferActor
from actors.upstream.api import CHANNEL_ACTOR_NAME, UpstreamCallError
from gateway.config.context import NodeContext
from gateway.node.children.heartbeat import heartbeat_buffer_args
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2
from supervisors.address import Address
from tests.support.actors import Harness, actor_test
from tests.support.fake_channel import (
    FakeChannel,
    FakeChannelOwner,
    UpstreamActors,
    start_upstream_actors,
    status_error,
    upstream_context,
)

BATCH = "BatchHeartbeat"
UNAVAILABLE = 14
NODE = "test@127.0.0.1"


def start(
    h: Harness, interval_ms: int = 100, channel: FakeChannel | None = None
) -> tuple[NodeContext, FakeChannel, Address]:
    channel = channel or FakeChannel()
    ctx = upstream_context(f"[{{heartbeat_batch_interval_ms, {interval_ms}}}]")
    h.create(FakeChannelOwner, channel, CHANNEL_ACTOR_NAME)
    return ctx, channel, h.create(HeartbeatBufferActor, heartbeat_buffer_args(ctx), NAME)


def beat(n: int, tag: str = "v") -> BufferHeartbeat:
    request = agent_pb2.HeartbeatRequest(session_id=f"gw-session-{n:032x}")
    request.status_tags["k"] = tag
    return BufferHeartbeat(request)


def sessions(request: gateway_pb2.BatchHeartbeatRequest) -> list[str]:
    return [hb.session_id for hb in request.heartbeats]


def value(ctx: NodeContext, name: str, **labels: str) -> float | None:
    return ctx.registry.get_sample_value(name, labels)


@actor_test
async def test_a_flush_sends_the_buffered_heartbeats_in_one_batch_with_the_node(
    h: Harness,
) -> None:
    ctx, channel, actor = start(h)
    h.tell(actor, beat(1))
    h.tell(actor, beat(2))
    await h.wait_until(lambda: bool(channel.calls(BATCH)), what="a BatchHeartbeat")
    [call] = channel.calls(BATCH)
    assert isinstance(call.request, gateway_pb2.BatchHeartbeatRequest)
    assert call.request.gateway_node == NODE
    assert sessions(call.request) == [beat(1).heartbeat.session_id, beat(2).heartbeat.session_id]
    assert call.timeout == 5.0  # upstream_rpc_timeout_ms
    await h.wait_until(lambda: h.instance(actor).buffer.sessions == 0, what="the buffer empty")
    assert value(ctx, "yuzu_gw_heartbeat_buffer_sessions") == 0


@actor_test
async def test_the_metric_series_start_at_zero(h: Harness) -> None:
    ctx, _, _ = start(h, interval_ms=60000)
    assert value(ctx, "yuzu_gw_heartbeat_coalesced_total") == 0
    for reason in ("chunk_rejected", "buffer_full", "snapshot_evicted", "heartbeat_invalid"):
        assert value(ctx, "yuzu_gw_heartbeat_buffer_dropped_total", reason=reason) == 0


@actor_test
async def test_a_transient_failure_keeps_the_heartbeats_for_the_next_flush(h: Harness) -> None:
    channel = FakeChannel()
    channel.fail(BATCH, status_error(UNAVAILABLE))
    _, channel, actor = start(h, channel=channel)
    h.tell(actor, beat(1))
    await h.wait_until(lambda: len(channel.calls(BATCH)) >= 2, what="a second BatchHeartbeat")
    first, second = channel.calls(BATCH)[:2]
    assert first.outcome == "status" and second.outcome == "ok"
    assert sessions(second.request) == sessions(first.request) == [beat(1).heartbeat.session_id]


@actor_test
async def test_no_channel_and_a_raising_channel_are_transient_and_the_actor_survives(
    h: Harness,
) -> None:
    ctx = upstream_context("[{heartbeat_batch_interval_ms, 100}]")
    actor = h.create(HeartbeatBufferActor, heartbeat_buffer_args(ctx), NAME)
    h.tell(actor, beat(1))
    await asyncio.sleep(0.25)  # two flushes without a channel: the heartbeat stays
    assert h.instance(actor).buffer.sessions == 1 and h.alive(actor)
    channel = FakeChannel()
    raised: list[int] = []

    def boom(_request: object) -> gateway_pb2.BatchHeartbeatResponse:
        if not raised:
            raised.append(1)
            raise RuntimeError("defect")
        return gateway_pb2.BatchHeartbeatResponse()

    channel.set_rule(BATCH, boom)
    h.create(FakeChannelOwner, channel, CHANNEL_ACTOR_NAME)
    await h.wait_until(lambda: h.instance(actor).buffer.delivered_total == 1, what="delivery")
    assert raised and h.alive(actor)
    assert len(channel.calls(BATCH)) == 2


@actor_test
async def test_coalescing_keeps_one_entry_per_session_and_counts_it(h: Harness) -> None:
    ctx, channel, actor = start(h, interval_ms=60000)
    h.tell(actor, beat(1, "old"))
    h.tell(actor, beat(1, "new"))
    await h.settle()
    assert value(ctx, "yuzu_gw_heartbeat_coalesced_total") == 1
    assert value(ctx, "yuzu_gw_heartbeat_buffer_sessions") == 1
    h.tell(actor, ActorExitRequest())
    await h.wait_until(lambda: not h.alive(actor), what="the actor to stop")
    [call] = channel.calls(BATCH)
    [hb] = call.request.heartbeats
    assert hb.status_tags["k"] == "new"


@actor_test
async def test_a_planned_stop_flushes_what_is_buffered_then_ends(h: Harness) -> None:
    _, channel, actor = start(h, interval_ms=60000)
    for n in range(3):
        h.tell(actor, beat(n))
    h.tell(actor, ActorExitRequest())
    await h.wait_until(lambda: not h.alive(actor), what="the actor to stop")
    [call] = channel.calls(BATCH)
    assert len(call.request.heartbeats) == 3
    assert call.timeout <= 5.0


@actor_test
async def test_a_planned_stop_with_a_frozen_server_ends_at_the_deadline(h: Harness) -> None:
    _, channel, actor = start(h, interval_ms=60000)
    # The default 5 s is too long for a test: a buffer with a 0.2 s shutdown flush.
    h.instance(actor).buffer = HeartbeatBuffer(HeartbeatPolicy(shutdown_s=0.2), gateway_node=NODE)
    channel.freeze()
    h.tell(actor, beat(1))
    h.tell(actor, ActorExitRequest())
    await h.wait_until(lambda: not h.alive(actor), timeout=3.0, what="the actor to stop")
    [call] = channel.calls(BATCH)
    assert call.timeout <= 0.2


# -- a failed BatchHeartbeat is an upstream RPC error like any other (issue 21) --

ERRORS = "yuzu_gw_upstream_rpc_errors_total"
UPSTREAM_LOGGER = "yuzu_gw.upstream"


def start_with_upstream(
    h: Harness, channel: FakeChannel, interval_ms: int = 100
) -> tuple[NodeContext, Address, UpstreamActors]:
    """The buffer beside the real `upstream` actor, which counts and logs RPC errors."""
    ctx = upstream_context(f"[{{heartbeat_batch_interval_ms, {interval_ms}}}]")
    actors = start_upstream_actors(h.create, ctx, channel)
    return ctx, h.create(HeartbeatBufferActor, heartbeat_buffer_args(ctx), NAME), actors


def upstream_lines(caplog: pytest.LogCaptureFixture, method: str = BATCH) -> list[str]:
    prefix = f"Upstream RPC {method} "
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == UPSTREAM_LOGGER and r.getMessage().startswith(prefix)
    ]


@actor_test
async def test_a_failed_batch_heartbeat_is_counted_and_logged_once_a_second(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    channel = FakeChannel()
    channel.fail(BATCH, UpstreamCallError(ResultKind.TRANSPORT, detail="econnrefused"), times=3)
    ctx, actor, actors = start_with_upstream(h, channel)
    h.tell(actor, beat(1))
    await h.wait_until(lambda: h.instance(actor).buffer.delivered_total == 1, what="delivery")
    await h.settle()
    # Three failed flushes 100 ms apart: three errors, one line (the others within its second).
    assert value(ctx, ERRORS, code="transport", rpc_name="batch_heartbeat") == 3
    assert upstream_lines(caplog) == ["Upstream RPC BatchHeartbeat failed: transport econnrefused"]
    # A heartbeat flush never feeds the breaker.
    assert h.instance(actors.upstream).breaker.failures == 0


@actor_test
async def test_a_timed_out_batch_heartbeat_is_counted_with_the_timeout_code(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    channel = FakeChannel()
    channel.fail(BATCH, UpstreamCallError(ResultKind.TIMEOUT, detail="deadline exceeded"))
    ctx, actor, _ = start_with_upstream(h, channel)
    h.tell(actor, beat(1))
    await h.wait_until(lambda: h.instance(actor).buffer.delivered_total == 1, what="delivery")
    await h.settle()
    assert value(ctx, ERRORS, code="timeout", rpc_name="batch_heartbeat") == 1
    assert upstream_lines(caplog) == [
        "Upstream RPC BatchHeartbeat failed: timeout deadline exceeded"
    ]


@actor_test
async def test_a_batch_heartbeat_that_cannot_be_encoded_counts_as_exception(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    channel = FakeChannel()
    channel.fail(BATCH, UpstreamCallError(ResultKind.ENCODE, detail="request_too_large"))
    ctx, actor, _ = start_with_upstream(h, channel)
    h.tell(actor, beat(1))
    dropped = "yuzu_gw_heartbeat_buffer_dropped_total"
    await h.wait_until(
        lambda: value(ctx, dropped, reason="heartbeat_invalid") == 1, what="the drop"
    )
    await h.settle()
    # The manual: "a marshal failure on the heartbeat buffer's flush is counted as
    # code="exception" and is not covered by the encode alert".
    assert value(ctx, ERRORS, code="exception", rpc_name="batch_heartbeat") == 1
    assert value(ctx, ERRORS, code="encode", rpc_name="batch_heartbeat") in (None, 0)
    assert upstream_lines(caplog) == [
        "Upstream RPC BatchHeartbeat raised exception:request_too_large"
    ]


@actor_test
async def test_an_exception_out_of_the_channel_is_counted_by_class_only(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    channel = FakeChannel()

    def boom(_request: object) -> gateway_pb2.BatchHeartbeatResponse:
        raise RuntimeError("session gw-session-secret")

    channel.script(BATCH, boom)
    ctx, actor, _ = start_with_upstream(h, channel)
    h.tell(actor, beat(1))
    await h.wait_until(lambda: h.instance(actor).buffer.delivered_total == 1, what="delivery")
    await h.settle()
    assert value(ctx, ERRORS, code="exception", rpc_name="batch_heartbeat") == 1
    assert upstream_lines(caplog) == ["Upstream RPC BatchHeartbeat raised exception:RuntimeError"]
    assert "secret" not in caplog.text
