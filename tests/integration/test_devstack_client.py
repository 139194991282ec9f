"""The dev stack's operator client (gateway/devstack/client.py) against a real node holding the
dev stack's simulated agents: the typed (betterproto2) SendCommand over grpclib."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.devstack.client import broadcast, send_command
from protos.typed.yuzu.agent.v1 import CommandResponseStatus
from protos.typed.yuzu.server.v1 import SendCommandResponse
from tests.integration.test_ctl import fleet, target
from tests.integration.test_management_plane import gateway

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_send_command_yields_typed_answers_and_broadcast_prints_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as node, fleet(node, 2):
            answers = [
                answer
                async for answer in send_command(
                    target(node), "os", "info", agent_ids=["devstack-agent-0001"], timeout_s=10
                )
            ]
            assert all(isinstance(a, SendCommandResponse) for a in answers)
            assert {a.agent_id for a in answers} == {"devstack-agent-0001"}
            statuses = [a.response.status for a in answers if a.response is not None]
            assert statuses[-1] is CommandResponseStatus.SUCCESS
            assert CommandResponseStatus.RUNNING in statuses
            # broadcast runs its own loop: from a thread, as the printed command line does.
            await asyncio.to_thread(broadcast, target(node), "os", "info", timeout_s=10)

    asyncio.run(body())
    *lines, summary = capsys.readouterr().out.splitlines()
    assert summary == "-- 2 RUNNING, 2 SUCCESS"
    finals = {line.split()[0] for line in lines if line.split()[1] == "SUCCESS"}
    assert finals == {"devstack-agent-0001", "devstack-agent-0002"}
