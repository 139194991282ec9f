"""The planned stop's messages to the actors it drains (seed: "Planned stop"; the coordinator is
gateway/node/planned_stop.py, docs/planned-stop.md)."""

from __future__ import annotations

import attrs

__all__ = ["RoutingStopped", "StopAdmitting", "StopRouting"]


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
