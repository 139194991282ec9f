"""Flooding the cluster port cannot drop an established link (docs/cluster.md, "A flood
cannot drop a link"): the real transport (gateway/cluster/transport.py) on loopback, a link
established with the cookie, then more unauthenticated challenges than the node keeps
pending, and calls signed with a wrong cookie, from another connection. The link's next
signed call is still accepted. (The challenges used to share one bounded pool with the live
links, so the flood evicted the link's nonce and its next call was refused.)
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator

import pytest
from google.protobuf import empty_pb2
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from gateway.cluster.auth import MAX_SERVER_NONCES
from gateway.cluster.transport import ClusterServer, ClusterService, PeerLink
from gateway.config.cluster_seeds import PeerAddr

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

COOKIE = secrets.token_hex(32)
CALL_S = 5.0


@contextlib.asynccontextmanager
async def dialled() -> AsyncIterator[tuple[PeerAddr, list[int]]]:
    """A node's cluster server (Challenge and Ping need no plane), and its refusal count."""
    refused = [0]

    def on_refused() -> None:
        refused[0] += 1

    service = ClusterService(COOKIE, "yuzu_gw@dialled", None, on_refused)  # type: ignore[arg-type]
    server = ClusterServer(service)
    await server.start("127.0.0.1", 0)
    try:
        yield PeerAddr("127.0.0.1", server.bound_port(0)), refused
    finally:
        server.leave()
        await server.wait_closed()


def test_a_flood_of_challenges_and_bad_cookies_leaves_the_link_up() -> None:
    asyncio.run(_flood())


async def _flood() -> None:
    async with dialled() as (addr, refused):
        await _flood_against(addr, refused)


async def _flood_against(addr: PeerAddr, refused: list[int]) -> None:
    link = PeerLink(addr, COOKIE, "yuzu_gw@dialler")
    flood = PeerLink(addr, COOKIE, "yuzu_gw@flood")
    forger = PeerLink(addr, "w" * 64, "yuzu_gw@forger")
    try:
        assert await link.challenge(CALL_S) == "up"
        await link.unary("Ping", empty_pb2.Empty(), empty_pb2.Empty, CALL_S)
        # Challenges need no cookie: anyone can ask for more than the node keeps pending.
        for _ in range(MAX_SERVER_NONCES + 64):
            await flood.challenge(CALL_S)
        # A wrong cookie gets a challenge answered, but each of its calls is refused.
        assert await forger.challenge(CALL_S) == "refused"
        # Sign calls as a forger would, on a nonce it made up.
        forger._server_nonce = "0" * 32
        for _ in range(16):
            with pytest.raises(GRPCError) as raised:
                await forger.unary("Ping", empty_pb2.Empty(), empty_pb2.Empty, CALL_S)
            assert raised.value.status is Status.UNAUTHENTICATED
        assert refused[0] == 16
        # The established link is untouched.
        await link.unary("Ping", empty_pb2.Empty(), empty_pb2.Empty, CALL_S)
        assert refused[0] == 16
    finally:
        for peer in (link, flood, forger):
            peer.close()
