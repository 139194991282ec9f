"""What any code on the node may read about agent sessions, without a message.

The registry (actors/registry/actor.py) owns five protected tables and is their only writer; this
module names them, defines their rows, and gives request processes the reads they need:

| table | key | row |
| --- | --- | --- |
| `agents` | session id | `AgentRow`: a live session and its owner |
| `agents_by_id` | agent id | the session id of the agent's newest live session |
| `pending_registrations` | session id | `PendingRow` (actors/core/pending.py) |
| `connections` | connection key | `ConnUsage`: the slots one connection holds, by kind |
| `sessions_index` | session id | `Binding`: the connection a session is bound to |

Reads go to the runtime's table by name on every call, never to a saved table object: a
restarted registry makes new, empty tables (seed: "the registry recreates its tables empty").

Heartbeat admission (`admit`) reads node-local state only and never asks an actor, so it costs
two dictionary lookups per heartbeat. The router and the management plane find an agent by its
id the same way (`agent_session`: two lookups), and walk every agent held (`held_agent_ids`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs

from actors.core.pending import PendingRow
from supervisors.address import Address
from supervisors.errors import TableGone

if TYPE_CHECKING:
    from actors.node.readiness import Readiness
    from supervisors.runtime import LoopSystemBase

__all__ = [
    "ADMISSION_REASONS",
    "AGENTS_BY_ID",
    "AGENTS_TABLE",
    "CONNECTIONS_TABLE",
    "OWNERS_TABLE",
    "PENDING_TABLE",
    "REGISTRY_NAME",
    "SESSIONS_INDEX",
    "UNKNOWN_SESSION_DETAILS",
    "AdmissionReason",
    "AgentRow",
    "Binding",
    "ConnUsage",
    "OwnerRecord",
    "admit",
    "agent_session",
    "binding_of",
    "held_agent_ids",
    "install_readiness",
    "pending_of",
    "readiness_checks",
    "registry_address",
    "session_of",
]

ConnKey = Hashable

REGISTRY_NAME = "registry"
AGENTS_TABLE = "agents"
AGENTS_BY_ID = "agents_by_id"
PENDING_TABLE = "pending_registrations"
CONNECTIONS_TABLE = "connections"
SESSIONS_INDEX = "sessions_index"
# The owner table: public, owned by the root supervisor, one row per session written by its
# owner. Read here only for the owner-recovery rule of admission.
OWNERS_TABLE = "owners"

# The one answer to every refused heartbeat or inventory report (NOT_FOUND), whatever the reason:
# the reason goes to the counters only, so a caller cannot learn which condition failed.
UNKNOWN_SESSION_DETAILS = "unknown session"

AdmissionReason = Literal[
    "unknown_session", "connection_mismatch", "no_connection", "registry_unavailable"
]
# Every reason, for pre-seeding the counter series at 0 (heartbeat: connection_mismatch is
# counted in the session_mismatch family instead; inventory: all four).
ADMISSION_REASONS: tuple[AdmissionReason, ...] = (
    "unknown_session",
    "connection_mismatch",
    "no_connection",
    "registry_unavailable",
)


# --- rows ---------------------------------------------------------------------------------------


@attrs.frozen
class AgentRow:
    session_id: str
    agent_id: str
    owner: Address
    conn_key: ConnKey
    peer: str
    plugins: tuple[str, ...]
    connected_at: float  # wall clock, seconds
    stream_home_id: str
    # The AgentInfo of the agent's Register (hostname, platform, version, plugins), for the
    # management plane's ListAgents and GetAgent; None when the owner had none to give.
    info: Any = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class Binding:
    """The connection a session's heartbeats must arrive on: the Subscribe's once subscribed
    (`subscribing` while its owner starts, then `live`), the Register's before (`pending`)."""

    conn_key: ConnKey
    state: Literal["pending", "subscribing", "live"]


@attrs.frozen
class ConnUsage:
    """Slots one connection holds, by kind; their sum is what the cap counts."""

    reservations: int = 0
    pending: int = 0
    subscribing: int = 0
    live: int = 0
    down: bool = False

    @property
    def used(self) -> int:
        return self.reservations + self.pending + self.subscribing + self.live


class OwnerRecord(Protocol):
    """What admission reads from an owner-table row (the owner issue writes the rows).

    `state`: `live` (the owner holds the session), `recovering` (a restarted owner re-adopting
    it), `ending` (being ended) or `superseded` (a newer session of the agent replaced it)."""

    @property
    def owner(self) -> Address: ...

    @property
    def conn_key(self) -> ConnKey | None: ...

    @property
    def state(self) -> str: ...


# --- reads --------------------------------------------------------------------------------------


