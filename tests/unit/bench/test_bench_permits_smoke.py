"""Keeps `python -m tests.bench.permits` from rotting: runs its core at a small size (the real
channel, the fake server in a subprocess) and checks the shape and the counts of the result.
Speed is not asserted here."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.bench import permits
from tests.bench.common import format_table

pytestmark = pytest.mark.timeout(60)

REQUIRED_KEYS = {"elapsed_s", "bound_s", "refused", "peak_in_flight", "targets_met", "runs"}


def test_core_runs_at_small_size_and_never_exceeds_the_permits() -> None:
    result = asyncio.run(
        permits.run_benchmark(calls=60, permits=6, latency_ms=10, repeat=2, quiet=True)
    )

    assert result.keys() >= REQUIRED_KEYS
    assert result["bound_s"] == pytest.approx(60 / 6 * 0.010)
    assert result["refused"] == 0 and result["failed"] == 0
    assert result["peak_in_flight"] == 6  # the permits fill, and never more
    assert result["peak_permits_held"] == 6
    assert len(result["runs"]) == 2
    assert result["elapsed_s"] >= result["bound_s"] * 0.9
    assert set(result["targets_met"]) == {"refused", "peak_in_flight", "elapsed_within_1_1x_bound"}
    json.dumps(result)
    assert result["grpcio_client_elapsed_s"] > 0  # the reference ran
    assert "Little's-law bound" in format_table(permits.table_rows(result))


def test_main_ends_stdout_with_one_json_object(tmp_path, capsys) -> None:
    out = tmp_path / "permits.json"
    code = permits.main(
        [
            "--calls",
            "24",
            "--permits",
            "4",
            "--latency-ms",
            "5",
            "--repeat",
            "1",
            "--quiet",
            "--no-reference",
            "--json",
            "--out",
            str(out),
        ]
    )

    assert code == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["refused"] == 0 and printed["peak_in_flight"] <= 4
    assert json.loads(out.read_text()) == printed
    assert printed["grpcio_client_elapsed_s"] is None  # --no-reference
