"""The registry's messages, and what it answers.

Request processes (gRPC handlers) `await runtime.ask(registry, ...)`; owners `send` and get the
answer as a message; `Release`, `ReleaseTaken`, `Unregister` and `ConnectionDown` are fire and
forget (`tell`), so a handler being cancelled can send them without awaiting anything.

The flow of one agent:

    Register handler   Reserve -> Reserved | ReserveRefused          (cap check and slot, atomic)
                       ... permit, ProxyRegister ...
                       Commit -> Committed | CommitRefused            (or Release on any failure)
    Subscribe handler  TakePending -> Taken | TakeRefused             (slot moves to the stream)
                       ... starts the owner; ReleaseTaken if it cannot ...
    owner              OwnerUp -> OwnerRegistered | OwnerRefused     (monitored from here on)
                       Unregister on a normal end
    listener           ConnectionDown when an HTTP/2 connection closes
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Literal

import attrs

from actors.core.pending import PendingRow
from supervisors.address import Address

__all__ = [
    "SUPERSEDED_DETAILS",
    "SUPERSEDED_LOG",
    "Commit",
    "CommitRefused",
    "Committed",
    "ConnectionDown",
    "GetCounts",
    "OwnerRefused",
    "OwnerRegistered",
    "OwnerUp",
    "RegistryCounts",
    "Release",
    "ReleaseTaken",
    "Reserve",
    "ReserveRefused",
    "Reserved",
    "TakePending",
    "TakeRefused",
    "Taken",
    "Unregister",
]

ConnKey = Hashable

# The Register answer (UNAVAILABLE) and the INFO line, as the seed quotes them. The line carries
# no request and no agent id.
SUPERSEDED_DETAILS = "Registration superseded by a newer registration"
SUPERSEDED_LOG = "Register superseded by a newer registration"

SlotRefusal = Literal["cap", "connection_down", "no_connection"]


# --- Register -------------------------------------------------------------------------------------


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


# --- Subscribe ------------------------------------------------------------------------------------


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
    """Tell: the Subscribe took the row but no owner will register it: free the slot."""

    session_id: str


# --- owners ---------------------------------------------------------------------------------------


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


@attrs.frozen
class OwnerRegistered:
    session_id: str


@attrs.frozen
class OwnerRefused:
    """The live insert was refused (the cap on that connection, or it went down): the owner
    ends the session."""

    session_id: str
    reason: SlotRefusal


@attrs.frozen
class Unregister:
    """Tell: the owner ended its session. Ignored unless `owner` is the session's owner."""

    session_id: str
    owner: Address


# --- listener -------------------------------------------------------------------------------------


@attrs.frozen
class ConnectionDown:
    """Tell: the HTTP/2 connection closed. Its pending rows go after the grace; it takes no new
    reservation, commit or Subscribe."""

    conn_key: ConnKey


# --- introspection --------------------------------------------------------------------------------


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
