"""The per-connection session cap: the slot book of the registry (yuzu_gw_registry).

Rules of this file: how many slots one HTTP/2 connection may hold, who holds them, and when a
slot is freed. Nothing here does I/O or reads a clock; every method that depends on time takes
`now` (seconds, monotonic).

Theory of operation (seed: "Configuration > Per-connection session cap", its "Review history"
and "Residuals"; SPEC_INDEX PEND-01..03, PEND-06, PEND-07, PEND-09, PEND-10, K30, K31):

* A connection holds at most `max_sessions_per_connection` (8) slots. A slot is held by one
  *holder*, of one of four kinds:
  - `("reservation", request_id)`: a Register in flight, between the cap check and its commit.
    The request id is the caller's, so a caller cancelled at any moment, even while its reserve
    call is still in the registry's mailbox, can release by it at once.
    Every reservation counts, including those of an agent id that already holds one: the
    review that found 20 of 20 same-id Registers admitted at cap 8 was exactly a count that
    left the agent's own reservations out. 20 concurrent same-id reserves at cap 8 give 8
    tokens and 12 refusals.
  - `("pending", session_id)`: a committed pending registration (the reservation renamed, on the
    same connection, so the commit never needs a second cap check and can never be refused by
    the cap).
  - `("subscribing", session_id)`: a Subscribe took the pending row and its owner is starting.
    Taking moves the slot in one step, so there is no moment where the slot is free (the seed's
    residual (3), a racing Register taking the slot in that gap, does not exist here).
  - `("live", session_id)`: the session's owner registered it.
* The check and the taking are one call, and the registry makes each call inside one message:
  nothing can slip in between (the seed's second review gap, 121 of 200 through a check that
  was not atomic with the store).
* A reservation expires after `reservation_ttl_s` (120 s, the pending time to live): a handler
  whose reserve call timed out at 5 s never learns its token, and the slot must still come back
  (the seed's residual (2), for a caller that could not even send its release). A
  `subscribing` holder expires the same way, in case the Subscribe died before its owner
  registered.
* A connection that went down refuses new reservations, commits and claims: a Register whose
  connection closed cannot deliver its answer, so its session must not be stored. The mark is
  kept while the connection holds anything and forgotten with its last holder (connection keys
  are never reused, so nothing can arrive for it afterwards but those holders' own ends).

The count is the size of the connection's holder set: the per-connection index, never a scan.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator
from typing import Literal

import attrs

from actors.core.deadlines import Deadlines

__all__ = [
    "ConnKey",
    "DuplicateReservationError",
    "Granted",
    "HolderId",
    "HolderKind",
    "Refused",
    "Reservation",
    "SessionSlots",
    "SlotPolicy",
    "holder_kind",
]

ConnKey = Hashable
"""The listener's key of one HTTP/2 connection: unique for the node's life, never reused."""
RequestId = Hashable
HolderKind = Literal["reservation", "pending", "subscribing", "live"]
# (kind, key): the key is the request id of a reservation, else the session id.
HolderId = tuple[HolderKind, Hashable]
RefusalReason = Literal["cap", "connection_down"]

_ABSENT = object()
_KINDS: tuple[HolderKind, ...] = ("reservation", "pending", "subscribing", "live")


def holder_kind(holder: HolderId) -> HolderKind:
    return holder[0]


class DuplicateReservationError(ValueError):
    """A request id that holds a reservation asked again: the caller's ids are not unique."""


def _at_least_one(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value!r}")


@attrs.frozen
class SlotPolicy:
    # max_sessions_per_connection: a stock agent holds one session per connection, so 8 leaves
    # room for retries while one connection cannot park many pending sessions with large
    # snapshots (the reason the cap exists). Read once, when the registry starts.
    max_sessions_per_connection: int = attrs.field(default=8, validator=_at_least_one)
    # The pending time to live: a reservation whose handler never commits or releases (a reserve
    # call that timed out at 5 s) comes back no later than a pending row would.
    reservation_ttl_s: float = 120.0


