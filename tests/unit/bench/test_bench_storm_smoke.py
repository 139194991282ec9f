"""Smoke test of `tests.bench.storm`: the whole run (fake server, gateway node killed and
restarted, bare server, load generators, all subprocesses) at 12 agents, and its reading of the
admission's metrics. Checks the result's keys and counts, never the speed."""

from __future__ import annotations

import asyncio
import json
import math

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from actors.core.admission import FLOOR, AdmissionLimits, Call
from gateway.agent.admission import AdmissionRefusal, AgentAdmission
from gateway.agent.metrics import agent_metrics
from tests.bench import agents, agents_loadgen, storm, storm_backlog

pytestmark = pytest.mark.timeout(90)

N = 12
KEYS = {
    "connect_timeouts",
    "all_joined_s",
    "cpu_bound_ratio",
    "dropped",
    "max_stall_ms",
    "reconnect_storm_s",
    "refusals",
    "admission",
    "bare",
    "reconnect",
    "accept_queue",
    "targets_met",
}


def test_a_small_storm_joins_every_agent_twice_and_counts_each_admission() -> None:
    result = asyncio.run(storm.run(N, 2, agents.DEFAULT_LATENCY_MS, True))
    assert result.keys() >= KEYS
    assert result["connect_timeouts"] == 0
    assert result["gateway"]["subscribed"] == N
    assert result["all_joined_s"] is not None and result["all_joined_s"] > 0
    assert result["cpu_bound_ratio"] == pytest.approx(
        result["all_joined_s"] / result["gateway"]["cpu_s"]
    )
    bare = result["bare"]
    assert result["cpu_bound_ratio_bare"] == pytest.approx(bare["all_joined_s"] / bare["cpu_s"])
    assert result["cpu_bound_ratio_vs_bare"] == pytest.approx(
        result["cpu_bound_ratio"] / result["cpu_bound_ratio_bare"]
    )
    assert result["dropped"] == 0
    assert result["max_stall_ms"] is not None and result["max_stall_ms"] >= 0
    # At 12 agents nothing is past the bound: each call admitted once per agent, none refused.
    for call in storm.CALLS:
        assert result["admission"][call]["admitted"] == N
        assert sum(result["refusals"][call].values()) == 0
        assert result["admission"][call]["hints"] == 0
    # The restarted node's own counters: every agent came back, each admitted once more.
    reconnect = result["reconnect"]
    assert reconnect["subscribed"] == N
    assert reconnect["subscribe_failed"] == 0
    # Each agent first found the node down (connection refused): a retry, not a connect time-out.
    assert reconnect["join_retries"] >= N
    assert reconnect["connect_timeouts"] == 0
    assert reconnect["announced"] >= N
    assert result["reconnect_storm_s"] == reconnect["seconds_to_all_subscribed"]
    assert result["reconnect_storm_s"] >= reconnect["node_ready_s"] > 0
    for call in storm.CALLS:
        assert reconnect["admission"][call]["admitted"] >= N
    assert result["bare"]["subscribed"] == N
    assert result["bare"]["all_joined_s"] is not None
    assert result["targets_met"]["reconnect_all_back"] is True
    # The agent listener was sampled: its backlog is known, its queue never deeper.
    for queue in (
        result["accept_queue"],
        result["bare"]["accept_queue"],
        reconnect["accept_queue"],
    ):
        assert queue["samples"] > 0
        assert (
            queue["backlog"] is not None and 0 <= queue["accept_queue_max"] <= queue["backlog"] + 1
        )
    json.dumps(result)  # serializable as is
    assert storm.rows(result)


def test_two_nodes_of_a_host_share_the_storm_each_admitting_its_own() -> None:
    result = asyncio.run(storm.run(N, 2, agents.DEFAULT_LATENCY_MS, True, nodes=2))
    assert result["nodes"] == 2
    assert result["gateway"]["subscribed"] == N
    assert result["reconnect"]["subscribed"] == N
    assert len(result["reconnect"]["restarted_pids"]) == 2
    by_node = result["admission_by_node"]
    assert len(by_node) == 2
    # Each node counts the calls it admitted, and only those: together, every agent once.
    for call in storm.CALLS:
        assert sum(node[call]["admitted"] for node in by_node) == N
        assert result["admission"][call]["admitted"] == N


def test_refusals_and_hints_are_read_by_call_and_reason() -> None:
    registry = CollectorRegistry()
    metrics = agent_metrics(registry, lambda: 0)
    limits = AdmissionLimits(pending_max=1, drain_target_s=2.0, hint_max_ms=5000)
    wide = AdmissionLimits(pending_max=FLOOR, drain_target_s=2.0, hint_max_ms=5000)
    admission = AgentAdmission(limits, wide, clock=lambda: 100.0)
    with admission.admitted(Call.REGISTER, metrics):
        for _ in range(3):
            with pytest.raises(AdmissionRefusal), admission.admitted(Call.REGISTER, metrics):
                pass
    with admission.admitted(Call.SUBSCRIBE, metrics):
        pass
    read = storm.admission([generate_latest(registry).decode()])
    register, subscribe = read["register"], read["subscribe"]
    assert register["admitted"] == 1
    assert register["refused"] == {"pending": 3}
    assert register["hints"] == 3
    assert 250 <= register["hint_mean_ms"] <= register["hint_max_ms_at_most"]
    assert not math.isinf(register["hint_max_ms_at_most"])
    assert subscribe["admitted"] == 1
    assert sum(subscribe["refused"].values()) == 0
    assert subscribe["hints"] == 0 and subscribe["hint_mean_ms"] is None


def test_the_accept_queue_is_read_per_listening_port() -> None:
    text = (
        "LISTEN 7      4096       127.0.0.1:40123      0.0.0.0:*\n"
        "LISTEN 0      128          0.0.0.0:2024       0.0.0.0:*\n"
        "LISTEN 0      128             [::]:9100          [::]:*\n"
    )
    assert storm_backlog.parse_ss(text) == {40123: (7, 4096), 2024: (0, 128), 9100: (0, 128)}


@pytest.mark.parametrize(
    ("code", "details", "counted"),
    [
        (
            grpc.StatusCode.UNAVAILABLE,
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1:"
            " connection attempt timed out before receiving SETTINGS frame",
            True,
        ),
        (grpc.StatusCode.UNAVAILABLE, "ipv4:127.0.0.1:1: connect() timed out", True),
        (
            grpc.StatusCode.UNAVAILABLE,
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1:"
            " Failed to connect to remote host: Connection refused",
            False,
        ),
        (grpc.StatusCode.UNAVAILABLE, "Upstream Register failed: timeout", False),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", False),
    ],
)
def test_only_a_connection_not_set_up_in_time_is_a_connect_timeout(
    code: grpc.StatusCode, details: str, counted: bool
) -> None:
    assert agents_loadgen.connect_timeout(code, details) is counted
