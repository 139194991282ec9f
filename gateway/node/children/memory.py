"""The memory shedder's and mem_reclaim's child specs, and their Args from the Config: the
`memory_shedding` settings with the plan the boot check resolved (gateway/config/keys/shedder.py)
and the `mem_reclaim` settings; the memory readers are gateway/node/memory_reader.py's."""

from __future__ import annotations

from actors.memory.api import RECLAIM_NAME, SHEDDER_NAME
from actors.memory.reclaim import MemReclaimActor, ReclaimArgs
from actors.memory.shedder import MemoryShedder, ShedderArgs
from gateway.config.context import NodeContext
from gateway.config.keys.listeners import GRPC_LISTENERS
from gateway.config.keys.shedder import MEM_RECLAIM, MEMORY_SHEDDING, plan_of
from gateway.config.listener_spec import ListenerSpec
from gateway.node import memory_reader
from supervisors.supervisor import ChildSpec


def agent_listeners(specs: tuple[ListenerSpec, ...]) -> tuple[str, ...]:
    """The listeners the shedder moves: agent listeners not serving the management service."""
    return tuple(spec.name for spec in specs if spec.serves_agent and not spec.serves_mgmt)


def shedder_args(ctx: NodeContext) -> ShedderArgs:
    """The shedder's Args. `memory_reader.READER` is taken now, when the tree starts."""
    settings = ctx.config[MEMORY_SHEDDING]
    listeners = agent_listeners(ctx.config[GRPC_LISTENERS])
    # Only a shedder that will run needs the plan: a config built without the boot check has
    # none, and resolving it reads the memory limit.
    return ShedderArgs(
        enabled=settings.enabled,
        interval_ms=settings.interval_ms,
        listeners=listeners,
        plan=plan_of(settings) if settings.enabled and listeners else None,
        read_memory=memory_reader.READER,
        registry=ctx.registry,
        readiness=ctx.readiness,
    )


def reclaim_args(ctx: NodeContext) -> ReclaimArgs:
    settings = ctx.config[MEM_RECLAIM]
    return ReclaimArgs(
        interval_ms=settings.interval_ms,
        followup_ms=settings.followup_ms,
        trim_interval_ms=settings.trim_interval_ms,
        rss_anon_kb=memory_reader.rss_anon_kb,
    )


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    return (
        ChildSpec(SHEDDER_NAME, MemoryShedder, shedder_args(ctx), name=SHEDDER_NAME),
        ChildSpec(RECLAIM_NAME, MemReclaimActor, reclaim_args(ctx), name=RECLAIM_NAME),
    )
