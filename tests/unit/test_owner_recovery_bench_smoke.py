"""Keeps `python -m tests.bench.owner_kill` from rotting: runs it at a small size (a real node,
the fake server in a subprocess) and checks the shape and the counts of the result. Speed is not
asserted here."""

from __future__ import annotations

import asyncio
import json

import pytest

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


def test_a_small_owner_kill_recovers_every_killed_owner_without_a_reconnect() -> None:
    result = asyncio.run(owner_kill.run_benchmark(agents=100, killed_n=10, quiet=True))

    assert result.keys() >= REQUIRED_KEYS
    assert (result["agents"], result["killed"], result["bare_calls"]) == (100, 10, 30)
    assert result["recovered"] == 10
    assert result["reconnects"] == 0
    assert result["recovery_ms"] > 0 and result["bare_calls_ms"] > 0
    json.dumps(result)
    assert "recovery / bare" in format_table(owner_kill.table_rows(result))
