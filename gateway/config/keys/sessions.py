"""Keys of the registry and the agent supervisor."""

from __future__ import annotations

from typing import Any

from gateway.config.converters import IntRange
from gateway.config.schema import Key, NameOrigin

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

_ADMISSION_READ = "agent service start (a change needs a restart)"

REGISTER_ADMISSION_PENDING_MAX: Key[int] = Key(
    name="register_admission_pending_max",
    default=512,
    convert=IntRange(1, 1_000_000),
    read_when=_ADMISSION_READ,
    doc="Registers one node works on at once, at most; beyond what it finishes within"
    " admission_drain_target_ms (at its measured rate) a Register is refused RESOURCE_EXHAUSTED"
    " with grpc-retry-pushback-ms (docs/agent-plane.md 'Admission under a storm').",
    area=AREA,
    origin=NameOrigin.OURS,
)

SUBSCRIBE_ADMISSION_PENDING_MAX: Key[int] = Key(
    name="subscribe_admission_pending_max",
    default=512,
    convert=IntRange(1, 1_000_000),
    read_when=_ADMISSION_READ,
    doc="Subscribes one node starts at once (until the owner runs), at most; the same rule as"
    " register_admission_pending_max.",
    area=AREA,
    origin=NameOrigin.OURS,
)

ADMISSION_DRAIN_TARGET_MS: Key[int] = Key(
    name="admission_drain_target_ms",
    default=2000,
    convert=IntRange(100, 60_000),
    read_when=_ADMISSION_READ,
    doc="Admit the Registers (and Subscribes) the node finishes within this at its measured"
    " drain rate (at least 64, at most the pending_max keys).",
    area=AREA,
    origin=NameOrigin.OURS,
)

ADMISSION_HINT_MAX_MS: Key[int] = Key(
    name="admission_hint_max_ms",
    default=60000,
    convert=IntRange(250, 600_000),
    read_when=_ADMISSION_READ,
    doc="The longest grpc-retry-pushback-ms an admission refusal gives; past it, hints are"
    " drawn over its last quarter.",
    area=AREA,
    origin=NameOrigin.OURS,
)

KEYS: tuple[Key[Any], ...] = (
    MAX_SESSIONS_PER_CONNECTION,
    AGENT_RESTART_INTENSITY,
    AGENT_RESTART_PERIOD_S,
    REGISTER_ADMISSION_PENDING_MAX,
    SUBSCRIBE_ADMISSION_PENDING_MAX,
    ADMISSION_DRAIN_TARGET_MS,
    ADMISSION_HINT_MAX_MS,
)