@attrs.frozen
class Granted:
    """The reservation of `request_id`; `stamp` orders it for the same-agent rule."""

    request_id: RequestId
    stamp: float


@attrs.frozen
class Refused:
    reason: RefusalReason


@attrs.frozen
class Reservation:
    request_id: RequestId
    conn_key: ConnKey
    agent_id: str
    stamp: float


@attrs.define
class _Conn:
    holders: set[HolderId] = attrs.field(factory=set)
    down: bool = False


@attrs.define
class SessionSlots:
    """Slots per connection, reservations included. No clock inside: every method takes `now`."""

    policy: SlotPolicy = attrs.field(factory=SlotPolicy)
    _conns: dict[ConnKey, _Conn] = attrs.field(init=False, factory=dict)
    _where: dict[HolderId, ConnKey] = attrs.field(init=False, factory=dict)
    _reservations: dict[RequestId, Reservation] = attrs.field(init=False, factory=dict)
    _expiry: Deadlines[HolderId] = attrs.field(init=False, factory=Deadlines)
    _kinds: dict[HolderKind, int] = attrs.field(
        init=False, factory=lambda: dict.fromkeys(_KINDS, 0)
    )

    # -- reading --

    def used(self, conn_key: ConnKey) -> int:
        conn = self._conns.get(conn_key)
        return 0 if conn is None else len(conn.holders)

    def usage(self, conn_key: ConnKey) -> dict[HolderKind, int]:
        """The connection's holders by kind (at most the cap of them: cheap)."""
        counts: dict[HolderKind, int] = dict.fromkeys(_KINDS, 0)
        conn = self._conns.get(conn_key)
        for holder in () if conn is None else conn.holders:
            counts[holder_kind(holder)] += 1
        return counts

    def is_down(self, conn_key: ConnKey) -> bool:
        conn = self._conns.get(conn_key)
        return conn is not None and conn.down

    def conn_of(self, holder: HolderId) -> ConnKey | None:
        return self._where.get(holder)

    def holds(self, holder: HolderId) -> bool:
        return holder in self._where

    def reservation(self, request_id: RequestId) -> Reservation | None:
        return self._reservations.get(request_id)

    def expires_at(self, holder: HolderId) -> float:
        due = self._expiry.get(holder)
        return math.inf if due is None else due

    def count(self, kind: HolderKind) -> int:
        """Holders of one kind over every connection."""
        return self._kinds[kind]

    @property
    def reservations(self) -> int:
        return len(self._reservations)

    @property
    def holders(self) -> int:
        return len(self._where)

    def connections(self) -> Iterator[ConnKey]:
        return iter(self._conns)

    @property
    def connections_down(self) -> int:
        return sum(1 for conn in self._conns.values() if conn.down)

    def next_deadline(self) -> float | None:
        return self._expiry.next()

    # -- operations --

    def reserve(
        self, request_id: RequestId, conn_key: ConnKey, agent_id: str, now: float
    ) -> Granted | Refused:
        """Take a slot for a Register in flight, or refuse: the cap counts every holder."""
        if request_id in self._reservations:
            raise DuplicateReservationError(f"request {request_id!r} already holds a reservation")
        refusal = self._refusal(conn_key)
        if refusal is not None:
            return refusal
        # The stamp orders Registers by arrival: the newest Register of an agent wins even when
        # an older one's server call returns later (actors/core/pending.py).
        self._reservations[request_id] = Reservation(request_id, conn_key, agent_id, now)
        self._add(("reservation", request_id), conn_key, now + self.policy.reservation_ttl_s)
        return Granted(request_id, now)

    def release(self, holder: HolderId) -> ConnKey | None:
        """Free the slot `holder` has (unknown holders are ignored: a release may race the
        holder's expiry or a commit). Returns the connection it was on."""
        conn_key = self._where.get(holder, _ABSENT)
        if conn_key is _ABSENT:
            return None
        self._remove(holder)
        return conn_key

    def cancel(self, request_id: RequestId) -> ConnKey | None:
        """The Register will not commit: free its reservation (unknown ids are ignored)."""
        return self.release(("reservation", request_id))

    def commit(self, request_id: RequestId, holder: HolderId) -> ConnKey | None:
        """Turn the reservation into `holder` on the same connection, with no expiry. None (and
        the reservation freed) when it is gone or its connection went down. A holder of the
        same name elsewhere (the same session committed again) gives up its slot: one holder
        per name."""
        reservation = self._reservations.get(request_id)
        if reservation is None:
            return None
        conn_key = reservation.conn_key
        if self.is_down(conn_key):
            self._remove(("reservation", request_id))
            return None
        if holder in self._where:
            self._remove(holder)
        self._remove(("reservation", request_id))
        self._add(holder, conn_key, math.inf)
        return conn_key

    def claim(
        self,
        holder: HolderId,
        conn_key: ConnKey,
        now: float,
        *,
        replacing: HolderId | None = None,
        expires_at: float = math.inf,
    ) -> Refused | None:
        """Let `holder` hold a slot on `conn_key` (None: done). A holder already there keeps its
        slot (its expiry becomes `expires_at`); one that takes the place of `replacing` on the
        same connection takes that slot; otherwise the cap applies. On success `replacing` is
        freed wherever it was and `holder` leaves any other connection."""
        if self.is_down(conn_key):
            return Refused("connection_down")
        here = self._where.get(holder, _ABSENT)
        if here is not _ABSENT and here == conn_key:
            self._set_expiry(holder, expires_at)
            if replacing is not None and replacing != holder:
                self._remove_if_held(replacing)
            return None
        takes_place = replacing is not None and self._where.get(replacing, _ABSENT) == conn_key
        if not takes_place and self.used(conn_key) >= self.policy.max_sessions_per_connection:
            return Refused("cap")
        if replacing is not None:
            self._remove_if_held(replacing)
        self._remove_if_held(holder)  # leaves its other connection (it may be `replacing`)
        self._add(holder, conn_key, expires_at)
        return None

    def connection_down(self, conn_key: ConnKey) -> bool:
        """The connection closed. True when it holds anything (it is marked down until its last
        holder goes); a connection that holds nothing needs no mark."""
        conn = self._conns.get(conn_key)
        if conn is None:
            return False
        conn.down = True
        return True

    def expire(self, now: float) -> list[tuple[HolderId, ConnKey]]:
        """Free every holder whose time is up; returns each with the connection it was on,
        earliest first."""
        expired: list[tuple[HolderId, ConnKey]] = []
        for holder in self._expiry.pop_due(now):
            expired.append((holder, self._where[holder]))
            self._remove(holder)
        return expired

    # -- internals --

    def _refusal(self, conn_key: ConnKey) -> Refused | None:
        conn = self._conns.get(conn_key)
        if conn is None:
            return None
        if conn.down:
            return Refused("connection_down")
        if len(conn.holders) >= self.policy.max_sessions_per_connection:
            return Refused("cap")
        return None

    def _add(self, holder: HolderId, conn_key: ConnKey, expires_at: float) -> None:
        conn = self._conns.get(conn_key)
        if conn is None:
            conn = self._conns[conn_key] = _Conn()
        conn.holders.add(holder)
        self._where[holder] = conn_key
        self._kinds[holder_kind(holder)] += 1
        self._set_expiry(holder, expires_at)

    def _set_expiry(self, holder: HolderId, expires_at: float) -> None:
        if math.isinf(expires_at):
            self._expiry.discard(holder)
        else:
            self._expiry.set(holder, expires_at)

    def _remove_if_held(self, holder: HolderId) -> None:
        if holder in self._where:
            self._remove(holder)

    def _remove(self, holder: HolderId) -> None:
        conn_key = self._where.pop(holder)
        self._kinds[holder_kind(holder)] -= 1
        self._expiry.discard(holder)
        if holder[0] == "reservation":
            del self._reservations[holder[1]]
        conn = self._conns[conn_key]
        conn.holders.discard(holder)
        if not conn.holders:
            # Forgotten with its last holder, down mark included: the key is never reused.
            del self._conns[conn_key]
