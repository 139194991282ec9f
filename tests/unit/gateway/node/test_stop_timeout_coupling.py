"""Stop timeout coupling (seed: "Planned stop", "Stop timeout coupling"): the planned stop's
budget must fit inside the unit's and the container's stop timeout, with room for the
processes to stop after it; the shipped systemd unit and the compose example of the manual say
the same timeout (docs/planned-stop.md)."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.config.keys.node import SHUTDOWN_FLUSH_BUDGET_MS

ROOT = Path(__file__).resolve().parents[4]
# After the budget: the listeners close, the actors stop, /metrics answers last.
ROOM_TO_STOP_S = 10


def _seconds(pattern: str, text: str) -> int:
    found = re.findall(pattern, text, re.MULTILINE)
    assert len(found) == 1, found
    return int(found[0])


def test_the_unit_and_the_compose_example_leave_the_budget_room_to_stop() -> None:
    unit = _seconds(r"^TimeoutStopSec=(\d+)$", (ROOT / "rel" / "yuzu-gateway.service").read_text())
    compose = _seconds(
        r"^\s+stop_grace_period: (\d+)s\b", (ROOT / "docs" / "install.md").read_text()
    )
    assert unit == compose == 40
    assert SHUTDOWN_FLUSH_BUDGET_MS.default / 1000 + ROOM_TO_STOP_S <= unit
