"""`node_gauges`, the registered name of the node gauges' sampler (actors/node/gauges.py).

The planned stop's messages to the actors it drains (seed: "Planned stop"; the coordinator is
gateway/node/planned_stop.py, docs/planned-stop.md).

The readiness checks behind `/readyz`.

Each check is a named function that reads published state (a table, the runtime's name
registry) and never calls an actor, so `/readyz` answers at once even while an actor is
inside a slow operation (seed: "Readiness"). Areas register their checks when the tree
starts; the health endpoint evaluates them per request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import attrs

GAUGES_NAME: Final = "node_gauges"


@attrs.frozen
class StopAdmitting:
    """Tell (step 1): the regulator refuses every permit from now on (`stopping`: proxied
    Register and inventory answer UNAVAILABLE, no replay runs); the upstream actor starts no
    registration replay and presents no recovered session."""


@attrs.frozen
class StopRouting:
    """Ask the router (step 2): take no more commands; answered `RoutingStopped` once no
    command is in flight, or after `grace_s`."""

    grace_s: float


@attrs.frozen
class RoutingStopped:
    """`in_flight`: commands still in flight when the grace ended (0 when they all ended)."""

    in_flight: int


Check = Callable[[], bool]


class Readiness:
    def __init__(self) -> None:
        self._checks: dict[str, Check] = {}

    def register(self, name: str, check: Check) -> None:
        if name in self._checks:
            raise ValueError(f"readiness check {name} registered twice")
        self._checks[name] = check

    def names(self) -> list[str]:
        return list(self._checks)

    def evaluate(self) -> dict[str, bool]:
        """Every check's verdict; a check that raises counts as failing."""
        results: dict[str, bool] = {}
        for name, check in self._checks.items():
            try:
                results[name] = bool(check())
            except Exception:
                results[name] = False
        return results
