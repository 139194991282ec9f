"""The memory shedder's and mem_reclaim's child specs."""

from __future__ import annotations

from actors.memory.reclaim import child_spec as mem_reclaim_child_spec
from actors.memory.shedder import child_spec as memory_shedder_child_spec
from gateway.config.context import NodeContext
from supervisors.supervisor import ChildSpec


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    return (memory_shedder_child_spec(ctx), mem_reclaim_child_spec(ctx))
