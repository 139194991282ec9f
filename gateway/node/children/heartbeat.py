"""The heartbeat buffer's child spec."""

from __future__ import annotations

from actors.heartbeat.api import NAME as HEARTBEAT_BUFFER
from actors.heartbeat.buffer import HeartbeatBufferActor
from gateway.config.context import NodeContext
from supervisors.supervisor import ChildSpec


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    # Stops after agent_sup and the listeners: its shutdown flush (at most 5 s) sends what they
    # buffered; 1 s more before the supervisor kills it.
    return (
        ChildSpec(HEARTBEAT_BUFFER, HeartbeatBufferActor, ctx, shutdown=6.0, name=HEARTBEAT_BUFFER),
    )
