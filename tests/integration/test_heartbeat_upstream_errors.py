"""A server that fails every BatchHeartbeat shows where the operator looks (issue 21): in
`yuzu_gw_upstream_rpc_errors_total{rpc_name="batch_heartbeat"}` on the node's `/metrics`, which
the shipped YuzuGatewayUpstreamErrors alert watches, and in the `Upstream RPC` log lines, while
the breaker stays closed (a heartbeat flush never feeds it).

A real node on loopback dials the grpcio fake server; grpcio agents register, subscribe and
heartbeat through the agent listener; sys_config/test.config flushes every 100 ms.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest

from tests.integration.test_agent_plane import Metrics, gateway, run
from tests.integration.test_server_restart import fleet, heartbeat

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

BATCH = "BatchHeartbeat"
ERRORS = "yuzu_gw_upstream_rpc_errors_total"


def unavailable(metrics: Metrics) -> float:
    """The batch_heartbeat series of code="unavailable" (absent until the first error)."""
    labels = {"code": "unavailable", "rpc_name": "batch_heartbeat"}
    series = ERRORS + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    return metrics.value(ERRORS, **labels) if series in metrics.text else 0.0


def test_a_failing_batch_heartbeat_is_an_upstream_rpc_error_on_metrics_and_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="yuzu_gw.upstream")

    async def body() -> None:
        async with asyncio.timeout(60):
            async with (
                gateway(tmp_path) as (node, fake),
                fleet(node, fake, 2) as held,
            ):
                fake.fail(BATCH, grpc.StatusCode.UNAVAILABLE, times=None, details="overloaded")
                await heartbeat(held)  # acknowledged by the gateway, buffered
                await fake.wait_for_calls(BATCH, 3, answered=True, timeout=10.0)

                async with asyncio.timeout(5):
                    while unavailable(await Metrics.read(node)) < 3:
                        await asyncio.sleep(0.05)
                metrics = await Metrics.read(node)
                assert metrics.value("yuzu_gw_upstream_circuit_breaker_state", state="closed") == 1
                fake.reset_script(BATCH)
                # Still buffered: the next flush delivers both sessions.
                fake.clear()
                await fake.wait_for_calls(BATCH, answered=True, timeout=5.0)
                delivered = {
                    hb.session_id for c in fake.calls(BATCH) for hb in c.request.heartbeats
                }
                assert delivered == {h.session_id for h in held}
        lines = [r.getMessage() for r in caplog.records if r.name == "yuzu_gw.upstream"]
        failed = [line for line in lines if line.startswith("Upstream RPC BatchHeartbeat")]
        assert failed and set(failed) == {
            "Upstream RPC BatchHeartbeat failed: UNAVAILABLE overloaded"
        }
        assert not any("gw-session-" in line for line in lines)

    run(body)
