"""Pending registrations: the rows a Register leaves for its Subscribe to take.

Rules of this file: which committed Register keeps a row, how long a row lives, and what a
connection going down does to its rows. Nothing here does I/O or reads a clock; every method
that depends on time takes `now` (seconds, monotonic).

Theory of operation (seed: "Configuration > Per-connection session cap", "Residuals";
SPEC_INDEX PEND-04..PEND-09, K30, C66):

* A row is keyed by its session id and indexed by agent id and by connection (the
  per-connection index: removing a connection's rows, or counting them, never scans the table).
* **The same-agent rule.** An agent has at most one row: of two commits of one agent id the
  newest *stamp* wins (the stamp is when the Register was reserved, so the newest Register wins
  even when an older one's server call returns later); of equal stamps, the last commit handled.
  A newer commit replaces the older row (`Stored.replaced`); an older one is refused
  (`Superseded`, reason `newer_row`) and leaves no row, and its Register is answered UNAVAILABLE
  "Registration superseded by a newer registration". So the same agent id registering 40 times
  leaves one row, whichever order the server answers in. The rule is per agent across the node,
  not per connection: an agent that registers again from a new connection has no use for its
  older row either.
* A commit for a session id another agent's row holds is refused (`session_conflict`): the
  server mints session ids, so this is a forged or colliding id, and the older row stays.
* **Time to live.** A row lives `ttl_s` (120 s) from its commit, then the sweep removes it.
* **Grace.** A connection that went down keeps its rows `grace_s` (15 s): an agent that
  enrolled on a bootstrap connection reconnects and subscribes on a new one, and needs its row
  for that. After the grace the sweep removes the connection's rows. While the connection is in
  its grace a commit for it is refused (`connection_down`): its Register cannot be answered.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Literal

import attrs

from actors.core.deadlines import Deadlines

__all__ = [
    "PendingPolicy",
    "PendingRow",
    "PendingStore",
    "Removed",
    "Stored",
    "Superseded",
]

ConnKey = Hashable
SupersededReason = Literal["newer_row", "connection_down", "session_conflict"]
RemovedReason = Literal["ttl", "grace"]


@attrs.frozen
class PendingPolicy:
    # The pending time to live (K30): long enough for an agent to subscribe after a slow
    # enrolment, short enough that an abandoned row (a handler that died, an agent that never
    # subscribed) does not hold its connection's slot and its memory for long.
    ttl_s: float = 120.0
    # The dead-connection grace (C66, name not in the seed's text): a bootstrap connection closes
    # right after the first Register and the agent subscribes on its next connection; observed
    # rows cleared about 19 s after connect.
    grace_s: float = 15.0


@attrs.frozen
class PendingRow:
    session_id: str
    agent_id: str
    conn_key: ConnKey
    # When the Register was reserved (the same-agent rule's order).
    stamp: float
    # Set by `commit` to its `now`.
    committed_at: float = 0.0
    # Sanitised peer address and plugin names, for the owner and the notification.
    peer: str = ""
    plugins: tuple[str, ...] = ()
    # The Register as the server accepted it, opaque here: the owner keeps it for replay. Not
    # compared and never shown: it holds the enrolment token.
    register: object = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class Stored:
    """The row is stored (with its `committed_at`); `replaced` is the agent's older row, now
    gone, whose slot the registry frees."""

    row: PendingRow
    replaced: PendingRow | None = None


@attrs.frozen
class Superseded:
    """The row was not stored: answer its Register UNAVAILABLE, superseded."""

    row: PendingRow
    reason: SupersededReason


@attrs.frozen
class Removed:
    """The sweep removed `row`: the registry frees its slot."""

    row: PendingRow
    reason: RemovedReason


@attrs.define
class PendingStore:
    policy: PendingPolicy = attrs.field(factory=PendingPolicy)
    _rows: dict[str, PendingRow] = attrs.field(init=False, factory=dict)
    _by_agent: dict[str, str] = attrs.field(init=False, factory=dict)
    _by_conn: dict[ConnKey, set[str]] = attrs.field(init=False, factory=dict)
    _ttl: Deadlines[str] = attrs.field(init=False, factory=Deadlines)
    # Connections in their grace, due when it ends.
    _grace: Deadlines[ConnKey] = attrs.field(init=False, factory=Deadlines)

    # -- reading --

    def get(self, session_id: str) -> PendingRow | None:
        return self._rows.get(session_id)

    def of_agent(self, agent_id: str) -> PendingRow | None:
        session_id = self._by_agent.get(agent_id)
        return None if session_id is None else self._rows[session_id]

    def count(self, conn_key: ConnKey) -> int:
        """Rows of one connection, from the per-connection index."""
        return len(self._by_conn.get(conn_key, ()))

    def in_grace(self, conn_key: ConnKey) -> bool:
        return conn_key in self._grace

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[PendingRow]:
        return iter(list(self._rows.values()))

    @property
    def connections_in_grace(self) -> int:
        return len(self._grace)

    def next_deadline(self) -> float | None:
        dues = [d for d in (self._ttl.next(), self._grace.next()) if d is not None]
        return min(dues) if dues else None

    # -- operations --

    def commit(self, row: PendingRow, now: float) -> Stored | Superseded:
        """Store `row` under the same-agent rule (newest stamp wins, equal stamps: this one)."""
        if row.conn_key in self._grace:
            return Superseded(row, "connection_down")
        same_id = self._rows.get(row.session_id)
        if same_id is not None and same_id.agent_id != row.agent_id:
            return Superseded(row, "session_conflict")
        current = self.of_agent(row.agent_id)
        if current is not None and row.stamp < current.stamp:
            return Superseded(row, "newer_row")
        if current is not None:
            self._drop(current.session_id)
        stored = attrs.evolve(row, committed_at=now)
        self._rows[row.session_id] = stored
        self._by_agent[row.agent_id] = row.session_id
        self._by_conn.setdefault(row.conn_key, set()).add(row.session_id)
        self._ttl.set(row.session_id, now + self.policy.ttl_s)
        return Stored(stored, current)

    def take(self, session_id: str) -> PendingRow | None:
        """Remove and return the row (a Subscribe takes it)."""
        if session_id not in self._rows:
            return None
        return self._drop(session_id)

    def connection_down(self, conn_key: ConnKey, now: float) -> None:
        """The connection closed: its rows go when the grace ends. A second report does not
        extend the grace."""
        if conn_key not in self._grace:
            self._grace.set(conn_key, now + self.policy.grace_s)

    def sweep(self, now: float) -> list[Removed]:
        """Remove the rows of connections whose grace ended, then rows past their time to live."""
        removed: list[Removed] = []
        for conn_key in self._grace.pop_due(now):
            for session_id in sorted(self._by_conn.get(conn_key, ())):
                removed.append(Removed(self._drop(session_id), "grace"))
        for session_id in self._ttl.pop_due(now):
            if session_id in self._rows:
                removed.append(Removed(self._drop(session_id), "ttl"))
        return removed

    # -- internals --

    def _drop(self, session_id: str) -> PendingRow:
        row = self._rows.pop(session_id)
        if self._by_agent.get(row.agent_id) == session_id:
            del self._by_agent[row.agent_id]
        sessions = self._by_conn[row.conn_key]
        sessions.discard(session_id)
        if not sessions:
            del self._by_conn[row.conn_key]
        self._ttl.discard(session_id)
        return row
