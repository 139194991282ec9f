"""The management plane's reach to the other nodes (ListAgents, GetAgent, WatchEvents). A peer
that does not answer within `PEER_CALL_TIMEOUT_S` is left out of the answer, and named as such
(its link is not judged here: the membership probe does that).

The links are the cluster's (gateway/cluster/transport.py `PeerLink`, read from the
`cluster_links` table); this module needs only the two calls of `PeerCalls`, so the cluster,
which serves its peers' management calls with this plane's handlers, sits above it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from google.protobuf.message import Message

from actors.cluster.api import connected_links
from gateway.config.cluster_seeds import PeerAddr
from protos.yuzu.server.v1 import management_pb2 as mgmt

if TYPE_CHECKING:
    from actors.agents.watch import Watcher
    from supervisors.runtime import LoopSystemBase

__all__ = [
    "PEER_CALL_TIMEOUT_S",
    "PeerCalls",
    "merge_pages",
    "peer_agent",
    "peer_pages",
    "relay_watch",
]

log = logging.getLogger("yuzu_gw.cluster")

# A peer's answer to a read (a page, an agent, its ids) is awaited this long at most.
PEER_CALL_TIMEOUT_S = 5.0
# How often an open WatchEvents looks for peers that joined since it opened.
WATCH_PEER_CHECK_S = 1.0

M = TypeVar("M", bound=Message)


class PeerCalls(Protocol):
    """What this module asks of a link to a peer (module doc)."""

    addr: PeerAddr

    async def unary(self, method: str, request: Message, reply: type[M], timeout: float) -> M: ...

    def stream(
        self, method: str, request: Message, reply: type[M], timeout: float | None
    ) -> AsyncIterator[M]: ...


async def _ask_all(
    links: Sequence[PeerCalls], method: str, request: Message, reply: type[M]
) -> tuple[list[M], list[PeerAddr]]:
    """The answers, in the order of `links`, and the peers that gave none."""

    async def one(link: PeerCalls) -> M | None:
        try:
            return await link.unary(method, request, reply, PEER_CALL_TIMEOUT_S)
        except Exception as exc:
            log.debug("cluster %s to %s failed: %s", method, link.addr, type(exc).__name__)
            return None

    answers = await asyncio.gather(*(one(link) for link in links))
    missing = [link.addr for link, answer in zip(links, answers, strict=True) if answer is None]
    return [a for a in answers if a is not None], missing


async def peer_pages(
    links: Sequence[PeerCalls], request: mgmt.ListAgentsRequest
) -> tuple[list[mgmt.ListAgentsResponse], list[PeerAddr]]:
    return await _ask_all(links, "ListAgents", request, mgmt.ListAgentsResponse)


def merge_pages(pages: Sequence[mgmt.ListAgentsResponse], limit: int) -> mgmt.ListAgentsResponse:
    """One page of the cluster from every node's page after the same cursor: the `limit`
    smallest ids (an agent two nodes hold listed once), and a cursor when any node has more."""
    by_id: dict[str, mgmt.AgentSummary] = {}
    for page in pages:
        for summary in page.agents:
            by_id.setdefault(summary.agent_id, summary)
    ordered = sorted(by_id)
    more = len(ordered) > limit or any(page.next_cursor for page in pages)
    chosen = ordered[:limit]
    answer = mgmt.ListAgentsResponse(next_cursor=chosen[-1] if more and chosen else "")
    answer.agents.extend(by_id[agent_id] for agent_id in chosen)
    return answer


async def peer_agent(
    links: Sequence[PeerCalls], request: mgmt.GetAgentRequest
) -> mgmt.GetAgentResponse | None:
    """The first answer in the order of `links` (the directory's, newest holder first)."""
    found, _ = await _ask_all(links, "GetAgent", request, mgmt.GetAgentResponse)
    return found[0] if found else None


async def _relay_one(link: PeerCalls, request: mgmt.WatchEventsRequest, watcher: Watcher) -> None:
    with contextlib.suppress(Exception):
        async for event in link.stream("WatchEvents", request, mgmt.AgentEvent, None):
            watcher.offer(event)


async def relay_watch(
    runtime: LoopSystemBase, request: mgmt.WatchEventsRequest, watcher: Watcher
) -> None:
    """Feed `watcher` the events of every connected peer's agents, for as long as it runs
    (cancelled with its stream); a peer whose watch ended is watched again once it is back."""
    tasks: dict[object, asyncio.Task[None]] = {}
    try:
        while True:
            for link in connected_links(runtime):
                task = tasks.get(link)
                if task is None or task.done():
                    tasks[link] = asyncio.create_task(_relay_one(link, request, watcher))
            await asyncio.sleep(WATCH_PEER_CHECK_S)
    finally:
        for task in tasks.values():
            task.cancel()
