"""The overload go-away of an agent listener (issue 7; seed 001's OVERLOADED go-away) on the wire:
raw HTTP/2 clients that ignore the GOAWAY against a bare listener actor, then grpcio agents
holding Subscribe streams on a real node whose upstream is the grpcio fake server. The GOAWAY
counter is checked alongside, and its other reasons where a listener sends them.

Each test waits for the policy's own 5 s checks and 5 s grace (the seed's numbers): they are
the behaviour under test, not a tunable."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from h2.errors import ErrorCodes
from hyperframe.frame import GoAwayFrame

from actors.core.overload_goaway import GRACE_S, TICK_S
from actors.upstream.api import CHANNEL_ACTOR_NAME
from gateway.devstack.fake_upstream import FakeUpstream
from gateway.listeners.listener_actor import actor_name
from gateway.listeners.metrics import GOAWAY_REASONS
from gateway.listeners.retry_hint import OVERLOADED_HINT_MS, PUSHBACK_HEADER
from gateway.listeners.server import ListenerServer
from gateway.node.node import Node
from tests.integration.test_agent_plane import until
from tests.integration.test_goaway import Frames
from tests.integration.test_listener import RawH2, Started, listener_test, start
from tests.integration.test_server_restart import DISCONNECTED, NOTIFY, Held, fleet, heartbeat
from tests.support.actors import Harness
from tests.support.node import TEST_CONFIG, running_node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

GOAWAY = "yuzu_gw_listener_goaway_sent_total"
# A check, then the grace, then a margin for a loaded machine.
SENT_WITHIN_S = TICK_S + 2.0
CLOSED_WITHIN_S = TICK_S + GRACE_S + 2.0
# The node's agent listener: room for 11 connections (10 agents and one more).
HIGH = 11
LOW = 6
FLEET = 10
OVERLOAD = f", overload_goaway => #{{low_watermark => {LOW}}}"


def goaways(started: Started, reason: str) -> float:
    return started.metric(GOAWAY, listener="agent", reason=reason)


def debug_of(frame: GoAwayFrame) -> tuple[str, int]:
    reason, retry = frame.additional_data.decode("ascii").split()
    assert reason.startswith("reason=") and retry.startswith("retry_after_ms=")
    return reason.removeprefix("reason="), int(retry.removeprefix("retry_after_ms="))


async def watch(frames: Frames, seen: list[GoAwayFrame]) -> None:
    """Read the server's frames (answering none of them) until it closes the connection."""
    with contextlib.suppress(EOFError):
        while True:
            frame = await frames.next(timeout=60.0)  # cancelled by the test before
            if isinstance(frame, GoAwayFrame):
                seen.append(frame)


def test_clients_that_ignore_the_goaway_are_closed_after_the_grace() -> None:
    async def body(h: Harness) -> None:
        extra = "limits => #{max_connections => 3}, overload_goaway => #{low_watermark => 1}"
        listener = start(h, extra)
        assert all(goaways(listener, reason) == 0 for reason in GOAWAY_REASONS)
        raws = [await RawH2.open(listener.port) for _ in range(3)]
        seen: list[list[GoAwayFrame]] = [[], [], []]
        watchers = [
            asyncio.ensure_future(watch(Frames(raw), frames))
            for raw, frames in zip(raws, seen, strict=True)
        ]
        try:
            await h.wait_until(lambda: goaways(listener, "grace_ended") == 2, CLOSED_WITHIN_S)
            await asyncio.sleep(0.2)  # the closed ones' EOF reaches their watcher
            told = [frames for frames in seen if frames]
            # Two of the three, down to the low watermark of 1: a graceful GOAWAY each, with the
            # reason and a retry time, then the final one before the close. The third is kept.
            assert len(told) == 2
            for graceful, final in told:
                assert graceful.error_code == final.error_code == ErrorCodes.NO_ERROR
                reason, retry_ms = debug_of(graceful)
                assert reason == "overloaded"
                assert OVERLOADED_HINT_MS[0] <= retry_ms <= OVERLOADED_HINT_MS[1]
            done = [task.done() for task in watchers]
            assert sorted(done) == [False, True, True]
            assert listener.actor.server.connections == 1
            assert goaways(listener, "overloaded") == 2
        finally:
            for task in watchers:
                task.cancel()
            for raw in raws:
                raw.close()

    listener_test(body)


def test_idle_and_stop_goaways_are_counted_with_their_reason() -> None:
    async def body(h: Harness) -> None:
        listener = start(h, "http2 => #{idle_timeout => 1000}")
        quiet = await RawH2.open(listener.port)
        late: RawH2 | None = None
        try:
            await h.wait_until(lambda: goaways(listener, "idle_timeout") == 1, 3.0)
            await h.wait_until(lambda: listener.actor.server.connections == 0)
            # One made now is still inside its idle timeout when the listener stops.
            late = await RawH2.open(listener.port)
            await h.wait_until(lambda: listener.actor.server.live() != [])
            listener.actor.server.close()
            assert goaways(listener, "listener_stopped") == 1
            assert goaways(listener, "idle_timeout") == 1
            assert goaways(listener, "overloaded") == 0  # not configured: never sent
        finally:
            quiet.close()
            if late is not None:
                late.close()

    listener_test(body)


