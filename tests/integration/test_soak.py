"""The standing fault soak at its CI size (tests/soak; docs/dev/benchmarks.md, "`tests.soak`:
the standing fault soak"): 500 agents, 2 minutes of faults from a fixed seed, the quiet tail, a
planned stop, and every invariant count 0. The soak's `Stack` ends every process it started
(the node, the agent processes, the fake server) and its ports with them, whatever happens."""

from __future__ import annotations

import asyncio

import pytest

from tests.soak.run import run_soak

pytestmark = [pytest.mark.integration, pytest.mark.timeout(540)]

AGENTS = 500
MINUTES = 2.0
SEED = 21


def test_the_soak_holds_every_invariant() -> None:
    result = asyncio.run(asyncio.wait_for(run_soak(AGENTS, MINUTES, SEED, quiet=True), 500))
    failing = {name: count for name, count in result["invariants"].items() if count}
    assert failing == {}, f"seed {SEED}: {failing}"
    # The run is long enough for a second cycle, so the RSS invariant compared something.
    assert result["rss_compared"]
