"""The node gauges' child spec."""

from __future__ import annotations

from actors.node.gauges import child_spec as node_gauges_child_spec
from gateway.config.context import NodeContext
from supervisors.supervisor import ChildSpec


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    # Memory, mailboxes and collection pauses (actors/node/metrics.py).
    return (node_gauges_child_spec(ctx),)
