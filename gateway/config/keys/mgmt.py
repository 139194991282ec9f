"""Keys of management peer authorization. The mode, identity, pins and deny-list come with
the management-auth issue."""

from __future__ import annotations

from typing import Any

from gateway.config.converters import IntRange
from gateway.config.schema import Key

AREA = "mgmt"

MGMT_PIN_REFRESH_MS: Key[int] = Key(
    name="mgmt_pin_refresh_ms",
    default=5000,
    convert=IntRange(100, 3_600_000),
    read_when="once, when the pin watcher starts",
    doc="How often the pin watcher re-reads cert_file pins.",
    area=AREA,
    our_choices=("valid values", "bad value"),
)

KEYS: tuple[Key[Any], ...] = (MGMT_PIN_REFRESH_MS,)
