"""Keeps `python -m tests.bench.runtime` from rotting: runs its core at a small N and
checks the shape and the counts of the result. Speed is not asserted here."""

from __future__ import annotations

import json

from tests.bench import runtime
from tests.bench.common import format_table

REQUIRED_KEYS = {
    "speedup_vs_simple_base",
    "bytes_per_idle_actor",
    "per_msg_ratio_100k_vs_10k",
    "targets_met",
    "loop_base",
    "simple_base",
    "memory",
}


def test_core_runs_at_small_n_and_counts_every_message() -> None:
    result = runtime.run_benchmark([200, 500], 200, repeat=2, quiet=True)

    assert result.keys() >= REQUIRED_KEYS
    for n in (200, 500):
        run = result["loop_base"][str(n)]
        assert run["complete"]
        assert (run["spawned"], run["replies"], run["messages"]) == (n, n, 2 * n)
        assert len(run["runs"]) == 2
    simple = result["simple_base"]
    assert simple["complete"]
    assert (simple["spawned"], simple["replies"], simple["messages"]) == (200, 200, 400)
    assert result["memory"]["spawned"] == 500
    assert result["speedup_vs_simple_base"] > 0
    assert result["bytes_per_idle_actor"] > 0
    assert result["per_msg_ratio_100k_vs_10k"] > 0
    assert set(result["targets_met"]) == {
        "speedup_vs_simple_base",
        "bytes_per_idle_actor",
        "per_msg_ratio",
    }
    assert all(isinstance(met, bool) for met in result["targets_met"].values())
    json.dumps(result)  # all of it serialises
    assert "bytes per idle actor" in format_table(runtime.table_rows(result))


def test_simple_base_budget_stops_early_and_reports_a_lower_bound() -> None:
    run = runtime._simple_run(5000, budget_s=1e-9)

    assert not run.complete
    assert run.spawned < 5000


def test_main_ends_stdout_with_one_json_object(tmp_path, capsys) -> None:
    out = tmp_path / "runtime.json"
    code = runtime.main(
        [
            "--n",
            "100,300",
            "--simple-n",
            "100",
            "--repeat",
            "1",
            "--quiet",
            "--json",
            "--out",
            str(out),
        ]
    )

    assert code == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    printed = json.loads(last)
    assert printed["per_msg_ratio_ns"] == [100, 300]
    assert json.loads(out.read_text()) == printed
