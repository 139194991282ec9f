"""The `heartbeat_buffer` actor's registered name and the messages it takes from request
processes."""

from __future__ import annotations

import attrs

from protos.yuzu.agent.v1 import agent_pb2

NAME = "heartbeat_buffer"


@attrs.frozen
class BufferHeartbeat:
    """An admitted heartbeat, handed over after the agent was answered (tell)."""

    heartbeat: agent_pb2.HeartbeatRequest = attrs.field(repr=False)
