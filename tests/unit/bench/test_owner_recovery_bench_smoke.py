"""Keeps `python -m tests.bench.owner_kill` from rotting: runs it at a small size (a real node,
the fake server in a subprocess, a few rounds) and checks the shape and the counts of the
result; checks how the rounds are chosen, paced and summarised. Speed is not asserted here."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

import pytest
from thespian.actors import ActorSystem

from actors.agents.api import AGENT_SUP_NAME
from actors.agents.sup import AgentSup, AgentSupArgs
from supervisors.runtime import LoopSystemBase
from tests.bench import owner_kill
from tests.bench.common import format_table

pytestmark = pytest.mark.timeout(120)

REQUIRED_KEYS = {
    "agents",
    "killed",
    "recovered",
    "recovery_ms",
    "bare_calls_ms",
    "recovery_ratio_vs_bare",
    "reconnects",
}


def test_a_small_owner_kill_recovers_every_killed_owner_of_every_round() -> None:
    result = asyncio.run(owner_kill.run_benchmark(agents=100, killed_n=10, repeat=3, quiet=True))

    assert result.keys() >= REQUIRED_KEYS
    assert (result["agents"], result["killed"], result["bare_calls"]) == (100, 10, 30)
    assert result["repeat"] == len(result["rounds"]) == 3
    assert [r["recovered"] for r in result["rounds"]] == [10, 10, 10]
    assert (result["recovered"], result["recovered_total"], result["killed_total"]) == (10, 30, 30)
    assert result["reconnects"] == 0
    assert result["targets_met"]["all_recovered"] and result["targets_met"]["no_reconnects"]
    for r in result["rounds"]:
        assert r["recovery_ms"] > 0 and r["bare_calls_ms"] > 0
        assert r["recovery_ms"] == max(r["last_connected_ms"], r["commands_reached_ms"])
    ratios = [r["recovery_ratio_vs_bare"] for r in result["rounds"]]
    assert result["recovery_ratio_vs_bare"] == statistics.median(ratios)
    assert result["recovery_ms"] == statistics.median(r["recovery_ms"] for r in result["rounds"])
    json.dumps(result)
    table = format_table(owner_kill.table_rows(result))
    assert "recovery / bare" in table and "median of 3" in table


def test_every_round_kills_owners_never_killed_before() -> None:
    ids = [f"s{i:03d}" for i in range(100)]
    rounds = [owner_kill.victims_of(ids, 10, n) for n in range(10)]

    assert all(len(victims) == 10 for victims in rounds)
    assert len({s for victims in rounds for s in victims}) == 100
    assert owner_kill.sizes_error(100, 10, 10) is None
    assert owner_kill.sizes_error(100, 10, 11) is not None
    with pytest.raises(ValueError):
        asyncio.run(owner_kill.run_benchmark(agents=20, killed_n=10, repeat=3, quiet=True))


def _round(ratio: float, recovery_ms: float, recovered: int, reconnects: int) -> dict[str, Any]:
    return {
        "recovered": recovered,
        "reconnects": reconnects,
        "recovery_ms": recovery_ms,
        "bare_calls_ms": recovery_ms / ratio,
        "recovery_ratio_vs_bare": ratio,
        "gateway_cpu_s": 1.0,
        "bare_gateway_cpu_s": 0.5,
        "server_cpu_s": 0.5,
        "bare_server_cpu_s": 0.5,
        "extra_gateway_cpu_us_per_owner": 1000.0,
    }


def test_the_summary_is_the_median_of_the_rounds_ratios_and_holds_over_all_rounds() -> None:
    # A loaded round slows both of its halves: its ratio stays, where a ratio of medians
    # (1,300 / 1,000 = 1.3 here) would divide one round's recovery by another's bare calls.
    runs = [
        _round(1.2, 1200.0, 10, 0),
        _round(1.1, 3300.0, 10, 0),
        _round(1.3, 1300.0, 9, 2),
    ]
    summary = owner_kill.summarise(runs, agents=100, killed_n=10)

    assert summary["recovery_ratio_vs_bare"] == 1.2
    assert (summary["recovery_ratio_min"], summary["recovery_ratio_max"]) == (1.1, 1.3)
    assert summary["recovery_ms"] == 1300.0 and summary["bare_calls_ms"] == 1000.0
    # One owner not recovered and two reconnects in one round fail the whole run.
    assert (summary["recovered"], summary["recovered_total"]) == (9, 29)
    assert summary["reconnects"] == 2
    assert summary["targets_met"] == {
        "all_recovered": False,
        "no_reconnects": False,
        "within_1_3x_bare": True,
    }


def test_a_round_waits_for_room_in_agent_sups_restart_window() -> None:
    async def main() -> tuple[float, float]:
        runtime = LoopSystemBase(asyncio.get_running_loop())
        system = ActorSystem(systemBase=runtime, transientUnique=True)
        try:
            system.createActor(AgentSup, AgentSupArgs(intensity=5, period_s=0.3), AGENT_SUP_NAME)
            sup = owner_kill.agent_sup_of(runtime)
            with pytest.raises(ValueError):
                await owner_kill.room_for_restarts(runtime, 6)
            started = time.monotonic()
            await owner_kill.room_for_restarts(runtime, 5)
            at_once = time.monotonic() - started
            for _ in range(4):
                sup.intensity.add_restart(sup.now())
            started = time.monotonic()
            await owner_kill.room_for_restarts(runtime, 3)  # 4 + 3 > 5: the window must pass
            return at_once, time.monotonic() - started
        finally:
            runtime.shutdown()

    at_once, waited = asyncio.run(main())
    assert at_once < 0.1
    assert 0.2 <= waited < 2.0
