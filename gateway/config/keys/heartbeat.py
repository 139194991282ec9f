"""Keys of the heartbeat buffer."""

from __future__ import annotations

from typing import Any

from gateway.config.converters import IntRange
from gateway.config.env import env_integer
from gateway.config.schema import EnvOverride, Key

AREA = "heartbeat"

HEARTBEAT_BATCH_INTERVAL_MS: Key[int] = Key(
    name="heartbeat_batch_interval_ms",
    default=1000,
    convert=IntRange(100, 60000),
    read_when="heartbeat buffer start",
    doc="Interval between BatchHeartbeat flushes to the server.",
    area=AREA,
    env=EnvOverride("YUZU_GW_HEARTBEAT_INTERVAL_MS", env_integer, "an integer"),
    our_choices=("bad value",),
)

MAX_HEARTBEAT_BUFFER: Key[int] = Key(
    name="max_heartbeat_buffer",
    default=10000,
    convert=IntRange(1),
    read_when="heartbeat buffer start",
    doc="Most sessions the buffer holds between flushes.",
    area=AREA,
    our_choices=("valid values", "bad value"),
)

MAX_HEARTBEAT_BUFFER_BYTES: Key[int] = Key(
    name="max_heartbeat_buffer_bytes",
    default=64 * 1024 * 1024,
    # The manual calls 1 MiB "the minimum" (run F4) and advises at least a few MiB.
    convert=IntRange(1024 * 1024),
    read_when="heartbeat buffer start",
    doc="Most bytes of heartbeats the buffer holds between flushes (64 MiB).",
    area=AREA,
    our_choices=("bad value",),
)

KEYS: tuple[Key[Any], ...] = (
    HEARTBEAT_BATCH_INTERVAL_MS,
    MAX_HEARTBEAT_BUFFER,
    MAX_HEARTBEAT_BUFFER_BYTES,
)
