"""Keys of the gRPC listeners. The grpc_listeners list itself comes with the listener issue."""

from __future__ import annotations

from typing import Any

from gateway.config.converters import LiteralTrue
from gateway.config.schema import Key

AREA = "listeners"

ALLOW_NO_LISTENERS: Key[bool] = Key(
    name="allow_no_listeners",
    default=False,
    convert=LiteralTrue(),
    read_when="boot",
    doc="Lab-rig acknowledgement: boot with no listener routing the AgentService. Never in a"
    " deployment.",
    area=AREA,
    default_doc="unset",
    bad_doc="any value but `true` counts as unset",
)

KEYS: tuple[Key[Any], ...] = (ALLOW_NO_LISTENERS,)
