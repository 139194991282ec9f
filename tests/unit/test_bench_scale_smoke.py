"""Smoke test of `tests.bench.scale`: both phases (one node, then two nodes under the release
supervisor, seeded as one cluster) at 16 agents for a second. Checks the result's shape, that
every heartbeat and broadcast answer was counted with both nodes' CPU, and that commands crossed
to the other node, never the speed."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.bench import scale

pytestmark = pytest.mark.timeout(240)

KEYS = {
    "cpu_per_heartbeat_ratio_2_vs_1",
    "cpu_per_answer_ratio_2_vs_1",
    "cross_node_rtt_ratio",
    "cpu_us_per_heartbeat_1",
    "cpu_us_per_heartbeat_2",
    "cpu_us_per_answer_1",
    "cpu_us_per_answer_2",
    "local_rtt_p50_ms",
    "cross_node_rtt_p50_ms",
    "targets_met",
}


def test_one_and_two_nodes_heartbeat_and_answer_commands() -> None:
    load = scale.Load(
        agents=16,
        loadgens=1,
        warmup_s=0.5,
        window_s=1.0,
        commands=8,
        broadcasts=2,
        heartbeat_interval_s=0.2,
    )
    result = asyncio.run(scale.run(load, quiet=True, repeat=2))
    assert result.keys() >= KEYS
    assert result["heartbeats_failed"] == 0
    assert result["answers_1"] == result["answers_2"] == 2 * 16
    assert result["targets_met"]["all_answered"] is True
    assert result["repeat"] == len(result["rounds"]) == 2
    for one_round in result["rounds"]:
        for nodes in ("1", "2"):
            raw = one_round["raw"][nodes]
            assert raw["heartbeats"] > 0 and raw["heartbeat_cpu_s"] > 0
        # Both nodes held agents (the kernel spread them), and each held some of them.
        spread = one_round["command_agents_per_node_2"]
        assert sum(spread.values()) == 16
        if len(spread) == 2:  # all 16 on one node: 2 in 65,536
            assert one_round["cross_node_rtt_ratio"] == pytest.approx(
                one_round["cross_node_rtt_p50_ms"] / one_round["local_rtt_p50_ms"]
            )
            assert one_round["commands_failed"] == 0
    assert result["cpu_us_per_heartbeat_1"] is not None
    ratios = [r["cpu_per_heartbeat_ratio_2_vs_1"] for r in result["rounds"]]
    assert result["cpu_per_heartbeat_ratio_2_vs_1"] == pytest.approx(sum(ratios) / 2)
    assert result["cpu_per_heartbeat_ratio_2_vs_1_min"] == min(ratios)
    assert result["commands_failed"] == sum(r["commands_failed"] for r in result["rounds"])
    json.dumps(result)
    assert scale.rows(result)
