"""Owner-crash recovery end to end (seed: "When an agent's owner process crashes"; issue 7 §1):
grpcio agents hold Subscribe streams on a real node whose upstream is the grpcio fake server;
owners are killed (`runtime.kill`: no terminate) or crash (`exit_actor` with a crash reason:
terminate runs) under them.

What is asserted crosses a wire: what the fake received (one DISCONNECTED per crash, the
ProxyRegister presenting the session, CONNECTED with the same stream home id), the agents'
streams (still open, commands read from them), the router's answers, `/metrics` and the log.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest

from actors.agents.api import AGENT_SUP_NAME, owner_row
from actors.router.api import ROUTER_NAME, RouteCommand
from actors.upstream.api import UPSTREAM_NAME
from gateway.devstack.fake_upstream import FakeUpstream
from gateway.listeners.retry_hint import PUSHBACK_HEADER
from gateway.node.node import Node
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2
from supervisors.reason import ExitReason
from tests.integration.test_agent_plane import Metrics, gateway, run, until
from tests.integration.test_server_restart import (
    CONNECTED,
    DISCONNECTED,
    NOTIFY,
    Held,
    fleet,
    own_registers,
    replays,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RESTARTS = "yuzu_gw_agent_owner_restarts_total"
CRASH = ExitReason("crash", "RuntimeError", "test")


class Sink:
    """The operator's side of one routed command."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, str, int]] = []
        self.outcome: str | None = None

    def put(self, response: management_pb2.SendCommandResponse, kind: str, final: bool) -> None:
        self.answers.append((response.agent_id, kind, response.response.status))

    def finish(self, outcome: str) -> None:
        self.outcome = outcome


def route(node: Node, command_id: str, agent_ids: tuple[str, ...], timeout: int = 30) -> Sink:
    runtime = node.runtime
    assert runtime is not None
    router = runtime.whereis(ROUTER_NAME)
    assert router is not None
    sink = Sink()
    command = agent_pb2.CommandRequest(command_id=command_id, plugin="os", action="info")
    runtime.tell(router, RouteCommand(command, agent_ids, timeout, sink))
    return sink


def owner_of(node: Node, held: Held) -> Any:
    assert node.runtime is not None
    row = owner_row(node.runtime, held.session_id)
    assert row is not None
    return row.owner


def events(fake: FakeUpstream, held: Held) -> list[tuple[int, str]]:
    return [
        (c.request.event, c.request.stream_home_id)
        for c in fake.calls(NOTIFY)
        if c.request.session_id == held.session_id
    ]


def recovered_times(fake: FakeUpstream, held: Held, n: int) -> bool:
    """`n` crashes recovered: the first CONNECTED, then n (DISCONNECTED, CONNECTED) pairs."""
    return [e for e, _ in events(fake, held)] == [CONNECTED] + [DISCONNECTED, CONNECTED] * n


def live_again(node: Node, held: Held, old_owner: Any) -> bool:
    assert node.runtime is not None
    row = owner_row(node.runtime, held.session_id)
    return row is not None and row.owner != old_owner and row.state == "live"


async def command_reaches(node: Node, held: list[Held], command_id: str) -> None:
    """A command through the router reaches every agent on its open stream and is answered."""
    sink = route(node, command_id, tuple(h.agent_id for h in held))
    for request in await asyncio.gather(*(h.stream.read() for h in held)):
        assert request.command_id == command_id
    done = agent_pb2.CommandResponse.Status.SUCCESS
    await asyncio.gather(
        *(
            h.stream.write(agent_pb2.CommandResponse(command_id=command_id, status=done))
            for h in held
        )
    )
    await until(lambda: sink.outcome == "completed", "the command to complete", 10.0)
    assert sorted(a for a, kind, _ in sink.answers if kind == "agent") == sorted(
        h.agent_id for h in held
    )


