"""The memory feature's registered names, and the shedder's verdict as the node reads it.

- `memory_shedder` (actors/memory/shedder.py) publishes whether the node sheds in its table of
  the same name; `shedding_now` reads it without a message, and the `memory_shedding` readiness
  check is its negation. A planned stop ends it first (gateway/node/planned_stop.py).
- `mem_reclaim` (actors/memory/reclaim.py) takes no message.

`SheddingPlan` is what the shedder needs of the plan the boot check resolved
(gateway/config/keys/shedder.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol

from supervisors.errors import TableGone

if TYPE_CHECKING:
    from actors.core.shedder_marks import Marks
    from supervisors.runtime import LoopSystemBase

__all__ = [
    "READINESS_CHECK",
    "RECLAIM_LOGGER",
    "RECLAIM_NAME",
    "SHEDDER_LOGGER",
    "SHEDDER_NAME",
    "SHEDDING_ROW",
    "MemoryLimit",
    "SheddingPlan",
    "shedding_now",
]

SHEDDER_NAME: Final = "memory_shedder"
RECLAIM_NAME: Final = "mem_reclaim"
# Where each writes its lines (the boot check too, for what it read of the memory limit).
SHEDDER_LOGGER: Final = "yuzu_gw.memory_shedder"
RECLAIM_LOGGER: Final = "yuzu_gw.mem_reclaim"
READINESS_CHECK: Final = "memory_shedding"
# The shedder's one row in its table: True while shedding.
SHEDDING_ROW: Final = "shedding"


def shedding_now(runtime: LoopSystemBase) -> bool:
    """The shedder's published verdict; False while no shedder runs."""
    table = runtime.table(SHEDDER_NAME)
    if table is None:
        return False
    try:
        return bool(table.get(SHEDDING_ROW, False))
    except TableGone:
        return False


class MemoryLimit(Protocol):
    """The memory limit the boot check read."""

    @property
    def limit_bytes(self) -> int: ...

    @property
    def source(self) -> str:
        """Where it was read (named in the shedder's start-up line)."""


class SheddingPlan(Protocol):
    """The limit read (None: none readable), the marks (None: a mark is a fraction of that
    unknown limit) and the nodes of the host that share the limit."""

    @property
    def limit(self) -> MemoryLimit | None: ...

    @property
    def marks(self) -> Marks | None: ...

    @property
    def nodes(self) -> int: ...
