"""The planned stop end to end (seed: "Planned stop", "Stop timeout coupling"; issue 7 §2,
issue 21 §2 for 5,000 sessions):
grpcio agents hold Subscribe streams on a real node whose upstream is the grpcio fake server,
and `Node.stop` (what SIGTERM runs) drains them.

What is asserted crosses a wire or the log: the DISCONNECTED notices the fake received before
`stop` returned, how each agent's stream ended (UNAVAILABLE with a retry hint), how long the stop
took with a server that never answers, the lost-notification counter, and that a clean stop logs
no crash or supervisor report.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from actors.agents.api import owner_row
from actors.node.api import RoutingStopped, StopAdmitting, StopRouting
from actors.upstream.api import CHANNEL_ACTOR_NAME, REGULATOR_NAME, UPSTREAM_NAME
from gateway.devstack.fake_upstream import SESSION_METADATA_KEY as SESSION
from gateway.devstack.fake_upstream import FakeUpstream
from gateway.listeners.retry_hint import PUSHBACK_HEADER, STOPPING_HINT_MS
from gateway.node.boot import prepare
from gateway.node.node import Node
from protos.yuzu.agent.v1 import agent_pb2
from tests.bench.planned_stop import RECLAIM_PASS, measure
from tests.integration.test_agent_plane import Agent, until
from tests.integration.test_owner_recovery import route
from tests.integration.test_server_restart import CONNECTED, DISCONNECTED, NOTIFY, fleet
from tests.support.node import TEST_CONFIG, http_get, node_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LOST = "yuzu_gw_upstream_notify_lost_total"
# The seed's scale for the planned stop, with its default budget (shutdown_flush_budget_ms).
SCALE_AGENTS = 5000
SCALE_BUDGET_MS = 20000


@contextlib.asynccontextmanager
async def gateway(
    tmp_path: Path, budget_ms: int = 20000, extra: str = ""
) -> AsyncIterator[tuple[Node, FakeUpstream]]:
    """A node dialling a fresh fake server with this flush budget (and `extra` config terms);
    the test stops it (a second stop is skipped)."""
    async with FakeUpstream() as fake:
        config = tmp_path / "planned_stop.config"
        upstream = (
            "{upstream_client, #{channels => [{default_channel,"
            f' [{{http, "127.0.0.1", {fake.port}, []}}], #{{}}}}]}}}}{extra}'
        )
        text = TEST_CONFIG.read_text().replace("{allow_no_upstream, true}", upstream)
        budget = f"{{shutdown_flush_budget_ms, {budget_ms}}}"
        config.write_text(text.replace("{shutdown_flush_budget_ms, 2000}", budget))
        node = Node(prepare(node_env(tmp_path, YUZU_GW_CONFIG=str(config))))
        await node.start()
        try:
            runtime = node.runtime
            assert runtime is not None
            await until(lambda: runtime.whereis(CHANNEL_ACTOR_NAME) is not None, "the channel")
            yield node, fake
        finally:
            if node.runtime is not None and node.runtime.whereis("gateway_sup") is not None:
                await node.stop()


def disconnected(fake: FakeUpstream) -> list[str]:
    return [
        c.request.session_id
        for c in fake.calls(NOTIFY)
        if c.request.event == DISCONNECTED and c.code is grpc.StatusCode.OK
    ]


def reports(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Crash and supervisor reports (supervisors.crash, supervisors.supervisor)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("supervisors") and r.levelno >= logging.ERROR
    ]


def test_a_planned_stop_with_500_agents_delivers_every_disconnected_before_it_returns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        async with asyncio.timeout(100):
            async with gateway(tmp_path) as (node, fake), fleet(node, fake, 500) as held:
                caplog.clear()
                await node.stop()
                # Every session's DISCONNECTED reached the server before the process could
                # exit, with the stream home id its CONNECTED carried.
                assert sorted(disconnected(fake)) == sorted(h.session_id for h in held)
                homes = {
                    c.request.session_id: c.request.stream_home_id
                    for c in fake.calls(NOTIFY)
                    if c.request.event == DISCONNECTED
                }
                assert all(homes[h.session_id] == h.home for h in held)
                # Each agent was told to go: UNAVAILABLE with a jittered retry hint.
                hints = set()
                for h in held:
                    assert await h.stream.code() is grpc.StatusCode.UNAVAILABLE
                    trailers = dict(await h.stream.trailing_metadata())
                    hint = int(trailers[PUSHBACK_HEADER])
                    assert STOPPING_HINT_MS[0] <= hint <= STOPPING_HINT_MS[1]
                    hints.add(hint)
                assert len(hints) > 50  # spread, not one value for the fleet
        assert reports(caplog) == []

    asyncio.run(body())


def test_a_frozen_server_stop_ends_within_the_budget_and_counts_the_rest_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        async with asyncio.timeout(60):
            async with gateway(tmp_path, 1500) as (node, fake), fleet(node, fake, 100):
                fake.freeze(NOTIFY)
                caplog.clear()
                started = time.monotonic()
                stopping = asyncio.ensure_future(node.stop())
                # /metrics answers through the drain (it stops last).
                await asyncio.sleep(0.8)
                status, _ = await http_get(node.ctx.bound["metrics"][1], "/metrics")
                assert status == 200 and not stopping.done()
                await stopping
                elapsed = time.monotonic() - started
                fake.unfreeze(NOTIFY)
                assert elapsed <= 1.5 + 1.0, elapsed
                lost = {
                    sample.labels["reason"]: sample.value
                    for family in node.ctx.registry.collect()
                    for sample in family.samples
                    if sample.name == LOST and sample.labels.get("event") == "disconnected"
                }
                # Nothing was delivered: every DISCONNECTED is counted lost, those never sent
                # as `shutdown`.
                assert sum(lost.values()) == 100
                assert lost["shutdown"] > 0
        lines = [r.getMessage() for r in caplog.records]
        # The store's one WARN names what was never sent by the deadline.
        warns = [line for line in lines if line.startswith("Planned stop: ") and "not sent" in line]
        assert len(warns) == 1, lines
        assert not any("did not finish" in line for line in lines), lines
        assert reports(caplog) == []

    asyncio.run(body())


def test_a_register_during_the_stop_is_refused_unavailable(tmp_path: Path) -> None:
    async def body() -> None:
        async with asyncio.timeout(60):
            async with gateway(tmp_path) as (node, fake), fleet(node, fake, 1):
                fake.freeze(NOTIFY)  # the stop waits in its flush: the listeners still serve
                agent = Agent(node)
                try:
                    await agent.channel.channel_ready()
                    stopping = asyncio.ensure_future(node.stop())
                    await until(lambda: node.runtime.whereis("agent_sup") is None, "step 3")
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await agent.register("late-agent")
                    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
                    fake.unfreeze(NOTIFY)
                    await stopping
                finally:
                    await agent.close()
                assert [c for c in fake.calls("ProxyRegister") if "late" in str(c.request)] == []

    asyncio.run(body())


def test_an_owner_restarted_during_the_stop_sends_its_disconnected_and_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="yuzu_gw.agent")

    async def body() -> None:
        async with asyncio.timeout(60):
            async with gateway(tmp_path) as (node, fake), fleet(node, fake, 1) as [held]:
                runtime = node.runtime
                assert runtime is not None
                # Step 1 of the stop, as PlannedStop.run tells it.
                for name in (REGULATOR_NAME, UPSTREAM_NAME):
                    runtime.tell(runtime.whereis(name), StopAdmitting())
                row = owner_row(runtime, held.session_id)
                assert row is not None
                runtime.kill(row.owner)
                # Its re-registration upstream is refused (stopping): no session comes back and
                # no second DISCONNECTED goes.
                assert await asyncio.wait_for(held.stream.code(), 10) is grpc.StatusCode.UNAVAILABLE
                await asyncio.sleep(0.3)
                events = [
                    (c.request.event, c.request.stream_home_id)
                    for c in fake.calls(NOTIFY)
                    if c.request.session_id == held.session_id
                ]
                assert events == [(CONNECTED, held.home), (DISCONNECTED, held.home)]
                presented = [c for c in fake.calls("ProxyRegister") if SESSION in c.metadata]
                assert presented == []
                restarts = node.ctx.registry.get_sample_value(
                    "yuzu_gw_agent_owner_restarts_total", {"outcome": "disconnected_only"}
                )
                assert restarts == 1
                # The restart's one outcome line names the agent, never the session.
                lines = [r for r in caplog.records if "owner process restarted" in r.getMessage()]
                assert [(r.levelname, r.getMessage()) for r in lines] == [
                    (
                        "WARNING",
                        f"Agent {held.agent_id}: owner process restarted; session not recovered"
                        " (disconnected_only), the agent registers again",
                    )
                ]

    asyncio.run(body())


def test_the_router_stops_taking_commands_and_gives_those_in_flight_their_grace(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with asyncio.timeout(60):
            async with gateway(tmp_path) as (node, fake), fleet(node, fake, 1) as [held]:
                runtime = node.runtime
                assert runtime is not None
                router = runtime.whereis("router")
                assert router is not None
                answered = route(node, "answered", (held.agent_id,))
                unanswered = route(node, "unanswered", (held.agent_id,))
                assert (await held.stream.read()).command_id == "answered"
                assert (await held.stream.read()).command_id == "unanswered"
                loop = asyncio.get_running_loop()
                started = loop.time()
                stopping = asyncio.ensure_future(runtime.ask(router, StopRouting(0.5), 5.0))
                await asyncio.sleep(0.05)  # the ask is on its way
                late = route(node, "late", (held.agent_id,))
                await until(lambda: late.outcome == "completed", "the late command's refusal")
                assert [kind for _, kind, _ in late.answers] == ["agent_disconnected"]
                done = agent_pb2.CommandResponse.Status.SUCCESS
                answer = agent_pb2.CommandResponse(command_id="answered", status=done)
                await held.stream.write(answer)
                # The one answered finishes within the grace; the other is still in flight
                # when the grace ends.
                assert await stopping == RoutingStopped(1)
                assert loop.time() - started >= 0.5
                assert answered.outcome == "completed" and unanswered.outcome is None

    asyncio.run(body())


def test_the_notification_cap_is_raised_so_every_disconnected_fits(tmp_path: Path) -> None:
    async def body() -> None:
        async with asyncio.timeout(60):
            extra = ", {notify_pending_max, 60}"
            async with gateway(tmp_path, extra=extra) as (node, fake):
                agents = [Agent(node) for _ in range(100)]
                try:
                    sessions = []
                    # In batches below the cap of 60, so every CONNECTED is held and sent.
                    for batch in range(0, 100, 40):
                        group = list(enumerate(agents))[batch : batch + 40]
                        answers = await asyncio.gather(
                            *(a.register(f"capped-{i:03d}") for i, a in group)
                        )
                        streams = [
                            a.subscribe(r.session_id)
                            for (_, a), r in zip(group, answers, strict=True)
                        ]
                        await asyncio.gather(*(st.initial_metadata() for st in streams))
                        sessions += [r.session_id for r in answers]
                        await fake.wait_for_calls(NOTIFY, len(sessions), answered=True)
                    # 100 DISCONNECTEDs at once against a cap of 60 held keys: without the
                    # raise (by 2 x 100) about 30 of them would be lost at_capacity.
                    await node.stop()
                    assert sorted(disconnected(fake)) == sorted(sessions)
                    lost = node.ctx.registry.get_sample_value(
                        LOST, {"event": "disconnected", "reason": "at_capacity"}
                    )
                    assert lost == 0
                finally:
                    for agent in agents:
                        await agent.close()

    asyncio.run(body())


@pytest.mark.timeout(240)
def test_a_planned_stop_of_5000_sessions_on_sigterm_delivers_every_disconnected_in_the_budget(
    tmp_path: Path,
) -> None:
    """`python -m gateway` with the default budget, 5,000 grpcio agents (two processes' worth of
    channels), one buffered heartbeat each, then SIGTERM (tests/bench/planned_stop.py: the same
    run by hand). Before issue 21 agent_sup killed the owners still queued for their stop after
    5 s, and theirs sent no DISCONNECTED (half of them at 10,000)."""
    result = asyncio.run(measure(tmp_path, SCALE_AGENTS, SCALE_BUDGET_MS))
    assert result.subscribed == SCALE_AGENTS
    assert result.exit_status == 0
    # Exactly one accepted DISCONNECTED per session, every one inside the budget.
    assert result.disconnected_sessions == SCALE_AGENTS
    assert result.disconnected_repeated == 0
    assert result.last_disconnected_s is not None
    assert result.last_disconnected_s <= SCALE_BUDGET_MS / 1000
    # The heartbeat buffer's last flush (step 4) carried every session's heartbeat.
    assert result.heartbeats_flushed == SCALE_AGENTS
    # No failed notification. (Whether agent_sup's step ends inside its own 5 s bound is a
    # matter of the host's speed, measured by tests/bench/planned_stop.py, not asserted here:
    # past it the stop goes on and the DISCONNECTEDs above still arrive.)
    assert not [line for line in result.lines if "Failed" in line]
    # mem_reclaim reads the agent count every 100 ms here, so the drop would start a pass (a
    # full collection on the loop the owners and the flush need) at once: it is stopped first.
    assert not [line for line in result.lines if RECLAIM_PASS in line]
