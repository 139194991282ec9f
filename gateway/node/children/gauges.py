"""The node gauges' child spec."""

from __future__ import annotations

from actors.heartbeat.api import NAME as HEARTBEAT_BUFFER
from actors.node.api import GAUGES_NAME
from actors.node.gauges import GaugesArgs, NodeGauges
from gateway.config.context import NodeContext
from gateway.config.keys.node import TELEMETRY_GAUGE_INTERVAL_MS
from gateway.node.memory_reader import process_memory
from supervisors.supervisor import ChildSpec


def gauges_args(ctx: NodeContext) -> GaugesArgs:
    return GaugesArgs(
        interval_ms=ctx.config[TELEMETRY_GAUGE_INTERVAL_MS],
        registry=ctx.registry,
        read_memory=process_memory,
        heartbeat_buffer=HEARTBEAT_BUFFER,
    )


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    # Memory, mailboxes and collection pauses (actors/node/metrics.py).
    return (ChildSpec(GAUGES_NAME, NodeGauges, gauges_args(ctx), name=GAUGES_NAME),)
