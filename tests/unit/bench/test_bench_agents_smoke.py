"""Smoke test of `tests.bench.agents`: the whole run (fake server, gateway node, bare server,
load generators, all subprocesses) at 20 agents. Checks the result's shape and that every
agent subscribed with no notification dropped, never the speed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.node.loop_monitor import STALL_BUCKETS
from tests.bench import agents, agents_loadgen
from tests.bench.common import REPO_ROOT

pytestmark = pytest.mark.timeout(60)

KEYS = {
    "agents",
    "cpu_per_agent_ratio",
    "memory_per_agent_ratio",
    "kb_per_agent",
    "bare_kb_per_stream",
    "notifications_dropped",
    "max_loop_stall_ms",
}


def test_twenty_agents_all_subscribed_none_dropped() -> None:
    heartbeating = agents.Heartbeating(window_s=1.0, interval_s=0.5)
    result = asyncio.run(agents.run(20, 2, agents.DEFAULT_LATENCY_MS, True, heartbeating))
    assert result.keys() >= KEYS
    assert result["agents"] == 20
    assert result["subscribed"] == 20
    assert result["subscribe_failed"] == 0
    assert result["join_retries"] == 0
    assert result["announced"] == 20
    assert result["seconds_to_all_subscribed"] is not None
    assert result["notifications_dropped"] == 0
    assert result["bare"]["subscribed"] == 20
    assert result["heartbeats_acknowledged"] >= 20
    assert result["heartbeats_failed"] == 0
    # The window's bound is one of the histogram's bucket bounds (gateway/node/loop_monitor.py).
    bound = result["max_loop_stall_ms"]
    assert any(abs(bound - 1000.0 * b) < 1e-6 for b in STALL_BUCKETS), bound
    assert result["max_loop_stall_after_wave_ms"] >= 0
    assert result["stalls_over_target_in_window"] >= 0
    assert result["targets_met"]["all_subscribed"] is True
    json.dumps(result)  # serializable as is
    assert agents.rows(result)


@pytest.mark.parametrize(("failures", "joined"), [(0, True), (2, True), (5, True), (6, False)])
def test_a_failed_join_is_tried_again_after_each_backoff_step(
    monkeypatch: pytest.MonkeyPatch, failures: int, joined: bool
) -> None:
    """As the real agent: a failed Register or Subscribe is retried once per backoff step, and
    the agent gives up only after the last step (five retries)."""
    steps = len(agents_loadgen.RECONNECT_BACKOFF_S)
    monkeypatch.setattr(agents_loadgen, "RECONNECT_BACKOFF_S", (0.0,) * steps)
    outcomes = iter([False] * failures + [True])

    async def attempt(self: agents_loadgen.Agent, *, wait_for_ready: bool) -> bool:
        return next(outcomes)

    monkeypatch.setattr(agents_loadgen.Agent, "_attempt", attempt)

    async def join() -> agents_loadgen.Agent:
        agent = agents_loadgen.Agent("127.0.0.1:9", "bench-agent-000000", 64)
        try:
            assert await agent.join() is joined
        finally:
            await agent.close()
        return agent

    assert asyncio.run(join()).retries == min(failures, steps)


def test_json_is_the_last_line_of_stdout(tmp_path: Path) -> None:
    out = tmp_path / "agents.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.bench.agents",
            "--agents",
            "4",
            "--quiet",
            "--heartbeat-window-s",
            "0.5",
            "--json",
            "--out",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=50,
        check=True,
    )
    last = json.loads(completed.stdout.strip().splitlines()[-1])
    assert last == json.loads(out.read_text())
    assert last.keys() >= KEYS
    assert last["notifications_dropped"] == 0
    assert last["max_loop_stall_ms"] is not None
