"""Keys of the registry and the agent supervisor."""

from __future__ import annotations

from typing import Any

from gateway.config.converters import IntRange
from gateway.config.schema import Key

AREA = "sessions"

MAX_SESSIONS_PER_CONNECTION: Key[int] = Key(
    name="max_sessions_per_connection",
    default=8,
    convert=IntRange(1, 1024),
    read_when="once, at registry start (a change needs a restart)",
    doc="Sessions and in-flight reservations one connection may hold.",
    area=AREA,
    our_choices=("valid values", "bad value"),
)

AGENT_RESTART_INTENSITY: Key[int] = Key(
    name="agent_restart_intensity",
    default=2000,
    convert=IntRange(1),
    read_when="agent supervisor start",
    doc="Owner restarts allowed within agent_restart_period_s before the agent supervisor"
    " gives up; about 40 % of the agents keeps the margin for fleets far above 5000.",
    area=AREA,
    our_choices=("valid values", "bad value"),
)

AGENT_RESTART_PERIOD_S: Key[int] = Key(
    name="agent_restart_period_s",
    default=10,
    convert=IntRange(1, 3600),
    read_when="agent supervisor start",
    doc="Window of agent_restart_intensity.",
    area=AREA,
    our_choices=("valid values", "bad value"),
)

KEYS: tuple[Key[Any], ...] = (
    MAX_SESSIONS_PER_CONNECTION,
    AGENT_RESTART_INTENSITY,
    AGENT_RESTART_PERIOD_S,
)