def test_a_crashed_owner_with_a_command_in_flight_recovers_its_session(tmp_path: Path) -> None:
    async def body() -> None:
        async with asyncio.timeout(60):
            async with gateway(tmp_path) as (node, fake), fleet(node, fake, 1) as [held]:
                runtime = node.runtime
                assert runtime is not None
                before = await Metrics.read(node)
                sink = route(node, "in-flight", (held.agent_id,))
                assert (await held.stream.read()).command_id == "in-flight"
                owner = owner_of(node, held)
                runtime.exit_actor(owner, CRASH)  # an exception: terminate runs
                # The command in flight at the crash answers agent_disconnected.
                await until(lambda: sink.outcome == "completed", "the failed command")
                assert sink.answers == [
                    (held.agent_id, "agent_disconnected", agent_pb2.CommandResponse.FAILURE)
                ]
                await fake.wait_for(lambda: recovered_times(fake, held, 1), timeout=10.0)
                # One DISCONNECTED, then the same session presented, then CONNECTED, all with
                # the stream home id the agent's session started with.
                assert events(fake, held) == [
                    (CONNECTED, held.home),
                    (DISCONNECTED, held.home),
                    (CONNECTED, held.home),
                ]
                [presented] = replays(fake)
                assert presented.metadata["x-yuzu-session-id"] == held.session_id
                assert presented.request.info.agent_id == held.agent_id
                await until(lambda: live_again(node, held, owner), "the restarted owner")
                # The agent kept its stream and session: no new Register, heartbeats admitted.
                assert len(own_registers(fake)) == 1 and not held.stream.done()
                assert (await held.agent.heartbeat(held.session_id)).acknowledged
                await command_reaches(node, [held], "after")
                after = await Metrics.read(node)
                assert after.delta(before, RESTARTS, outcome="recovered") == 1
                assert after.delta(before, RESTARTS, outcome="disconnected_only") == 0
                assert after.delta(before, RESTARTS, outcome="gave_up") == 0

    run(body)


def test_a_killed_owner_leaves_its_command_to_time_out_and_recovers(tmp_path: Path) -> None:
    async def body() -> None:
        async with asyncio.timeout(60):
            async with gateway(tmp_path) as (node, fake), fleet(node, fake, 1) as [held]:
                runtime = node.runtime
                assert runtime is not None
                sink = route(node, "in-flight", (held.agent_id,), timeout=2)
                assert (await held.stream.read()).command_id == "in-flight"
                owner = owner_of(node, held)
                runtime.kill(owner)  # no terminate: nobody answers the command
                await fake.wait_for(lambda: recovered_times(fake, held, 1), timeout=10.0)
                await until(lambda: sink.outcome == "timeout", "the command's deadline", 5.0)
                assert [kind for _, kind, _ in sink.answers] == ["timeout"]
                assert not held.stream.done()
                await command_reaches(node, [held], "after")

    run(body)