# -- grpcio agents on a node ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def node_with(tmp_path: Path, overload: str) -> AsyncIterator[tuple[Node, FakeUpstream]]:
    """A node dialling a fresh fake server, its agent listener limited to HIGH connections and
    with `overload` in its entry."""
    async with FakeUpstream() as fake:
        upstream = (
            "{upstream_client, #{channels => [{default_channel,"
            f' [{{http, "127.0.0.1", {fake.port}, []}}], #{{}}}}]}}}}'
        )
        limits = "limits => #{max_connections => 1000}"
        text = TEST_CONFIG.read_text().replace("{allow_no_upstream, true}", upstream)
        assert limits in text
        text = text.replace(limits, f"limits => #{{max_connections => {HIGH}}}{overload}")
        config = tmp_path / "overload.config"
        config.write_text(text)
        async with running_node(tmp_path, YUZU_GW_CONFIG=str(config)) as node:
            runtime = node.runtime
            assert runtime is not None
            await until(lambda: runtime.whereis(CHANNEL_ACTOR_NAME) is not None, "the channel")
            yield node, fake


def agent_server(node: Node) -> ListenerServer:
    runtime = node.runtime
    assert runtime is not None
    address = runtime.whereis(actor_name("agent"))
    assert address is not None
    ref = runtime.ref(address)
    assert ref is not None
    server: ListenerServer = ref.instance.server
    return server


def node_goaways(node: Node, reason: str) -> float:
    value = node.ctx.registry.get_sample_value(GOAWAY, {"listener": "agent", "reason": reason})
    assert value is not None  # every series exists from the start
    return value


@contextlib.asynccontextmanager
async def one_more_connection(node: Node) -> AsyncIterator[grpc.aio.Channel]:
    """The connection that takes the listener to its high watermark: a grpcio channel that
    connects and makes no call (so whether it is chosen cannot race a Subscribe being opened)."""
    port = node.ctx.bound["listener_agent"][1]
    chan = grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
    )
    try:
        await asyncio.wait_for(chan.channel_ready(), 5)
        await until(lambda: agent_server(node).connections == FLEET + 1, "the 11th connection")
        yield chan
    finally:
        await chan.close()


def test_at_the_high_watermark_agents_are_sent_away_down_to_the_low_one(tmp_path: Path) -> None:
    async def body() -> None:
        async with asyncio.timeout(50):
            async with (
                node_with(tmp_path, OVERLOAD) as (node, fake),
                fleet(node, fake, FLEET) as held,
                one_more_connection(node) as extra,
            ):
                assert node_goaways(node, "overloaded") == 0
                expected = HIGH - LOW
                await until(
                    lambda: node_goaways(node, "overloaded") == expected,
                    "the overload go-away",
                    SENT_WITHIN_S,
                )
                # The listener closes what its clients did not: then exactly LOW are held.
                await until(
                    lambda: agent_server(node).connections == LOW, "the grace", GRACE_S + 2.0
                )
                assert node_goaways(node, "overloaded") == expected  # once, not every check

                def told() -> int:
                    extra_chosen = extra.get_state() is not grpc.ChannelConnectivity.READY
                    return sum(h.stream.done() for h in held) + extra_chosen

                # The client side may learn of a close a moment after the listener.
                await until(lambda: told() == expected, "the agents sent away")
                ended = [h for h in held if h.stream.done()]
                kept = [h for h in held if not h.stream.done()]
                await ended_with_a_retry_time(ended)
                # Their sessions ended: one DISCONNECTED each reached the server.
                await fake.wait_for_calls(NOTIFY, FLEET + len(ended), answered=True)
                gone = {
                    c.request.session_id
                    for c in fake.calls(NOTIFY)
                    if c.request.event == DISCONNECTED
                }
                assert gone == {h.session_id for h in ended}
                # The others keep working: their sessions heartbeat on their connections.
                await heartbeat(kept)
                assert not any(h.stream.done() for h in kept)

    asyncio.run(body())


async def ended_with_a_retry_time(ended: list[Held]) -> None:
    for h in ended:
        assert await h.stream.code() is grpc.StatusCode.UNAVAILABLE
        hint = int(dict(await h.stream.trailing_metadata())[PUSHBACK_HEADER])
        assert OVERLOADED_HINT_MS[0] <= hint <= OVERLOADED_HINT_MS[1]


def test_without_overload_goaway_nothing_is_sent_at_max_connections(tmp_path: Path) -> None:
    async def body() -> None:
        async with asyncio.timeout(50):
            async with (
                node_with(tmp_path, "") as (node, fake),
                fleet(node, fake, FLEET) as held,
                one_more_connection(node) as extra,
            ):
                # Past a check of the policy, had it been on (its high mark would be
                # max_connections, reached now).
                await asyncio.sleep(SENT_WITHIN_S)
                assert node_goaways(node, "overloaded") == 0
                assert not any(h.stream.done() for h in held)
                assert extra.get_state() is grpc.ChannelConnectivity.READY
                assert agent_server(node).connections == HIGH

    asyncio.run(body())
