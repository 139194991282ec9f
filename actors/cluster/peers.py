"""The links that are up, read without a message: the public table `cluster_links` (peer
address -> `PeerLink`), which the `cluster` actor owns and is the only writer of. Empty or
absent (no peers, no cluster actor) means this node serves alone, and every caller then takes
the single-node path at the cost of one table lookup."""

from __future__ import annotations

from typing import TYPE_CHECKING

from supervisors.address import Address
from supervisors.errors import TableGone

if TYPE_CHECKING:
    from gateway.cluster.transport import PeerLink
    from supervisors.runtime import LoopSystemBase

__all__ = ["CLUSTER_NAME", "LINKS_TABLE", "cluster_route", "connected_links"]

CLUSTER_NAME = "cluster"
LINKS_TABLE = "cluster_links"


def connected_links(runtime: LoopSystemBase) -> list[PeerLink]:
    table = runtime.table(LINKS_TABLE)
    if table is None:
        return []
    try:
        return list(table.values()) if len(table) else []
    except TableGone:
        return []


def cluster_route(runtime: LoopSystemBase) -> Address | None:
    """The `cluster` actor when at least one peer is connected, else None."""
    table = runtime.table(LINKS_TABLE)
    try:
        if table is None or not len(table):
            return None
    except TableGone:
        return None
    return runtime.whereis(CLUSTER_NAME)
