"""Keeps `python -m tests.bench.replay` from rotting: runs it at a small size (a real node, the
fake server in a subprocess) and checks the shape and the counts of the result. Speed is not
asserted here."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.bench import replay
from tests.bench.common import format_table

pytestmark = pytest.mark.timeout(120)

REQUIRED_KEYS = {"elapsed_s", "bound_s", "replayed", "peak_in_flight", "targets_met"}


def test_a_small_full_replay_replays_every_session_within_the_permits() -> None:
    result = asyncio.run(replay.run_benchmark(sessions=60, latency_ms=10, quiet=True))

    assert result.keys() >= REQUIRED_KEYS
    assert result["bound_s"] == pytest.approx(60 / 24 * 0.010)
    assert result["replayed"] == result["replay_total"] == result["proxy_register_calls"] == 60
    assert result["failed"] == 0
    assert result["peak_in_flight"] <= 24
    assert result["connected_resent"] == 60  # each adopted session announced again
    assert result["elapsed_s"] >= result["bound_s"] * 0.9
    assert set(result["targets_met"]) == {
        "replayed_all",
        "peak_in_flight",
        "elapsed_within_1_05x_bound",
    }
    json.dumps(result)
    assert "first replay call to last answer" in format_table(replay.table_rows(result))


def test_main_ends_stdout_with_one_json_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "replay.json"
    code = replay.main(
        ["--sessions", "30", "--latency-ms", "5", "--quiet", "--json", "--out", str(out)]
    )

    assert code == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["replayed"] == 30
    assert json.loads(out.read_text()) == printed
