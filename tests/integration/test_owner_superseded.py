"""A restarted owner whose agent registered a newer session meanwhile (seed: "When an agent's
owner process crashes", step 3, and "Stream Status Notification"): it neither registers nor
presents the old session again, the registry never indexes it, commands go to the live stream,
and the old session's one DISCONNECTED is the only notice the server gets for it after the
crash. A real node on loopback with the grpcio fake server and grpcio agents.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from actors.agents.api import owner_row
from actors.registry.api import agent_session, binding_of, session_of
from protos.yuzu.agent.v1 import agent_pb2
from tests.integration.test_agent_plane import Agent, gateway, run, until
from tests.integration.test_owner_recovery import events, owner_of, route
from tests.integration.test_server_restart import CONNECTED, DISCONNECTED, NOTIFY, fleet, replays

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_a_newer_session_registered_during_recovery_wins(tmp_path: Path) -> None:
    async def body() -> None:
        async with asyncio.timeout(60):
            async with gateway(tmp_path) as (node, fake), fleet(node, fake, 1) as [held]:
                runtime = node.runtime
                assert runtime is not None
                # The killed owner's DISCONNECTED is held at the server, so the restarted owner
                # is still waiting for it to settle when the agent registers again.
                fake.freeze(NOTIFY)
                runtime.kill(owner_of(node, held))
                await fake.wait_for(
                    lambda: (DISCONNECTED, held.home) in events(fake, held), timeout=10.0
                )
                newer = Agent(node)
                try:
                    answer = await newer.register(held.agent_id)
                    assert answer.session_id != held.session_id
                    stream = newer.subscribe(answer.session_id)
                    await stream.initial_metadata()
                    await until(
                        lambda: session_of(runtime, answer.session_id) is not None, "s2 live"
                    )
                    fake.unfreeze(NOTIFY)
                    # The restarted owner of s1 ends: its stream closed, nothing presented.
                    code = await asyncio.wait_for(held.stream.code(), 10)
                    assert code is grpc.StatusCode.UNAVAILABLE
                    await until(lambda: owner_row(runtime, held.session_id) is None, "s1 gone")
                    assert replays(fake) == []
                    assert session_of(runtime, held.session_id) is None
                    assert binding_of(runtime, held.session_id) is None
                    live = agent_session(runtime, held.agent_id)
                    assert live is not None and live.session_id == answer.session_id
                    # A command for the agent goes to s2's stream.
                    sink = route(node, "to-newer", (held.agent_id,))
                    request = await asyncio.wait_for(stream.read(), 5)
                    assert request.command_id == "to-newer"
                    done = agent_pb2.CommandResponse.Status.SUCCESS
                    await stream.write(
                        agent_pb2.CommandResponse(command_id="to-newer", status=done)
                    )
                    await until(lambda: sink.outcome == "completed", "the command")
                    # s1 at the server: its CONNECTED, then exactly one DISCONNECTED.
                    await asyncio.sleep(0.3)
                    assert events(fake, held) == [
                        (CONNECTED, held.home),
                        (DISCONNECTED, held.home),
                    ]
                finally:
                    await newer.close()

    run(body)
