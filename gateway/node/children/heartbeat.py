"""The heartbeat buffer's child spec and the `Args` it starts with, read from the Config once."""

from __future__ import annotations

from actors.core.heartbeat_buffer import policy_from_settings
from actors.heartbeat.api import NAME as HEARTBEAT_BUFFER
from actors.heartbeat.buffer import HeartbeatBufferActor, HeartbeatBufferArgs
from actors.upstream.replay_metrics import replay_metrics
from gateway.config.context import NodeContext
from gateway.config.keys.heartbeat import (
    HEARTBEAT_BATCH_INTERVAL_MS,
    MAX_HEARTBEAT_BUFFER,
    MAX_HEARTBEAT_BUFFER_BYTES,
)
from gateway.node.children.upstream import rpc_timeout_s
from supervisors.supervisor import ChildSpec

__all__ = ["child_specs", "heartbeat_buffer_args"]


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    # Stops after agent_sup and the listeners: its shutdown flush (at most 5 s) sends what they
    # buffered; 1 s more before the supervisor kills it.
    buffer = ChildSpec(
        HEARTBEAT_BUFFER,
        HeartbeatBufferActor,
        heartbeat_buffer_args(ctx),
        shutdown=6.0,
        name=HEARTBEAT_BUFFER,
    )
    return (buffer,)


def heartbeat_buffer_args(ctx: NodeContext) -> HeartbeatBufferArgs:
    config = ctx.config
    policy = policy_from_settings(
        heartbeat_batch_interval_ms=config[HEARTBEAT_BATCH_INTERVAL_MS],
        max_heartbeat_buffer=config[MAX_HEARTBEAT_BUFFER],
        max_heartbeat_buffer_bytes=config[MAX_HEARTBEAT_BUFFER_BYTES],
    )
    return HeartbeatBufferArgs(
        policy=policy,
        gateway_node=ctx.node.name,
        rpc_timeout_s=rpc_timeout_s(config),
        registry=ctx.registry,
        # The verdict families are the replay's (actors/upstream/replay_metrics.py says why).
        verdict_counts=replay_metrics(ctx.registry),
    )
