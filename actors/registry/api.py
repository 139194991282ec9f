"""The registry's messages, and what it answers.

Request processes (gRPC handlers) `await runtime.ask(registry, ...)`; owners `send` and get the
answer as a message; `Release`, `ReleaseTaken`, `Unregister` and `ConnectionDown` are fire and
forget (`tell`), so a handler being cancelled can send them without awaiting anything.

The flow of one agent:

    Register handler   Reserve -> Reserved | ReserveRefused          (cap check and slot, atomic)
                       ... permit, ProxyRegister ...
                       Commit -> Committed | CommitRefused            (or Release on any failure)
    Subscribe handler  TakePending -> Taken | TakeRefused             (slot moves to the stream)
                       ... starts the owner; ReleaseTaken if it cannot, or if the take
                       was cancelled or timed out ...
    owner              OwnerUp -> OwnerRegistered | OwnerRefused     (monitored from here on)
                       Unregister on a normal end; ReleaseTaken if it ends at its start
    listener           ConnectionDown when an HTTP/2 connection closes

What any code on the node may read about agent sessions, without a message.

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
    from actors.node.api import Readiness
    from supervisors.runtime import LoopSystemBase


ConnKey = Hashable


# The Register answer (UNAVAILABLE) and the INFO line, as the seed quotes them. The line carries
# no request and no agent id.
SUPERSEDED_DETAILS = "Registration superseded by a newer registration"


SUPERSEDED_LOG = "Register superseded by a newer registration"


SlotRefusal = Literal["cap", "connection_down", "no_connection"]


@attrs.frozen
class Reserve:
    """Ask: take a slot on `conn_key` for a Register of `agent_id` before anything goes
    upstream. `request_id` is the caller's and unique on the node (`new_request_id()` in
    actors/registry/registration.py): it names the reservation in `Release` and `Commit`, so a
    caller
    cancelled while this ask is still queued can release it at once."""

    request_id: Hashable
    conn_key: ConnKey | None
    agent_id: str


@attrs.frozen
class Reserved:
    request_id: Hashable
    stamp: float


@attrs.frozen
class ReserveRefused:
    """`cap`: answer UNAVAILABLE. `connection_down` / `no_connection`: the call has no usable
    connection (its answer cannot be delivered, or the listener gave it no key).
    `duplicate_request`: the request id already holds a reservation (a caller's bug)."""

    request_id: Hashable
    reason: Literal["cap", "connection_down", "no_connection", "duplicate_request"]


@attrs.frozen
class Release:
    """Tell: the Register will not commit (cancelled, refused upstream, failed): free its slot
    at once. Sent after its `Reserve`, it is handled after it (one mailbox, in order), so it
    frees a reservation whose answer never reached the caller. Harmless after a commit, an
    expiry or a refusal."""

    request_id: Hashable


@attrs.frozen
class Commit:
    """Ask: store the pending row the server's answer makes, on the reservation's connection,
    under the same-agent rule. The agent id and the stamp are the reservation's."""

    request_id: Hashable
    session_id: str
    peer: str = ""
    plugins: tuple[str, ...] = ()
    # The Register as sent upstream, kept for the owner (replay); never logged or shown.
    register: object = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class Committed:
    session_id: str


@attrs.frozen
class CommitRefused:
    """Answer the Register UNAVAILABLE, `SUPERSEDED_DETAILS`: a newer Register of the agent
    committed, its own reservation is gone (expired), or its connection went down."""

    reason: Literal["superseded"] = "superseded"


@attrs.frozen
class TakePending:
    """Ask: take the pending row of `session_id` for a Subscribe on `conn_key`. The slot moves
    to `conn_key` (cap-checked when that is another connection) and the session is bound to
    it until its owner registers."""

    session_id: str
    conn_key: ConnKey | None


@attrs.frozen
class Taken:
    row: PendingRow


@attrs.frozen
class TakeRefused:
    """`not_found`: NOT_FOUND. `cap`: UNAVAILABLE. The row stays when refused by the cap."""

    reason: Literal["not_found", "cap", "connection_down", "no_connection"]


@attrs.frozen
class ReleaseTaken:
    """Tell: the Subscribe took the row but no owner will register it: free the slot and the
    binding (from the Subscribe handler, or from an owner that ended at its start). Harmless
    once an owner registered the session: its slot is no longer the take's."""

    session_id: str


@attrs.frozen
class OwnerUp:
    """From the owner (sent, answered to the sender): register the live session. The registry
    monitors `owner` and drops the session when it ends."""

    session_id: str
    agent_id: str
    owner: Address
    conn_key: ConnKey | None
    stream_home_id: str
    peer: str = ""
    plugins: tuple[str, ...] = ()
    # Wall-clock seconds (time.time()) for the console; the registry never reads a wall clock.
    connected_at: float = 0.0
    # The AgentInfo of the Register (agent_pb2.AgentInfo), kept in the session's row for the
    # management plane; never logged or shown.
    info: object = attrs.field(default=None, eq=False, repr=False)
    # None: a new session, first registered now. Else a restarted owner registering its dead
    # predecessor's session again, first registered at `since` (the registry's loop clock, from
    # the owner-table row): refused `superseded` if the agent has a newer session
    # (actors/core/owner_recovery.py `superseded`), so the old one is never indexed again.
    since: float | None = None


@attrs.frozen
class OwnerRegistered:
    session_id: str
    # When the session was first registered (loop clock); the owner keeps it in its row.
    since: float = attrs.field(default=0.0, eq=False)


@attrs.frozen
class OwnerRefused:
    """The live insert was refused (the cap on that connection, or it went down; `superseded`:
    a restarted owner's session whose agent has a newer one): the owner ends the session."""

    session_id: str
    reason: SlotRefusal | Literal["superseded"]


@attrs.frozen
class Unregister:
    """Tell: the owner ended its session. Ignored unless `owner` is the session's owner."""

    session_id: str
    owner: Address


@attrs.frozen
class ConnectionDown:
    """Tell: the HTTP/2 connection closed. Its pending rows go after the grace; it takes no new
    reservation, commit or Subscribe."""

    conn_key: ConnKey


@attrs.frozen
class GetCounts:
    """Ask: answered with `RegistryCounts` (tests, the console)."""


@attrs.frozen
class RegistryCounts:
    agents: int
    pending: int
    reservations: int
    subscribing: int
    connections: int
    connections_down: int
    max_sessions_per_connection: int


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
    # When the session was first registered here (loop clock; kept across an owner restart):
    # what orders an agent's sessions when a restarted owner registers an old one again.
    since: float = attrs.field(default=0.0, kw_only=True)
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