def test_a_presentation_the_server_fails_feeds_the_breaker_and_ends_the_stream(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with asyncio.timeout(60):
            async with gateway(tmp_path) as (node, fake), fleet(node, fake, 1) as [held]:
                runtime = node.runtime
                assert runtime is not None
                fake.fail("ProxyRegister", grpc.StatusCode.UNAVAILABLE)
                runtime.kill(owner_of(node, held))
                assert await asyncio.wait_for(held.stream.code(), 10) is grpc.StatusCode.UNAVAILABLE
                # The presenting worker's call path tells its outcome: the RPC error metric and
                # the breaker see a recovery's ProxyRegister like any other.
                errors = node.ctx.registry.get_sample_value(
                    "yuzu_gw_upstream_rpc_errors_total",
                    {"code": "unavailable", "rpc_name": "register"},
                )
                assert errors == 1
                upstream = runtime.ref(runtime.whereis(UPSTREAM_NAME))  # type: ignore[arg-type]
                assert upstream is not None and upstream.instance.breaker.failures == 1

    run(body)


def test_ten_percent_of_500_owners_killed_at_once_all_recover(tmp_path: Path) -> None:
    async def body() -> None:
        async with asyncio.timeout(150):
            async with gateway(tmp_path) as (node, fake), fleet(node, fake, 500) as held:
                runtime = node.runtime
                assert runtime is not None
                before = await Metrics.read(node)
                killed = held[::10]
                owners = [owner_of(node, h) for h in killed]
                for owner in owners:
                    runtime.kill(owner)
                # Heartbeats of the killed sessions stay admitted through the gap.
                answers = await asyncio.gather(*(h.agent.heartbeat(h.session_id) for h in killed))
                assert all(a.acknowledged for a in answers)
                await fake.wait_for(
                    lambda: all(recovered_times(fake, h, 1) for h in killed), timeout=30.0
                )
                for h in killed:
                    assert events(fake, h) == [
                        (CONNECTED, h.home),
                        (DISCONNECTED, h.home),
                        (CONNECTED, h.home),
                    ]
                for h, owner in zip(killed, owners, strict=True):
                    await until(lambda h=h, owner=owner: live_again(node, h, owner), "owners")
                spared = [h for h in held if h not in killed]
                assert all(events(fake, h) == [(CONNECTED, h.home)] for h in spared)
                # No agent reconnected: 500 Registers in all, every stream open.
                assert len(own_registers(fake)) == 500
                assert not any(h.stream.done() for h in held)
                assert sorted(c.metadata["x-yuzu-session-id"] for c in replays(fake)) == sorted(
                    h.session_id for h in killed
                )
                await command_reaches(node, killed, "after-kill")
                after = await Metrics.read(node)
                assert after.delta(before, RESTARTS, outcome="recovered") == 50

    run(body)


def test_a_crash_loop_gives_up_on_the_fourth_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="yuzu_gw.agent")

    async def body() -> None:
        async with asyncio.timeout(90):
            async with gateway(tmp_path) as (node, fake), fleet(node, fake, 1) as [held]:
                runtime = node.runtime
                assert runtime is not None
                before = await Metrics.read(node)
                for n in (1, 2, 3):
                    owner = owner_of(node, held)
                    runtime.kill(owner)
                    await fake.wait_for(lambda n=n: recovered_times(fake, held, n), timeout=10.0)
                    await until(lambda owner=owner: live_again(node, held, owner), "recovery")
                    assert not held.stream.done()
                runtime.kill(owner_of(node, held))
                # The 4th restart within 60 s: its DISCONNECTED, the stream closed, one WARN.
                assert await asyncio.wait_for(held.stream.code(), 10) is grpc.StatusCode.UNAVAILABLE
                await fake.wait_for(lambda: len(events(fake, held)) == 8, timeout=5.0)
                await asyncio.sleep(0.3)
                assert [e for e, _ in events(fake, held)] == [CONNECTED, DISCONNECTED] * 4
                assert {home for _, home in events(fake, held)} == {held.home}
                await until(lambda: owner_row(runtime, held.session_id) is None, "the row gone")
                after = await Metrics.read(node)
                assert after.delta(before, RESTARTS, outcome="recovered") == 3
                assert after.delta(before, RESTARTS, outcome="gave_up") == 1
        # One line naming each restart's outcome: three recoveries, then the give-up's WARN.
        outcomes = [
            (r.levelname, r.getMessage())
            for r in caplog.records
            if "owner process restarted" in r.getMessage()
        ]
        recovered = "Agent agent-000: owner process restarted; session recovered on the same stream"
        assert outcomes == [("INFO", recovered)] * 3 + [
            (
                "WARNING",
                "Agent agent-000: owner process restarted more than 3 times in 60 s; giving up",
            )
        ]

    run(body)


def test_escalation_past_the_intensity_restarts_agent_sup_and_recovers_orphans(
    tmp_path: Path,
) -> None:
    extra = ", {agent_restart_intensity, 2}, {agent_restart_period_s, 10}"

    async def body() -> None:
        async with asyncio.timeout(60):
            async with gateway(tmp_path, extra) as (node, fake), fleet(node, fake, 6) as held:
                runtime = node.runtime
                assert runtime is not None
                first_sup = runtime.whereis(AGENT_SUP_NAME)
                killed, running = held[:3], held[3:]
                for h in killed:
                    runtime.kill(owner_of(node, h))
                # The 3rd restart in 10 s is past the intensity: agent_sup stops every owner
                # still running and gateway_sup starts a new one.
                await until(
                    lambda: runtime.whereis(AGENT_SUP_NAME) not in (None, first_sup),
                    "a new agent_sup",
                )
                # Every session ends with exactly one DISCONNECTED whatever happened to it, and
                # each orphan (killed, its row left) is restarted by the new agent_sup and
                # recovers on its open stream.
                orphans = [h for h in killed if not h.stream.done()]
                assert orphans, "the owner whose crash escalated was left without one"
                # Within the test's bound, not a speed target: on a loaded 2-core host the new
                # agent_sup's restarts and the recoveries' calls can take more than 10 s.
                await fake.wait_for(
                    lambda: all(recovered_times(fake, h, 1) for h in orphans), timeout=30.0
                )
                for h in orphans:
                    assert {home for _, home in events(fake, h)} == {h.home}
                for h in running:
                    # Stopped on the way down: their DISCONNECTED, their streams closed. No
                    # retry hint: the gateway is not stopping, the agents reconnect at once.
                    assert await asyncio.wait_for(h.stream.code(), 5) is grpc.StatusCode.UNAVAILABLE
                    assert PUSHBACK_HEADER not in dict(await h.stream.trailing_metadata())
                    assert [e for e, _ in events(fake, h)] == [CONNECTED, DISCONNECTED]
                await command_reaches(node, orphans, "after-escalation")

    run(body)
