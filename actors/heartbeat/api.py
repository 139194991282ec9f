"""The `heartbeat_buffer` actor's registered name and the messages it takes from request
processes."""

from __future__ import annotations

import attrs

from actors.core.heartbeat_sanitise import RawHeartbeat
from protos.yuzu.agent.v1 import agent_pb2

NAME = "heartbeat_buffer"


@attrs.frozen
class BufferHeartbeat:
    """An admitted heartbeat, handed over after the agent was answered (tell). A `RawHeartbeat`
    is one whose text was not valid UTF-8, read leniently; the buffer repairs and counts it."""

    heartbeat: agent_pb2.HeartbeatRequest | RawHeartbeat = attrs.field(repr=False)