def registry_address(runtime: LoopSystemBase) -> Address | None:
    return runtime.whereis(REGISTRY_NAME)


def _read(runtime: LoopSystemBase, table: str, key: object) -> object | None:
    found = runtime.table(table)
    if found is None:
        return None
    try:
        return found.get(key)
    except TableGone:
        return None


def session_of(runtime: LoopSystemBase, session_id: str) -> AgentRow | None:
    """The live session, or None (unknown, or no registry)."""
    row = _read(runtime, AGENTS_TABLE, session_id)
    return row if isinstance(row, AgentRow) else None


def agent_session(runtime: LoopSystemBase, agent_id: str) -> AgentRow | None:
    """The agent's newest live session on this node, or None (not held, or no registry)."""
    session_id = _read(runtime, AGENTS_BY_ID, agent_id)
    return session_of(runtime, session_id) if isinstance(session_id, str) else None


def held_agent_ids(runtime: LoopSystemBase) -> list[str] | None:
    """Every agent id this node holds a live session of (no order); None when the registry is
    not running (its tables are gone with it)."""
    table = runtime.table(AGENTS_BY_ID)
    if table is None:
        return None
    try:
        return list(table.keys())
    except TableGone:
        return None


def pending_of(runtime: LoopSystemBase, session_id: str) -> PendingRow | None:
    row = _read(runtime, PENDING_TABLE, session_id)
    return row if isinstance(row, PendingRow) else None


def binding_of(runtime: LoopSystemBase, session_id: str) -> Binding | None:
    row = _read(runtime, SESSIONS_INDEX, session_id)
    return row if isinstance(row, Binding) else None


# --- heartbeat and inventory admission ------------------------------------------------------------


def admit(
    runtime: LoopSystemBase, session_id: str, conn_key: ConnKey | None
) -> AdmissionReason | None:
    """None when a heartbeat (or inventory report) for `session_id` arriving on `conn_key` is
    admitted, else why not. Admitted only when this node holds the session and the call arrives
    on the connection bound to it (seed: "Heartbeat admission"; SPEC_INDEX ADM-01..09).

    In order: no session index (the registry is down) -> `registry_unavailable`; a call with no
    connection key -> `no_connection`; a session the index does not hold -> `unknown_session`,
    unless its owner is dead or a restarted owner is recovering it on this same connection
    (ADM-08: the registry drops a dead owner's session at once, and a rejection would make the
    agent drop the stream being recovered); a session bound to another connection ->
    `connection_mismatch`.

    A live owner missing from a restarted registry is not admitted (ADM-09): its owner-table row
    says `live` and its owner is alive, so the agent registers again."""
    index = runtime.table(SESSIONS_INDEX)
    if index is None:
        return "registry_unavailable"
    if conn_key is None:
        return "no_connection"
    try:
        binding = index.get(session_id)
    except TableGone:
        return "registry_unavailable"
    if binding is None:
        return None if _recovering_here(runtime, session_id, conn_key) else "unknown_session"
    if binding.conn_key is None:
        return "no_connection"
    if binding.conn_key != conn_key:
        return "connection_mismatch"
    return None


def _recovering_here(runtime: LoopSystemBase, session_id: str, conn_key: ConnKey) -> bool:
    owners = runtime.table(OWNERS_TABLE)
    if owners is None:
        return False
    try:
        record = owners.get(session_id)
    except TableGone:
        return False
    if record is None or getattr(record, "conn_key", None) != conn_key:
        return False
    state = getattr(record, "state", None)
    if state == "recovering":
        return True
    owner = getattr(record, "owner", None)
    # A `live` row whose owner is dead: the owner crashed and its restart has not re-registered
    # the session yet. `ending` and `superseded` rows are never admitted.
    return state == "live" and isinstance(owner, Address) and not runtime.is_alive(owner)


# --- readiness ------------------------------------------------------------------------------------


def readiness_checks(runtime: LoopSystemBase) -> dict[str, Callable[[], bool]]:
    """`/readyz` checks: `registry` (the actor is alive) and `sessions_index` (the table exists;
    without it every heartbeat is refused `registry_unavailable`)."""
    return {
        REGISTRY_NAME: lambda: runtime.whereis(REGISTRY_NAME) is not None,
        SESSIONS_INDEX: lambda: runtime.table(SESSIONS_INDEX) is not None,
    }


def install_readiness(readiness: Readiness, runtime: LoopSystemBase) -> None:
    """Register the checks once per node (a restarted registry finds them there already)."""
    present = set(readiness.names())
    for name, check in readiness_checks(runtime).items():
        if name not in present:
            readiness.register(name, check)
