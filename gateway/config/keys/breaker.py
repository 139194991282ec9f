"""Keys of the upstream circuit breaker ("Configuration > Circuit breaker tuning").

They mirror `actors/core/breaker.py`: the manual names only the maximum reset timeout and says
all three have environment overrides without naming them (SPEC_INDEX X5), so the other names
and all three variables are this gateway's. The ranges are the manual's."""

from __future__ import annotations

from typing import Any

from gateway.config.converters import IntRange
from gateway.config.env import env_integer
from gateway.config.schema import EnvOverride, Key, NameOrigin

AREA = "breaker"
_START = "once, at upstream client start"
_RESET_MS = IntRange(100, 3_600_000)

CIRCUIT_BREAKER_FAILURE_THRESHOLD: Key[int] = Key(
    name="circuit_breaker_failure_threshold",
    default=5,
    convert=IntRange(1, 1000),
    read_when=_START,
    doc="Consecutive failures that open the breaker.",
    area=AREA,
    origin=NameOrigin.OURS,
    env=EnvOverride(
        "YUZU_GW_CIRCUIT_BREAKER_FAILURE_THRESHOLD", env_integer, "an integer", NameOrigin.OURS
    ),
)

CIRCUIT_BREAKER_RESET_TIMEOUT_MS: Key[int] = Key(
    name="circuit_breaker_reset_timeout_ms",
    default=10000,
    convert=_RESET_MS,
    read_when=_START,
    doc="First open period; it doubles on each failed probe up to the maximum.",
    area=AREA,
    origin=NameOrigin.OURS,
    env=EnvOverride(
        "YUZU_GW_CIRCUIT_BREAKER_RESET_TIMEOUT_MS", env_integer, "an integer", NameOrigin.OURS
    ),
)

CIRCUIT_BREAKER_MAX_RESET_TIMEOUT_MS: Key[int] = Key(
    name="circuit_breaker_max_reset_timeout_ms",
    default=30000,
    convert=_RESET_MS,
    read_when=_START,
    doc="Cap of the doubling reset timeout; the effective value is never below the base.",
    area=AREA,
    env=EnvOverride(
        "YUZU_GW_CIRCUIT_BREAKER_MAX_RESET_TIMEOUT_MS", env_integer, "an integer", NameOrigin.OURS
    ),
)

KEYS: tuple[Key[Any], ...] = (
    CIRCUIT_BREAKER_FAILURE_THRESHOLD,
    CIRCUIT_BREAKER_RESET_TIMEOUT_MS,
    CIRCUIT_BREAKER_MAX_RESET_TIMEOUT_MS,
)
