"""A server restart while the gateway and its agents stay up (seed: "What happens when the server
restarts"): grpcio agents hold Subscribe streams on a real node whose upstream channel dials the
grpcio fake server. The fake's `restart` empties its in-memory registry (the durable directory
survives), so it still acknowledges heartbeats but lists their sessions in every
BatchHeartbeatResponse until they are replayed; ProxyRegister with `x-yuzu-session-id` adopts the
presented session.

What is asserted crosses a wire: what the fake received and holds, the agents' streams, the node's
`/metrics`, and the gateway's log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import grpc
import pytest

from gateway.devstack.fake_upstream import SESSION_METADATA_KEY, Call, FakeUpstream
from gateway.node.node import Node
from protos.yuzu.gateway.v1 import gateway_pb2
from tests.integration.test_agent_plane import Agent, Metrics, gateway, run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NOTIFY = "NotifyStreamStatus"
CONNECTED, DISCONNECTED = 0, 1
# A short start jitter keeps the tests quick; the rest of the replay runs on its defaults.
FAST = ", {registration_replay_start_jitter_ms, 100}"
TRIGGERED = "yuzu_gw_registration_replay_triggered_total"
DROPPED = "yuzu_gw_heartbeat_verdict_dropped_total"


@attrs.define
class Held:
    """One agent: its connection, its session, its open stream and its first CONNECTED."""

    agent_id: str
    agent: Agent
    session_id: str
    stream: Any
    home: str = ""


@contextlib.asynccontextmanager
async def fleet(node: Node, fake: FakeUpstream, n: int) -> AsyncIterator[list[Held]]:
    """n agents registered and subscribed, each on its own connection."""
    agents = [Agent(node) for _ in range(n)]
    try:
        ids = [f"agent-{i:03d}" for i in range(n)]
        answers = await asyncio.gather(*(a.register(i) for a, i in zip(agents, ids, strict=True)))
        held = [
            Held(agent_id, agent, answer.session_id, agent.subscribe(answer.session_id))
            for agent_id, agent, answer in zip(ids, agents, answers, strict=True)
        ]
        await asyncio.gather(*(h.stream.initial_metadata() for h in held))
        calls = await fake.wait_for_calls(NOTIFY, n, answered=True, timeout=20.0)
        homes = {c.request.session_id: c.request.stream_home_id for c in calls}
        for h in held:
            h.home = homes[h.session_id]
        yield held
    finally:
        for agent in agents:
            await agent.close()


async def heartbeat(held: list[Held]) -> None:
    answers = await asyncio.gather(*(h.agent.heartbeat(h.session_id) for h in held))
    assert all(a.acknowledged for a in answers)


def own_registers(fake: FakeUpstream) -> list[Call]:
    """ProxyRegister calls the agents made themselves (no presented session)."""
    return [c for c in fake.calls("ProxyRegister") if SESSION_METADATA_KEY not in c.metadata]


def replays(fake: FakeUpstream) -> list[Call]:
    return [c for c in fake.calls("ProxyRegister") if SESSION_METADATA_KEY in c.metadata]


def recovered(fake: FakeUpstream, held: list[Held]) -> bool:
    return all(fake.session_of(h.agent_id) == h.session_id for h in held)


async def heartbeat_until_recovered(fake: FakeUpstream, held: list[Held], timeout: float) -> None:
    """Agents heartbeat (as they do every 30 s, here every 0.5 s) until the server holds every
    one of their sessions again."""
    async with asyncio.timeout(timeout):
        while not recovered(fake, held):
            await heartbeat(held)
            with contextlib.suppress(TimeoutError):
                await fake.wait_for(lambda: recovered(fake, held), timeout=0.5)


def connected_again(fake: FakeUpstream, held: Held) -> list[Any]:
    return [
        c.request
        for c in fake.calls(NOTIFY)
        if c.request.session_id == held.session_id and c.request.event == CONNECTED
    ]


def assert_no_agent_reconnected(fake: FakeUpstream, held: list[Held], n_registers: int) -> None:
    assert len(own_registers(fake)) == n_registers  # nobody registered again
    assert not any(h.stream.done() for h in held)  # every stream still open
    assert not [c for c in fake.calls(NOTIFY) if c.request.event == DISCONNECTED]


def test_a_server_restart_with_200_agents_recovers_every_agent_without_a_reconnect(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="yuzu_gw.upstream")

    async def body() -> None:
        async with asyncio.timeout(100):
            async with gateway(tmp_path, FAST) as (node, fake), fleet(node, fake, 200) as held:
                before = await Metrics.read(node)
                await fake.restart()  # the server loses every in-memory session
                assert fake.sessions == {}
                await heartbeat_until_recovered(fake, held, 30.0)
                await fake.wait_for(
                    lambda: all(len(connected_again(fake, h)) == 2 for h in held), timeout=10.0
                )
                for h in held:
                    first, again = connected_again(fake, h)
                    assert again.stream_home_id == first.stream_home_id == h.home
                    assert again.agent_id == h.agent_id
                assert_no_agent_reconnected(fake, held, 200)
                # Each session replayed once, carrying its own stored request.
                presented = [c.metadata[SESSION_METADATA_KEY] for c in replays(fake)]
                assert sorted(presented) == sorted(h.session_id for h in held)
                by_session = {h.session_id: h.agent_id for h in held}
                for call in replays(fake):
                    assert (
                        call.request.info.agent_id
                        == by_session[call.metadata[SESSION_METADATA_KEY]]
                    )
                after = await Metrics.read(node)
                assert after.delta(before, TRIGGERED, trigger="server_lost_state") == 1
                assert after.delta(before, "yuzu_gw_registration_replay_total") == 200
                assert after.value("yuzu_gw_registration_replay_queue_depth") == 0
                # The next verdicts list nothing: the server knows everyone again.
                fake.clear()
                await heartbeat(held)
                [batch, *_] = await fake.wait_for_calls("BatchHeartbeat", answered=True)
                assert list(batch.response.unknown_session_ids) == []
        lines = [r.getMessage() for r in caplog.records if r.name == "yuzu_gw.upstream"]
        assert any(
            line.startswith("Registration replay: the server does not know") for line in lines
        )
        assert not any("gw-session-" in line for line in lines)

    run(body)


def test_a_second_restart_within_a_minute_is_recovered_by_the_named_sessions(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with asyncio.timeout(60):
            async with gateway(tmp_path, FAST) as (node, fake), fleet(node, fake, 20) as held:
                before = await Metrics.read(node)
                await fake.restart()
                await heartbeat_until_recovered(fake, held, 20.0)
                await asyncio.sleep(10.5)  # past the 10 s guard window of every session
                await fake.restart()
                await heartbeat_until_recovered(fake, held, 20.0)
                after = await Metrics.read(node)
                # One full replay a minute at most: the second recovery came from the verdicts.
                assert after.delta(before, TRIGGERED, trigger="server_lost_state") == 1
                assert after.delta(before, TRIGGERED, trigger="heartbeat") >= 2
                assert_no_agent_reconnected(fake, held, 20)

    run(body)


def test_a_frozen_server_that_restarts_and_resumes_recovers_every_agent(tmp_path: Path) -> None:
    async def body() -> None:
        extra = FAST + ", {upstream_rpc_timeout_ms, 1000}"
        async with asyncio.timeout(60):
            async with gateway(tmp_path, extra) as (node, fake), fleet(node, fake, 20) as held:
                fake.freeze()
                await heartbeat(held)  # acknowledged by the gateway, buffered
                await fake.wait_for_calls("BatchHeartbeat", timeout=5.0)
                await asyncio.sleep(1.5)  # flushes time out: the heartbeats stay buffered
                await fake.restart()
                fake.unfreeze()
                await heartbeat_until_recovered(fake, held, 20.0)
                assert_no_agent_reconnected(fake, held, 20)
                metrics = await Metrics.read(node)
                assert metrics.value("yuzu_gw_upstream_circuit_breaker_state", state="closed") == 1

    run(body)


def test_a_verdict_truncated_at_4096_replays_every_held_agent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="yuzu_gw.heartbeat_buffer")

    async def body() -> None:
        async with asyncio.timeout(60):
            async with gateway(tmp_path, FAST) as (node, fake), fleet(node, fake, 30) as held:
                before = await Metrics.read(node)
                # Fillers sort after the real ids: the first 4096 are the 30 held and 4066 more.
                fillers = [f"gw-session-z{n:031x}" for n in range(4100)]
                truncated = gateway_pb2.BatchHeartbeatResponse(
                    acknowledged_count=30,
                    unknown_session_ids=[*fillers, *(h.session_id for h in held)],
                    unknown_session_ids_truncated=True,
                )
                fake.script("BatchHeartbeat", truncated)
                await heartbeat(held)
                await fake.wait_for(lambda: len(replays(fake)) == 30, timeout=20.0)
                await fake.wait_for(
                    lambda: all(len(connected_again(fake, h)) == 2 for h in held), timeout=10.0
                )
                after = await Metrics.read(node)
                assert after.delta(before, "yuzu_gw_heartbeat_unknown_truncated_total") == 1
                assert after.delta(before, DROPPED, reason="not_local") == 4066
                assert after.delta(before, TRIGGERED, trigger="server_lost_state") == 1
                assert_no_agent_reconnected(fake, held, 30)
        warnings = [r.getMessage() for r in caplog.records if r.name == "yuzu_gw.heartbeat_buffer"]
        assert [w for w in warnings if w.startswith("Heartbeat verdict truncated by the server")]

    run(body)


def test_accepted_false_on_a_replay_disconnects_only_that_agent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="yuzu_gw.upstream")

    async def body() -> None:
        async with asyncio.timeout(60):
            async with gateway(tmp_path, FAST) as (node, fake), fleet(node, fake, 5) as held:
                refused, kept = held[2], [h for i, h in enumerate(held) if i != 2]
                await fake.restart()
                fake.reject_agents(refused.agent_id, reason="enrollment denied")
                await heartbeat_until_recovered(fake, kept, 20.0)
                # That agent's stream is ended so it registers again by itself...
                async with asyncio.timeout(10):
                    assert await refused.stream.code() is grpc.StatusCode.UNAVAILABLE
                # ...and the server hears its DISCONNECTED once, with its stream home id.
                await fake.wait_for_calls(
                    NOTIFY, where=lambda c: c.request.event == DISCONNECTED, timeout=10.0
                )
                await asyncio.sleep(0.3)
                gone = [c for c in fake.calls(NOTIFY) if c.request.event == DISCONNECTED]
                assert [(c.request.session_id, c.request.stream_home_id) for c in gone] == [
                    (refused.session_id, refused.home)
                ]
                assert len(connected_again(fake, refused)) == 1  # never announced again
                assert not any(h.stream.done() for h in kept)
                assert len(own_registers(fake)) == 5
        lines = [r.getMessage() for r in caplog.records if r.name == "yuzu_gw.upstream"]
        assert (
            "Registration replay: agent-002 was not accepted by the server (enrollment denied);"
            " disconnecting so the agent follows its own registration path"
        ) in lines
        assert not any(refused.session_id in line for line in lines)

    run(body)
