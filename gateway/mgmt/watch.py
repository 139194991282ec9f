"""WatchEvents: the handler of one operator's watch (the events and the watcher rules are in
actors/agents/watch.py).

The watcher is registered before the response headers go out, so an operator that has read them
misses no later event; the stream then runs until the operator ends it or its connection closes.
No watcher table (a tree without the root supervisor) is UNAVAILABLE. In a cluster the watcher
also gets the events of every connected peer's agents (gateway/mgmt/remote.py `relay_watch`;
`local=True` is a peer's own watch, of this node's agents only).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from actors.agents.watch import WATCHERS_TABLE, Watcher
from gateway.mgmt.plane import MgmtPlane, receive
from gateway.mgmt.remote import relay_watch
from protos.yuzu.server.v1 import management_pb2
from supervisors.errors import TableGone

__all__ = ["WATCH_UNAVAILABLE_DETAILS", "watch_events"]

WATCH_UNAVAILABLE_DETAILS = "agent events unavailable"

_keys = itertools.count(1)
WatchStream = Stream[management_pb2.WatchEventsRequest, management_pb2.AgentEvent]


async def watch_events(plane: MgmtPlane, stream: WatchStream, *, local: bool = False) -> None:
    request = await receive(stream)
    table = plane.runtime.table(WATCHERS_TABLE)
    if table is None:
        raise GRPCError(Status.UNAVAILABLE, WATCH_UNAVAILABLE_DETAILS)
    watcher = Watcher(frozenset(request.agent_ids), plane.metrics.watch_dropped)
    key = next(_keys)
    table.insert(key, watcher)
    plane.metrics.watchers.inc()
    relay = None if local else asyncio.create_task(relay_watch(plane.runtime, request, watcher))
    try:
        await stream.send_initial_metadata()
        while True:
            await stream.send_message(await watcher.next())
    finally:
        if relay is not None:
            relay.cancel()
        plane.metrics.watchers.dec()
        with contextlib.suppress(TableGone):
            table.delete(key)
