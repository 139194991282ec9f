"""ListAgents and GetAgent: the agents this node holds, read from the registry's tables
(actors/registry/api.py) without a message.

- **ListAgents** pages through the held agents in bytewise order of their ids. `limit` 1..1000
  is the page size; anything else (0, negative, over 1000) is 100. `cursor` is the last agent id
  of the previous page ("" for the first): the page holds the ids strictly after it, and
  `next_cursor` is the page's last id when more follow, "" when this is the last page. An agent
  that connects or leaves between pages shows up or not according to where its id sorts: a
  cursor names a position, not a snapshot. `filter` is ignored (every held agent is listed):
  selecting agents is the server's, which knows far more about them than this gateway does.
- **GetAgent**: the agent's summary and its plugins (as its Register described them), or
  NOT_FOUND when this node does not hold it.

In a cluster both cover every node (docs/cluster.md): ListAgents merges each node's page after
the same cursor (an agent two nodes hold is listed once); GetAgent asks the nodes the agent
directory says hold the agent, newest first, and no other. `local=True` is a peer's own call,
answered from this node's agents only.

**A node that could not be reached is never hidden.** ListAgents without a peer's page (it did
not answer in time, or its link is down) still answers what it has, names the missing nodes in
the trailing metadata `x-yuzu-unreachable-nodes` (comma-separated cluster addresses) and in the
status message, and never claims the listing complete: `next_cursor` is the page's last id (the
request's cursor when the page is empty), so a client that pages on reads again; an empty first
page with a node missing is UNAVAILABLE, naming them, with a retry hint. GetAgent of an agent
known only on an unreachable node is UNAVAILABLE naming it, not NOT_FOUND.

Both answer UNAVAILABLE, with a retry hint, while the registry is not running (its tables are gone
with it).

A summary says `online` (every agent held here has an open stream) and `last_seen` = the time of
the answer for the same reason; hostname, platform and version are the Register's.

Bytewise order: agent ids are protobuf strings, always valid UTF-8, and UTF-8 sorts bytewise in
the order of its code points, which is how Python compares `str`; so no encoding is needed.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable
from typing import cast

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from actors.cluster.api import connected_links, directory_of
from actors.registry.api import AGENTS_BY_ID, AgentRow, agent_session, held_agent_ids
from gateway.listeners.retry_hint import HintedRefusal, RefusalKind
from gateway.mgmt.plane import MgmtPlane, receive
from gateway.mgmt.remote import PeerCalls, merge_pages, peer_agent, peer_pages
from protos.yuzu.common.v1 import common_pb2
from protos.yuzu.server.v1 import management_pb2
from supervisors.runtime import LoopSystemBase

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "MAX_LIST_LIMIT",
    "get_agent",
    "list_agents",
    "page",
    "page_limit",
]

# Issue 6: ListAgents pages hold 1..1000 agents, 100 when the request asks for anything else.
DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 1000
REGISTRY_UNAVAILABLE_DETAILS = "agent registry unavailable"
NOT_HELD_DETAILS = "agent not held by this gateway"
UNREACHABLE_KEY = "x-yuzu-unreachable-nodes"


def page_limit(requested: int) -> int:
    return requested if 1 <= requested <= MAX_LIST_LIMIT else DEFAULT_LIST_LIMIT


def page(agent_ids: Iterable[str], cursor: str, limit: int) -> tuple[list[str], str]:
    """The ids of one page after `cursor`, in order, and the next cursor ("" at the end)."""
    chosen = heapq.nsmallest(limit + 1, (a for a in agent_ids if a > cursor))
    if len(chosen) > limit:
        return chosen[:limit], chosen[limit - 1]
    return chosen, ""


def _summary(row: AgentRow, now_ms: int) -> management_pb2.AgentSummary:
    summary = management_pb2.AgentSummary(
        agent_id=row.agent_id,
        online=True,
        last_seen=common_pb2.Timestamp(millis_epoch=now_ms),
    )
    info = row.info
    if info is not None:
        summary.hostname = info.hostname
        summary.agent_version = info.agent_version
        summary.platform.CopyFrom(info.platform)
    return summary


def _links(runtime: LoopSystemBase) -> list[PeerCalls]:
    return cast(list[PeerCalls], connected_links(runtime))


async def list_agents(
    plane: MgmtPlane,
    stream: Stream[management_pb2.ListAgentsRequest, management_pb2.ListAgentsResponse],
    *,
    local: bool = False,
) -> None:
    request = await receive(stream)
    runtime = plane.runtime
    ids = held_agent_ids(runtime)
    if ids is None:
        raise HintedRefusal(RefusalKind.RESTARTING, REGISTRY_UNAVAILABLE_DETAILS)
    limit = page_limit(request.limit)
    chosen, next_cursor = page(ids, request.cursor, limit)
    now_ms = int(time.time() * 1000)
    answer = management_pb2.ListAgentsResponse(next_cursor=next_cursor)
    for agent_id in chosen:
        row = agent_session(runtime, agent_id)
        if row is not None:
            answer.agents.append(_summary(row, now_ms))
    links = [] if local else _links(runtime)
    directory = None if local else directory_of(runtime)
    missing = [str(p) for p in directory.unreachable_peers()] if directory is not None else []
    if links:
        pages, failed = await peer_pages(links, request)
        answer = merge_pages([answer, *pages], limit)
        missing += [str(p) for p in failed]
    if not missing:
        await stream.send_message(answer)
        return
    named = ",".join(sorted(set(missing)))
    if not answer.next_cursor:
        answer.next_cursor = answer.agents[-1].agent_id if answer.agents else request.cursor
    if not answer.next_cursor:
        raise HintedRefusal(RefusalKind.RESTARTING, f"gateway node(s) unreachable: {named}")
    await stream.send_message(answer)
    await stream.send_trailing_metadata(
        status_message=f"gateway node(s) unreachable: {named}", metadata={UNREACHABLE_KEY: named}
    )


async def get_agent(
    plane: MgmtPlane,
    stream: Stream[management_pb2.GetAgentRequest, management_pb2.GetAgentResponse],
    *,
    local: bool = False,
) -> None:
    request = await receive(stream)
    runtime = plane.runtime
    if runtime.table(AGENTS_BY_ID) is None:
        raise HintedRefusal(RefusalKind.RESTARTING, REGISTRY_UNAVAILABLE_DETAILS)
    row = agent_session(runtime, request.agent_id)
    if row is None:
        directory = None if local else directory_of(runtime)
        if directory is None:
            raise GRPCError(Status.NOT_FOUND, NOT_HELD_DETAILS)
        by_addr = {link.addr: link for link in _links(runtime)}
        holders = [by_addr[p] for p in directory.candidates(request.agent_id) if p in by_addr]
        found = await peer_agent(holders, request) if holders else None
        if found is None:
            lost = directory.unreachable_holder(request.agent_id)
            if lost is not None:
                raise HintedRefusal(RefusalKind.RESTARTING, f"gateway node {lost} unreachable")
            raise GRPCError(Status.NOT_FOUND, NOT_HELD_DETAILS)
        await stream.send_message(found)
        return
    answer = management_pb2.GetAgentResponse(summary=_summary(row, int(time.time() * 1000)))
    if row.info is not None:
        answer.plugins.extend(row.info.plugins)
    else:
        answer.plugins.extend(common_pb2.PluginInfo(name=name) for name in row.plugins)
    await stream.send_message(answer)
