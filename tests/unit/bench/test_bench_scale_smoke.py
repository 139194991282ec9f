"""Smoke test of `tests.bench.scale`: its three phases (one node; two nodes under the release
supervisor, seeded as one cluster; the same two not clustered, the control) at 16 agents for a
second, two rounds. Checks the result's shape, that every heartbeat and broadcast answer was
counted with both nodes' CPU, that commands crossed to the other node, that the unclustered
nodes each answered for their own agents, and that the control's ratios decompose the two-node
one, never the speed."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.bench import scale

pytestmark = pytest.mark.timeout(300)

AGENTS = 16
BROADCASTS = 2
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
    # The control: two unclustered nodes.
    "cpu_us_per_heartbeat_2u",
    "cpu_us_per_answer_2u",
    "answers_2u",
    "local_rtt_p50_ms_2u",
}
CONTROL_RATIOS = (
    "cpu_per_heartbeat_ratio_2u_vs_1",
    "cpu_per_heartbeat_ratio_2_vs_2u",
    "cpu_per_answer_ratio_2u_vs_1",
    "cpu_per_answer_ratio_2_vs_2u",
)


def test_one_two_and_two_unclustered_nodes_heartbeat_and_answer_commands() -> None:
    load = scale.Load(
        agents=AGENTS,
        loadgens=1,
        warmup_s=0.5,
        window_s=1.0,
        commands=8,
        broadcasts=BROADCASTS,
        heartbeat_interval_s=0.2,
    )
    result = asyncio.run(scale.run(load, quiet=True, repeat=2))
    assert result.keys() >= KEYS | set(CONTROL_RATIOS)
    assert result["heartbeats_failed"] == 0
    # Unclustered, each node answered for its own agents only: together, every agent once.
    assert result["answers_1"] == result["answers_2"] == result["answers_2u"] == BROADCASTS * AGENTS
    assert result["targets_met"]["all_answered"] is True
    assert set(result["targets_met"]) == {
        "all_answered",
        "cpu_per_heartbeat_ratio_2_vs_1",
        "cpu_per_answer_ratio_2_vs_1",
        "cross_node_rtt_ratio",
    }
    assert result["repeat"] == len(result["rounds"]) == 2
    # The clustered phase in the middle, every other round backwards.
    assert [r["order"] for r in result["rounds"]] == [["1", "2", "2u"], ["2u", "2", "1"]]
    for one_round in result["rounds"]:
        for label in ("1", "2", "2u"):
            raw = one_round["raw"][label]
            # Two broadcasts to 16 agents may cost a phase less than one 10 ms tick of
            # /proc/<pid>/stat, so only the heartbeat window's CPU is sure to be counted.
            assert raw["heartbeats"] > 0 and raw["heartbeat_cpu_s"] > 0
        # Both nodes held agents (the kernel spread them), and each held some of them.
        spread = one_round["command_agents_per_node_2"]
        assert sum(spread.values()) == AGENTS
        assert sum(one_round["command_agents_per_node_2u"].values()) == AGENTS
        if len(spread) == 2:  # all 16 on one node: 2 in 65,536
            assert one_round["cross_node_rtt_ratio"] == pytest.approx(
                one_round["cross_node_rtt_p50_ms"] / one_round["local_rtt_p50_ms"]
            )
        assert one_round["commands_failed"] == 0
        # Within a round the control splits the two-node ratio exactly: host x cluster (the
        # answers' only when their CPU was counted at this size).
        for work in ("heartbeat", "answer"):
            whole, host, cluster = (
                one_round[f"cpu_per_{work}_ratio_{k}"] for k in ("2_vs_1", "2u_vs_1", "2_vs_2u")
            )
            if work == "answer" and None in (whole, host, cluster):
                continue
            assert whole == pytest.approx(host * cluster)
        # Unclustered, local round trips on node 1 (none when the kernel gave it no agent).
        if one_round["local_rtt_p50_ms_2u"] is not None:
            assert len(one_round["cpu_us_per_local_command_by_node_2u"]) == 2
    assert result["cpu_us_per_heartbeat_1"] is not None
    for key in ("cpu_per_heartbeat_ratio_2_vs_1", *CONTROL_RATIOS):
        ratios = [r[key] for r in result["rounds"]]
        if "answer" in key and None in ratios:
            continue
        assert result[key] == pytest.approx(sum(ratios) / 2)
        assert result[f"{key}_min"] == min(ratios)
        assert result[f"{key}_max"] == max(ratios)
    assert result["commands_failed"] == sum(r["commands_failed"] for r in result["rounds"])
    json.dumps(result)
    assert scale.rows(result)
