"""Keeps `python -m tests.bench.scrape` from rotting: runs its core at a small size and checks
the shape of the result. Speed is not asserted here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench import scrape
from tests.bench.common import format_table

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")


def test_core_runs_at_small_size() -> None:
    result = scrape.run_benchmark(fds=200, scrapes=3)
    assert result["fds"] == 200 and result["scrapes"] == 3
    assert set(result["median_ms"]) == {"library", "gateway", "node_registry"}
    assert result["same_families"] and result["same_open_fds"]
    assert result["open_fds"]["gateway"] >= 200
    assert "gateway / library" in format_table(scrape.rows(result))
