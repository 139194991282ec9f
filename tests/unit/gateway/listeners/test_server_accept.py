"""The listener's accept loop (gateway/listeners/server.py, issue 19): one wake takes what the
kernel has queued, far past `acceptors` connections, and `max_connections` still stops it until
a slot frees. Raw TCP clients on loopback, no HTTP/2: a connection holds its slot from the
accept, whether or not it ever sends its preface. On uvloop, as the node runs (`python -m
gateway`): its `sock_accept` waits for a readiness event each time, where asyncio's accepts at
once what is queued."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable

import uvloop
from prometheus_client import CollectorRegistry

from gateway.config.listener_spec import parse_listeners
from gateway.config.terms import parse_term
from gateway.listeners.metrics import ListenerMetrics
from gateway.listeners.protocol import ListenerProtocol
from gateway.listeners.server import ACCEPTS_PER_ACCEPTOR, ListenerServer

QUEUED = 40
TIMEOUT_S = 10.0


def listener(extra: str) -> ListenerServer:
    [spec] = parse_listeners(
        parse_term(
            "[#{name => agent, service_protos => [agent_pb],"
            " services => #{'yuzu.agent.v1.AgentService' => yuzu_gw_agent_service},"
            f" listen => #{{port => 0, ip => {{127,0,0,1}}}}{extra}}}]."
        )
    )
    return ListenerServer(spec, [], ListenerMetrics(CollectorRegistry()))


@contextlib.asynccontextmanager
async def serving(server: ListenerServer) -> AsyncIterator[asyncio.Task[None]]:
    if not server.accepting:
        server.bind()
    task = asyncio.get_running_loop().create_task(server.serve())
    try:
        yield task
    finally:
        server.close()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def dial(server: ListenerServer, count: int) -> list[socket.socket]:
    """`count` connections the kernel completes at once (the handshake needs no accept)."""
    assert server.address is not None
    return [socket.create_connection(server.address) for _ in range(count)]


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not condition():
            await asyncio.sleep(0.01)


def test_one_wake_takes_every_queued_connection_past_acceptors() -> None:
    async def body() -> None:
        # One acceptor takes ACCEPTS_PER_ACCEPTOR a wake; 32 a wake (the old loop's default)
        # left a storm's SYNs overflowing the kernel's queue.
        assert QUEUED < ACCEPTS_PER_ACCEPTOR
        server = listener(", acceptors => 1")
        server.bind()
        clients = dial(server, QUEUED)
        try:
            async with serving(server):
                # The first turns of the loop: serve() watches the socket, then one readiness
                # callback accepts. A loop taking `acceptors` a wake would hold 1 or 2 here.
                for _ in range(3):
                    await asyncio.sleep(0)
                assert server.connections == QUEUED
        finally:
            for client in clients:
                client.close()

    uvloop.run(body())


def test_the_ceiling_stops_accepting_and_a_freed_slot_resumes_it() -> None:
    async def body() -> None:
        server = listener(", limits => #{max_connections => 3}")
        server.bind()
        clients = dial(server, 5)
        try:
            async with serving(server):
                await until(lambda: len(server.live()) == 3)
                for _ in range(10):
                    await asyncio.sleep(0)
                assert server.connections == 3  # the other two wait in the kernel's backlog
                # Closing one established connection frees its slot: the next is accepted.
                accepted = {protocol.info.key for protocol in server.live()}
                clients[0].close()
                await until(lambda: {p.info.key for p in server.live()} - accepted != set())
                assert server.connections == 3
        finally:
            for client in clients:
                client.close()

    uvloop.run(body())


def test_suspend_then_serve_again_accepts_on_the_same_port() -> None:
    async def body() -> None:
        server = listener("")
        async with serving(server) as first:
            await asyncio.sleep(0)  # serve() runs
            port = server.address
            server.suspend()
            with contextlib.suppress(asyncio.CancelledError):
                await first
            assert server.bind() == port
            again = asyncio.get_running_loop().create_task(server.serve())
            clients = dial(server, 2)
            try:
                await until(lambda: server.connections == 2)
            finally:
                for client in clients:
                    client.close()
                again.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await again

    uvloop.run(body())


def test_a_setup_cancelled_in_the_turn_that_made_its_protocol_frees_the_slot() -> None:
    async def body() -> None:
        server = listener("")
        server.bind()
        made = server._made
        protocols: list[ListenerProtocol] = []

        def then_cancelled(protocol: ListenerProtocol) -> None:
            # What a time-out firing in the same turn of a storm-slowed loop does: uvloop
            # then closes the handle without calling connection_lost.
            made(protocol)
            protocols.append(protocol)
            for setup in server._setups:
                setup.cancel()

        server._made = then_cancelled  # type: ignore[method-assign]
        clients = dial(server, 2)
        try:
            async with serving(server):
                await until(lambda: len(protocols) == 2 and not server._setups)
                await until(lambda: server.connections == 0)
                assert server.live() == []
        finally:
            for client in clients:
                client.close()

    uvloop.run(body())
