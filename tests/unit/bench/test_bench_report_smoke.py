"""Smoke test of `tests.bench.report`: the report run end to end with `--quick --only` on two
cheap benchmarks (each a subprocess), and a benchmark that fails to run becoming a row that
says so. Checks the files and the table's shape, never the figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench import report
from tests.bench.common import REPO_ROOT

pytestmark = pytest.mark.timeout(150)


def test_quick_run_of_two_benchmarks_writes_one_table(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.bench.report",
            "--quick",
            "--only",
            "scrape,permits",
            "--out-dir",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "report.json").read_text())
    markdown = (tmp_path / "report.md").read_text()
    assert result["failed"] == []
    assert set(result["runs"]) == {"scrape", "permits"}
    figures = {(row["benchmark"], row["figure"]) for row in result["rows"]}
    expected = {(b, f.label) for b in ("scrape", "permits") for f in report.BY_NAME[b].figures}
    assert figures == expected
    permits = [row for row in result["rows"] if row["benchmark"] == "permits"]
    # Each figure sits beside the seed's figure for the workload and says if its target is met.
    assert any(row["specification"].startswith("F01") for row in permits)
    assert all(isinstance(row["met"], bool) for row in permits)
    assert result["targets_met"].keys() >= {"permits.refused", "permits.peak_in_flight"}
    # The Markdown is printed and written: a header, its rule and one line per row.
    assert markdown in done.stdout
    assert markdown.count("\n| ") == len(result["rows"]) + 2


def test_a_benchmark_that_fails_is_a_row_not_a_crash() -> None:
    failed = report.Outcome("fanout", 1.0, error="exited 1: boom")
    ok = report.Outcome("scale", 1.0, result={"cross_node_rtt_ratio": 1.2, "targets_met": {}})
    result, markdown = report.build([failed, ok], quick=True)
    assert result["failed"] == ["fanout"]
    [fanout] = [row for row in result["rows"] if row["benchmark"] == "fanout"]
    assert fanout["figure"] == "did not run" and "exited 1: boom" in fanout["measured"]
    # A figure missing from a result reads n/a; a target with no verdict is left blank.
    scale_rows = {row["key"]: row for row in result["rows"] if row["benchmark"] == "scale"}
    assert scale_rows["cross_node_rtt_ratio"]["measured"] == "1.20"
    assert scale_rows["cpu_per_answer_ratio_2_vs_1"]["measured"] == "n/a"
    assert scale_rows["cross_node_rtt_ratio"]["met"] is None
    assert "failed: exited 1: boom" in markdown


def test_a_benchmark_that_cannot_start_is_reported(tmp_path: Path) -> None:
    bench = report.Bench("scale", "w", (), quick=("--agents", "-1"))
    outcome = report.run_one(bench, tmp_path, quick=True, timeout_s=60)
    assert outcome.result is None
    assert outcome.error is not None and outcome.error.startswith("exited 2")
