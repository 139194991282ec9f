"""The ceiling of `tests.bench.agents`: a bare grpclib server with no actors.

    python -m tests.bench.agents_bare --upstream 127.0.0.1:PORT [--port 0]

It serves the agent service's Register and Subscribe from plain coroutines and makes the same
two upstream calls per agent as the gateway, on one plain grpclib Channel:

- Register: ProxyRegister upstream, the answer relayed; the session id is remembered;
- Subscribe: NotifyStreamStatus (CONNECTED) upstream, then the response headers, then the
  stream is held until the agent goes away.

Prints `bare listening on 127.0.0.1:PORT` once it accepts connections; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from grpclib.client import Channel, UnaryUnaryMethod
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2

AGENT = "/yuzu.agent.v1.AgentService/"
UPSTREAM = "/yuzu.gateway.v1.GatewayUpstream/"
SESSION_KEY = "x-yuzu-session-id"
# The agents' own deadline (agents_loadgen.DEADLINE_S): at 10,000 agents at once a 10 s upstream
# deadline failed most of the bare wave, so the ceiling measured failures, not the work.
UPSTREAM_TIMEOUT_S = 60.0


class BareAgentService:
    def __init__(self, channel: Channel) -> None:
        self.proxy_register = UnaryUnaryMethod(
            channel,
            UPSTREAM + "ProxyRegister",
            agent_pb2.RegisterRequest,
            agent_pb2.RegisterResponse,
        )
        self.notify = UnaryUnaryMethod(
            channel,
            UPSTREAM + "NotifyStreamStatus",
            gateway_pb2.StreamStatusNotification,
            gateway_pb2.StreamStatusAck,
        )
        self.pending: dict[str, str] = {}  # session id -> agent id, until it subscribes
        self.held = 0

    async def register(self, stream: Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        assert request is not None
        reply = await self.proxy_register(request, timeout=UPSTREAM_TIMEOUT_S)
        if reply.accepted and reply.session_id:
            self.pending[reply.session_id] = request.info.agent_id
        await stream.send_message(reply)

    async def subscribe(self, stream: Stream[Any, Any]) -> None:
        session_id = str(stream.metadata.get(SESSION_KEY, "")) if stream.metadata else ""
        agent_id = self.pending.pop(session_id, None)
        if agent_id is None:
            raise GRPCError(Status.NOT_FOUND, "no pending registration")
        peer = stream.peer.addr()
        await self.notify(
            gateway_pb2.StreamStatusNotification(
                agent_id=agent_id,
                session_id=session_id,
                event=gateway_pb2.StreamStatusNotification.CONNECTED,
                peer_addr=peer[0] if peer else "unknown",
                gateway_node="bare",
            ),
            timeout=UPSTREAM_TIMEOUT_S,
        )
        await stream.send_initial_metadata()
        self.held += 1
        try:
            async for _ in stream:
                pass
        finally:
            self.held -= 1

    def __mapping__(self) -> dict[str, Handler]:
        return {
            AGENT + "Register": Handler(
                self.register,
                Cardinality.UNARY_UNARY,
                agent_pb2.RegisterRequest,
                agent_pb2.RegisterResponse,
            ),
            AGENT + "Subscribe": Handler(
                self.subscribe,
                Cardinality.STREAM_STREAM,
                agent_pb2.CommandResponse,
                agent_pb2.CommandRequest,
            ),
        }


async def _main(args: argparse.Namespace) -> None:
    host, _, port = args.upstream.rpartition(":")
    channel = Channel(host, int(port))
    server = Server([BareAgentService(channel)])
    await server.start("127.0.0.1", args.port, backlog=4096)
    sockets = server._server.sockets if server._server is not None else ()
    bound = sockets[0].getsockname()[1] if sockets else args.port
    print(f"bare listening on 127.0.0.1:{bound}", flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await stopping.wait()
    finally:
        server.close()
        channel.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.agents_bare")
    parser.add_argument("--upstream", required=True, help="host:port of the fake server")
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
