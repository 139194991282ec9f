"""Agent events for WatchEvents: agents connecting to and disconnecting from this node (the
handler is gateway/mgmt/watch.py).

**The publish point.** An agent's owner calls `publish` where it announces the session's
CONNECTED and DISCONNECTED to the server (actors/agents/owner.py), so a watcher sees exactly the
events the server is told, in the same order, the DISCONNECTED a restarted owner sends for its
dead predecessor included (reason `owner_restarted`; otherwise `stream_closed`).

**The watchers.** Each open WatchEvents stream is one row of the public table `agent_watchers`,
which the root supervisor owns (created next to the owner table), so no actor's restart loses
it. `publish` reads the table without a message: with no watcher it costs a table lookup and a
length check; with watchers, the event is built once and offered to each that wants it.

**A slow watcher never blocks the others, or the owner.** `offer` never waits: each watcher has
its own queue of at most `WATCH_QUEUE_MAX` events; when it is full the oldest queued event goes
(the newest say most about the agents now) and the loss is counted in
`yuzu_gw_mgmt_watch_events_dropped_total`.

**Filter.** `agent_ids` empty: every agent; otherwise only those ids (exact, byte for byte).
Events are not replayed: a watcher sees what happens after its stream opened (the response
headers are sent once it is registered, so an operator that has them misses nothing later).

The stream ends only when the operator ends it or the connection closes; an operator that keeps
one open for long should send HTTP/2 keepalive pings, since the listener closes a connection
that has received nothing for its `http2.idle_timeout` (docs/listeners.md).
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import TYPE_CHECKING

from prometheus_client import Counter

from actors.core.notify_store import Event
from protos.yuzu.common.v1 import common_pb2
from protos.yuzu.server.v1 import management_pb2
from supervisors.errors import TableGone

if TYPE_CHECKING:
    from supervisors.process import Process
    from supervisors.runtime import LoopSystemBase
    from supervisors.table import Table

__all__ = [
    "WATCHERS_TABLE",
    "WATCH_QUEUE_MAX",
    "Watcher",
    "create_watch_table",
    "publish",
]

WATCHERS_TABLE = "agent_watchers"
# Events queued for one watcher that is not reading. A reading watcher takes each event as it
# comes; 256 covers a burst of a few hundred agents reconnecting at once.
WATCH_QUEUE_MAX = 256


class Watcher:
    """One WatchEvents stream: its filter and its bounded queue (module doc)."""

    __slots__ = ("_dropped", "_events", "_waiter", "agent_ids")

    def __init__(
        self, agent_ids: frozenset[str], dropped: Counter, maxlen: int = WATCH_QUEUE_MAX
    ) -> None:
        self.agent_ids = agent_ids
        self._dropped = dropped
        self._events: collections.deque[management_pb2.AgentEvent] = collections.deque(
            maxlen=maxlen
        )
        self._waiter: asyncio.Future[None] | None = None

    def wants(self, agent_id: str) -> bool:
        return not self.agent_ids or agent_id in self.agent_ids

    def offer(self, event: management_pb2.AgentEvent) -> None:
        """Queue `event`; never waits. A full queue loses its oldest event (counted)."""
        if len(self._events) == self._events.maxlen:
            self._dropped.inc()
        self._events.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self) -> management_pb2.AgentEvent:
        while not self._events:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._events.popleft()


def create_watch_table(process: Process) -> Table[int, Watcher]:
    """Create the public watcher table, owned by `process` (the root supervisor)."""
    return process.new_table(WATCHERS_TABLE, "public")


def publish(
    runtime: LoopSystemBase, agent_id: str, session_id: str, event: Event, reason: str = ""
) -> None:
    """Offer one agent event to every watcher that wants it (module doc). Never waits."""
    table = runtime.table(WATCHERS_TABLE)
    if table is None:
        return
    try:
        if not len(table):
            return
        watchers = list(table.values())
    except TableGone:
        return
    built: management_pb2.AgentEvent | None = None
    for watcher in watchers:
        if watcher.wants(agent_id):
            if built is None:
                built = _event(agent_id, session_id, event, reason)
            watcher.offer(built)


def _event(agent_id: str, session_id: str, event: Event, reason: str) -> management_pb2.AgentEvent:
    occurred = common_pb2.Timestamp(millis_epoch=int(time.time() * 1000))
    if event is Event.CONNECTED:
        return management_pb2.AgentEvent(
            agent_id=agent_id,
            occurred_at=occurred,
            connected=management_pb2.AgentConnected(session_id=session_id),
        )
    return management_pb2.AgentEvent(
        agent_id=agent_id,
        occurred_at=occurred,
        disconnected=management_pb2.AgentDisconnected(reason=reason),
    )
