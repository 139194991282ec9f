"""Keys of the command router."""

from __future__ import annotations

from typing import Any

from gateway.config.converters import IntRange
from gateway.config.schema import Key

AREA = "router"

DEFAULT_COMMAND_TIMEOUT_S: Key[int] = Key(
    name="default_command_timeout_s",
    default=300,
    convert=IntRange(1, 3600),
    read_when="by the router, for each command that has no timeout of its own",
    doc="Timeout of a SendCommand that carries none.",
    area=AREA,
)

KEYS: tuple[Key[Any], ...] = (DEFAULT_COMMAND_TIMEOUT_S,)
