"""Smoke test of `tests.bench.heartbeats`: the whole run (fake server, gateway node, bare server,
load generators, all subprocesses but the fake server) at 6 agents for a second. Checks the
result's shape, that every agent joined and heartbeated with none refused, and that the fake
server received the flushes, never the speed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench import heartbeats
from tests.bench.common import REPO_ROOT

pytestmark = pytest.mark.timeout(90)

KEYS = {
    "heartbeats_per_s",
    "bare_per_s",
    "ratio_vs_bare",
    "upstream_bytes_per_heartbeat",
    "cpu_us_per_heartbeat",
    "bare_cpu_us_per_heartbeat",
    "targets_met",
}


def test_six_agents_heartbeat_through_the_gateway_and_the_bare_server() -> None:
    load = heartbeats.Workload(
        agents=6, loadgens=2, warmup_s=0.5, window_s=1.5, flush_interval_ms=200
    )
    result = asyncio.run(heartbeats.run(load, quiet=True))
    assert result.keys() >= KEYS
    assert result["joined"] == 6
    assert result["heartbeats_acknowledged"] > 6
    assert result["heartbeats_failed"] == 0
    assert result["bare_heartbeats_acknowledged"] > 6
    assert result["bare_heartbeats_failed"] == 0
    assert result["heartbeats_per_s"] > 0 and result["bare_per_s"] > 0
    assert result["ratio_vs_bare"] == pytest.approx(
        result["heartbeats_per_s"] / result["bare_per_s"]
    )
    # The buffer keeps one entry per session a flush: the flushes carried heartbeats, and fewer
    # bytes than the heartbeats admitted would have been one by one.
    assert result["batch_heartbeat_calls"] > 0
    assert 0 < result["batch_heartbeat_entries"] <= result["heartbeats_acknowledged"]
    assert 0 < result["upstream_bytes_per_heartbeat"] < result["heartbeat_bytes"]
    assert result["heartbeats_rejected_total"] == 0
    assert result["buffer_dropped_total"] == 0
    assert result["targets_met"]["all_joined"] is True
    json.dumps(result)
    assert heartbeats.rows(result)


def test_json_is_the_last_line_of_stdout(tmp_path: Path) -> None:
    out = tmp_path / "heartbeats.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.bench.heartbeats",
            "--agents",
            "2",
            "--loadgens",
            "1",
            "--warmup-s",
            "0",
            "--window-s",
            "0.5",
            "--quiet",
            "--json",
            "--out",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=80,
        check=True,
    )
    last = json.loads(completed.stdout.strip().splitlines()[-1])
    assert last == json.loads(out.read_text())
    assert last.keys() >= KEYS
    assert last["heartbeats_failed"] == 0
