"""Admission under a storm on a real node (gateway/agent/admission.py, docs/agent-plane.md
"Admission under a storm"): a Register past the bound is refused RESOURCE_EXHAUSTED with a
`grpc-retry-pushback-ms`, before anything goes upstream, and the agent that waits exactly the
hint (as the dev stack's and the benchmarks' agents do) registers and subscribes on its retry.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from actors.core.admission import HINT_MIN_MS
from gateway.devstack.behaviour import pushback_ms
from tests.integration.test_agent_plane import (
    Metrics,
    agents,
    gateway,
    refused,
    register_calls,
    run,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(40)]

# One Register at a time, so a second one is past the bound; hints at most 5 s.
EXTRA = ", {admission_hint_max_ms, 5000}"
BOUND = ("{register_admission_pending_max, 20000}", "{register_admission_pending_max, 1}")


def test_a_refused_register_carries_the_hint_and_its_retry_succeeds(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path, EXTRA, BOUND) as (node, fake), agents(node, 2) as [a, b]:
            before = await Metrics.read(node)
            fake.freeze("ProxyRegister")
            held = asyncio.ensure_future(a.register("agent-a"))
            await fake.wait_for_calls("ProxyRegister")
            error = await refused(b.register("agent-b"))
            assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "retry after grpc-retry-pushback-ms" in (error.details() or "")
            hint = pushback_ms(error.trailing_metadata())
            assert hint is not None and HINT_MIN_MS <= hint <= 5000
            # Refused before anything went upstream: only agent-a's call reached the server.
            assert len(register_calls(fake)) == 1
            fake.unfreeze("ProxyRegister")
            assert (await held).accepted
            # The agent waits exactly the hint, then registers and subscribes.
            await asyncio.sleep(hint / 1000.0)
            reply = await b.register("agent-b")
            assert reply.accepted and reply.session_id
            call = b.subscribe(reply.session_id)
            await call.initial_metadata()
            assert not call.done()
            call.cancel()
            after = await Metrics.read(node)
            assert (
                after.delta(
                    before, "yuzu_gw_admission_refused_total", call="register", reason="pending"
                )
                == 1
            )
            assert after.delta(before, "yuzu_gw_admission_admitted_total", call="register") == 2
            assert after.value("yuzu_gw_admission_pending", call="register") == 0
            assert after.delta(before, "yuzu_gw_admission_admitted_total", call="subscribe") == 1

    run(body)
