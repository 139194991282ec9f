"""The owner table: one row per agent session, written by the session's owner.

A public table owned by the root supervisor (`gateway_sup`), not by any owner, so a row
survives its owner's crash (seed: "When an agent's owner process crashes": the session's
details survive the crash in the owner table, written when the session is set up and removed
when the owner ends for good). Any actor of the node may write it; by convention each owner
writes only its own session's row, and a restarted owner deletes its dead predecessor's.

Rows honour `actors.registry.api.OwnerRecord` (owner, conn_key, state): heartbeat admission
reads
them to keep a session admitted while its owner is dead or recovering (ADM-08). The registration
replay reads a row's stored RegisterRequest (`register`) and its stream home id.

A row exists exactly while its owner has announced CONNECTED and owes the DISCONNECTED
(actors/core/owner_lifecycle.py), so the row is also the record of that debt.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Literal

import attrs

from actors.registry.api import OWNERS_TABLE
from supervisors.address import Address
from supervisors.errors import TableGone

if TYPE_CHECKING:
    from actors.agents.api import OwnerArgs
    from protos.yuzu.agent.v1 import agent_pb2
    from supervisors.process import Process
    from supervisors.runtime import LoopSystemBase
    from supervisors.table import Table

__all__ = ["OWNERS_TABLE", "OwnerRow", "OwnerState", "create_owner_table", "owner_row"]

# `live`: the owner holds the session. `recovering`, `ending`, `superseded`: written by the
# owner-crash recovery of issue 7 (see OwnerRecord in actors/registry/api.py).
OwnerState = Literal["live", "recovering", "ending", "superseded"]


@attrs.frozen
class OwnerRow:
    owner: Address
    session_id: str
    agent_id: str
    conn_key: Hashable | None
    stream_home_id: str
    state: OwnerState = "live"
    # The agent's stored RegisterRequest, which the registration replay presents to the server
    # again (actors/upstream/replay.py). Never compared or printed: it holds the enrolment token.
    register: agent_pb2.RegisterRequest | None = attrs.field(default=None, eq=False, repr=False)
    # Owner-crash recovery (actors/core/owner_recovery.py): the owner's start arguments, so a
    # new agent_sup can restart an owner for an orphaned session, and the loop-clock times of
    # the session's owner restarts within the last 60 s.
    args: OwnerArgs | None = attrs.field(default=None, eq=False, repr=False)
    restarts: tuple[float, ...] = attrs.field(default=(), eq=False)


def create_owner_table(process: Process) -> Table[str, OwnerRow]:
    """Create the public owner table, owned by `process` (the root supervisor)."""
    return process.new_table(OWNERS_TABLE, "public")


def owner_row(runtime: LoopSystemBase, session_id: str) -> OwnerRow | None:
    """The session's row, or None (no row, or no table)."""
    table = runtime.table(OWNERS_TABLE)
    if table is None:
        return None
    try:
        row = table.get(session_id)
    except TableGone:
        return None
    return row if isinstance(row, OwnerRow) else None
