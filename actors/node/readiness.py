"""The readiness checks behind `/readyz`.

Each check is a named function that reads published state (a table, the runtime's name
registry) and never calls an actor, so `/readyz` answers at once even while an actor is
inside a slow operation (seed: "Readiness"). Areas register their checks when the tree
starts; the health endpoint evaluates them per request.
"""

from __future__ import annotations

from collections.abc import Callable

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
