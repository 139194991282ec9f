"""`registry`: the actor that owns the agent-session tables (the Erlang yuzu_gw_registry).

It holds two cores and five tables:

- `SessionSlots` (actors/core/reservations.py): the per-connection cap, reservations included;
- `PendingStore` (actors/core/pending.py): pending rows, the same-agent rule, TTL and grace;
- the protected tables `agents`, `agents_by_id`, `pending_registrations`, `connections`,
  `sessions_index` (actors/registry/api.py), which it alone writes, so any code reads them
  without
  a message.

`agents_by_id` maps an agent id to its newest live session: the router resolves a command's
target in O(1) and the management plane walks the agents by id. An agent can hold two live
sessions for a moment (it registered again while its old stream was still open); the index then
names the newer, and falls back to the older if the newer ends first. An owner restarted after a
crash registers its session again under the time it was first registered (`OwnerUp.since`); if
the agent has a newer session by then it is refused `superseded` (actors/core/owner_recovery.py),
so the index never names the stale session (seed: "When an agent's owner process crashes").

Everything one message does is atomic: the cap check and the reservation, a commit and the
same-agent rule, a take and the slot moving to the Subscribe's connection. That is the whole
answer to the seed's review history (checks that were not atomic with the store).

The tables are made in `init` and die with the actor, so a restarted registry starts empty: the
agents it held are refused `unknown_session` until they register again (seed: "Heartbeat
admission"). It monitors every owner that registers and drops the session at once when the owner
ends. One timer, armed at the earliest deadline of either core, sweeps expired reservations,
abandoned takes, pending rows past their TTL and rows of connections past their grace.

`format_status` shows counts only: session ids and agent ids stay out of the console.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
from thespian.actors import WakeupMessage

from actors.core.owner_recovery import superseded
from actors.core.pending import (
    PendingPolicy,
    PendingRow,
    PendingStore,
    Removed,
    Superseded,
)
from actors.core.reservations import (
    ConnKey,
    DuplicateReservationError,
    Granted,
    HolderId,
    Refused,
    SessionSlots,
    SlotPolicy,
)
from actors.registry.api import (
    AGENTS_BY_ID,
    AGENTS_TABLE,
    CONNECTIONS_TABLE,
    PENDING_TABLE,
    SESSIONS_INDEX,
    SUPERSEDED_LOG,
    AgentRow,
    Binding,
    Commit,
    CommitRefused,
    Committed,
    ConnectionDown,
    ConnUsage,
    GetCounts,
    OwnerRefused,
    OwnerRegistered,
    OwnerUp,
    RegistryCounts,
    Release,
    ReleaseTaken,
    Reserve,
    Reserved,
    ReserveRefused,
    Taken,
    TakePending,
    TakeRefused,
    Unregister,
    install_readiness,
)
from supervisors.address import Address
from supervisors.messages import ActorDown
from supervisors.process import Process

if TYPE_CHECKING:
    from actors.node.api import Readiness
    from supervisors.table import Table

__all__ = ["Registry", "RegistryArgs"]

log = logging.getLogger("yuzu_gw.registry")

_SWEEP = "registry_sweep"
_GONE = object()


@attrs.frozen
class RegistryArgs:
    """Built by gateway/node/children/registry.py (the cap from the Config)."""

    slots: SlotPolicy = attrs.field(factory=SlotPolicy)
    pending: PendingPolicy = attrs.field(factory=PendingPolicy)
    # Where the `registry` and `sessions_index` checks go; None in tests that do not need them.
    readiness: Readiness | None = None


def _pending(session_id: str) -> HolderId:
    return ("pending", session_id)


def _subscribing(session_id: str) -> HolderId:
    return ("subscribing", session_id)


def _live(session_id: str) -> HolderId:
    return ("live", session_id)


class Registry(Process):
    def init(self, args: RegistryArgs | None) -> None:
        args = args if args is not None else RegistryArgs()
        self.slots = SessionSlots(args.slots)
        self.pending = PendingStore(args.pending)
        self.agents: Table[str, AgentRow] = self.new_table(AGENTS_TABLE)
        self.agents_by_id: Table[str, str] = self.new_table(AGENTS_BY_ID)
        # agent id -> its live session ids, oldest first (an ordered set): the index's fallback.
        self._sessions_of: dict[str, dict[str, None]] = {}
        # session id -> agent id of each taken row whose owner has not registered yet (dropped
        # by `_reindex` once the take ends): a newer session for `_superseded`.
        self._taking: dict[str, str] = {}
        self.pending_rows: Table[str, PendingRow] = self.new_table(PENDING_TABLE)
        self.connections: Table[ConnKey, ConnUsage] = self.new_table(CONNECTIONS_TABLE)
        self.sessions_index: Table[str, Binding] = self.new_table(SESSIONS_INDEX)
        # owner -> (session, monitor id): one session per owner.
        self._owners: dict[Address, tuple[str, int]] = {}
        self._timer: Any = None
        self._timer_at = math.inf
        self._timer_gen = 0
        if args.readiness is not None:
            install_readiness(args.readiness, self.runtime)

    # -- messages --

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        now = self.now()
        match msg:
            # These free slots or hold one with no expiry: no deadline comes earlier, so the
            # timer needs no look (the owners' messages, two in every owner restart).
            case OwnerUp():
                self.send(sender, self._owner_up(msg, now))
            case ActorDown(address=address):
                self._owner_down(address)
            case Unregister(session_id=session_id, owner=owner):
                self._unregister(session_id, owner)
            case Release(request_id=request_id):
                self._free(("reservation", request_id))
            case ReleaseTaken(session_id=session_id):
                self._free(_subscribing(session_id))
                self._reindex(session_id)
            case GetCounts():
                self.send(sender, self._counts())
            case _:
                self._timed(msg, sender, now)
                self._arm(now)

    def _timed(self, msg: Any, sender: Address, now: float) -> None:
        """The messages that may set a deadline (a reservation's or a take's expiry, a pending
        row's TTL, a connection's grace) or sweep them: the timer is armed after each."""
        match msg:
            case Reserve():
                self.send(sender, self._reserve(msg, now))
            case Commit():
                self.send(sender, self._commit(msg, now))
            case TakePending():
                self.send(sender, self._take(msg, now))
            case ConnectionDown(conn_key=conn_key):
                self._connection_down(conn_key, now)
            case WakeupMessage(payload=(tag, gen)) if tag == _SWEEP:
                if gen == self._timer_gen:
                    self._timer, self._timer_at = None, math.inf
                self._sweep(now)
            case _:
                pass

    def format_status(self) -> Mapping[str, Any]:
        return attrs.asdict(self._counts())

    # -- Register --

    def _reserve(self, msg: Reserve, now: float) -> Reserved | ReserveRefused:
        if msg.conn_key is None:
            return ReserveRefused(msg.request_id, "no_connection")
        try:
            outcome = self.slots.reserve(msg.request_id, msg.conn_key, msg.agent_id, now)
        except DuplicateReservationError:
            # A caller's bug must not crash the registry (and empty every table with it).
            return ReserveRefused(msg.request_id, "duplicate_request")
        if isinstance(outcome, Refused):
            return ReserveRefused(msg.request_id, outcome.reason)
        assert isinstance(outcome, Granted)
        self._publish_conn(msg.conn_key)
        return Reserved(msg.request_id, outcome.stamp)

    def _commit(self, msg: Commit, now: float) -> Committed | CommitRefused:
        reservation = self.slots.reservation(msg.request_id)
        if reservation is None or self.slots.is_down(reservation.conn_key):
            # Its reservation expired, or its connection closed: nobody can use this session.
            self._free(("reservation", msg.request_id))
            log.info(SUPERSEDED_LOG)
            return CommitRefused()
        row = PendingRow(
            session_id=msg.session_id,
            agent_id=reservation.agent_id,
            conn_key=reservation.conn_key,
            stamp=reservation.stamp,
            peer=msg.peer,
            plugins=msg.plugins,
            register=msg.register,
        )
        outcome = self.pending.commit(row, now)
        if isinstance(outcome, Superseded):
            self._free(("reservation", msg.request_id))
            log.info(SUPERSEDED_LOG)
            return CommitRefused()
        replaced = outcome.replaced
        if replaced is not None and replaced.session_id != row.session_id:
            # The agent's older row is gone: its slot and its binding with it.
            self.pending_rows.delete(replaced.session_id)
            self._free(_pending(replaced.session_id))
            self._reindex(replaced.session_id)
        # The same session committed again may have held its slot on another connection.
        earlier_conn = self.slots.conn_of(_pending(row.session_id))
        self.slots.commit(msg.request_id, _pending(row.session_id))
        self.pending_rows.insert(row.session_id, outcome.row)
        self._publish_conn(row.conn_key)
        if earlier_conn is not None and earlier_conn != row.conn_key:
            self._publish_conn(earlier_conn)
        self._reindex(row.session_id)
        return Committed(row.session_id)

    # -- Subscribe --

    def _take(self, msg: TakePending, now: float) -> Taken | TakeRefused:
        session_id, conn_key = msg.session_id, msg.conn_key
        if conn_key is None:
            return TakeRefused("no_connection")
        row = self.pending.get(session_id)
        if row is None:
            return TakeRefused("not_found")
        # The slot moves from the row to the Subscribe's connection in this one step; it expires
        # like a reservation if no owner ever registers the session.
        refusal = self.slots.claim(
            _subscribing(session_id),
            conn_key,
            now,
            replacing=_pending(session_id),
            expires_at=now + self.slots.policy.reservation_ttl_s,
        )
        if refusal is not None:
            return TakeRefused(refusal.reason)
        self.pending.take(session_id)
        self.pending_rows.delete(session_id)
        self._taking[session_id] = row.agent_id
        self._publish_conn(row.conn_key)
        self._publish_conn(conn_key)
        self._reindex(session_id)
        return Taken(row)

    # -- owners --

    def _owner_up(self, msg: OwnerUp, now: float) -> OwnerRegistered | OwnerRefused:
        session_id, conn_key = msg.session_id, msg.conn_key
        if conn_key is None:
            self._free(_subscribing(session_id))
            self._reindex(session_id)
            return OwnerRefused(session_id, "no_connection")
        if msg.since is not None and self._superseded(msg.agent_id, session_id, msg.since):
            # Decided here, in the mailbox that orders every registration of the agent, so a
            # newer session cannot slip in between a check and the insert.
            return OwnerRefused(session_id, "superseded")
        refusal = self.slots.claim(
            _live(session_id), conn_key, now, replacing=_subscribing(session_id)
        )
        if refusal is not None:
            self._free(_subscribing(session_id))
            self._reindex(session_id)
            return OwnerRefused(session_id, refusal.reason)
        since = now if msg.since is None else msg.since
        previous = self.agents.get(session_id)
        if previous is not None and previous.owner != msg.owner:
            # A newer owner of the session (a restart that re-adopts it): stop watching the old.
            self._forget_owner(previous.owner)
        entry = self._owners.get(msg.owner)
        if entry is None:
            self._owners[msg.owner] = (session_id, self.monitor(msg.owner))
        elif entry[0] != session_id:
            # One session per owner: an owner that registers another drops its first.
            self._drop_live(entry[0], msg.owner)
            self._owners[msg.owner] = (session_id, entry[1])
        self.agents.insert(
            session_id,
            AgentRow(
                session_id=session_id,
                agent_id=msg.agent_id,
                owner=msg.owner,
                conn_key=conn_key,
                peer=msg.peer,
                plugins=msg.plugins,
                connected_at=msg.connected_at,
                stream_home_id=msg.stream_home_id,
                since=since,
                info=msg.info,
            ),
        )
        if previous is not None and previous.agent_id != msg.agent_id:
            self._unindex_agent(previous.agent_id, session_id)
        self._index_agent(msg.agent_id, session_id)
        self._publish_conn(conn_key)
        self._reindex(session_id)
        return OwnerRegistered(session_id, since)

    def _superseded(self, agent_id: str, session_id: str, since: float) -> bool:
        others = (
            row.since
            for other in self._sessions_of.get(agent_id, ())
            if other != session_id and (row := self.agents.get(other)) is not None
        )
        pending = self.pending.of_agent(agent_id)
        registering = (pending is not None and pending.session_id != session_id) or any(
            agent == agent_id and taken != session_id for taken, agent in self._taking.items()
        )
        return superseded(since, others, registering)

    def _unregister(self, session_id: str, owner: Address) -> None:
        row = self.agents.get(session_id)
        if row is not None and row.owner == owner:
            self._forget_owner(owner)
            self._drop_live(session_id, owner)

    def _owner_down(self, owner: Address) -> None:
        entry = self._owners.pop(owner, None)
        if entry is not None:
            # The session goes at once, whatever the reason: a restarted owner registers it
            # again, and admission covers the gap from the owner table (ADM-08).
            self._drop_live(entry[0], owner)

    def _forget_owner(self, owner: Address) -> None:
        entry = self._owners.pop(owner, None)
        if entry is not None:
            self.demonitor(entry[1])

    def _drop_live(self, session_id: str, owner: Address) -> None:
        row = self.agents.get(session_id)
        if row is None or row.owner != owner:
            return
        self.agents.delete(session_id)
        self._unindex_agent(row.agent_id, session_id)
        self._free(_live(session_id))
        self._reindex(session_id)

    # -- connections and time --

    def _connection_down(self, conn_key: ConnKey, now: float) -> None:
        if self.slots.connection_down(conn_key):
            # Only a connection that holds something can have rows to remove after the grace;
            # a connection that never registered costs nothing here.
            self.pending.connection_down(conn_key, now)
            self._publish_conn(conn_key)

    def _sweep(self, now: float) -> None:
        for removed in self.pending.sweep(now):
            self._removed(removed)
        for holder, conn_key in self.slots.expire(now):
            if holder[0] == "subscribing":
                self._reindex(str(holder[1]))  # an abandoned take: the session is unbound
            self._publish_conn(conn_key)

    def _removed(self, removed: Removed) -> None:
        session_id = removed.row.session_id
        self.pending_rows.delete(session_id)
        self._free(_pending(session_id))
        self._reindex(session_id)

    def _arm(self, now: float) -> None:
        dues = [
            d for d in (self.pending.next_deadline(), self.slots.next_deadline()) if d is not None
        ]
        if not dues:
            return
        due = min(dues)
        if due >= self._timer_at:
            return
        if self._timer is not None:
            self.cancel_wakeup(self._timer)
        self._timer_gen += 1
        self._timer_at = due
        self._timer = self.wakeupAfter(max(0.0, due - now), (_SWEEP, self._timer_gen))

    # -- table upkeep --

    def _free(self, holder: HolderId) -> None:
        conn_key = self.slots.release(holder)
        if conn_key is not None:
            self._publish_conn(conn_key)

    def _reindex(self, session_id: str) -> None:
        """Recompute the session's binding from the state (live, then subscribing, then
        pending), so no path can leave the index disagreeing with the rows."""
        binding: Binding | None = None
        agent = self.agents.get(session_id)
        if agent is not None:
            binding = Binding(agent.conn_key, "live")
        else:
            conn_key = self.slots.conn_of(_subscribing(session_id))
            if conn_key is not None:
                binding = Binding(conn_key, "subscribing")
            else:
                row = self.pending.get(session_id)
                if row is not None:
                    binding = Binding(row.conn_key, "pending")
        if binding is None or binding.state != "subscribing":
            self._taking.pop(session_id, None)
        if binding is None:
            self.sessions_index.delete(session_id)
        elif self.sessions_index.get(session_id) != binding:
            self.sessions_index.insert(session_id, binding)

    def _index_agent(self, agent_id: str, session_id: str) -> None:
        sessions = self._sessions_of.setdefault(agent_id, {})
        sessions.pop(session_id, None)
        sessions[session_id] = None
        self.agents_by_id.insert(agent_id, session_id)

    def _unindex_agent(self, agent_id: str, session_id: str) -> None:
        sessions = self._sessions_of.get(agent_id)
        if sessions is None or sessions.pop(session_id, _GONE) is _GONE:
            return
        if sessions:
            self.agents_by_id.insert(agent_id, next(reversed(sessions)))
        else:
            del self._sessions_of[agent_id]
            self.agents_by_id.delete(agent_id)

    def _publish_conn(self, conn_key: ConnKey) -> None:
        usage = self.slots.usage(conn_key)
        if sum(usage.values()) == 0:
            self.connections.delete(conn_key)
            return
        self.connections.insert(
            conn_key,
            ConnUsage(
                reservations=usage["reservation"],
                pending=usage["pending"],
                subscribing=usage["subscribing"],
                live=usage["live"],
                down=self.slots.is_down(conn_key),
            ),
        )

    def _counts(self) -> RegistryCounts:
        return RegistryCounts(
            agents=len(self.agents),
            pending=len(self.pending),
            reservations=self.slots.reservations,
            subscribing=self.slots.count("subscribing"),
            connections=len(self.connections),
            connections_down=self.slots.connections_down,
            max_sessions_per_connection=self.slots.policy.max_sessions_per_connection,
        )
