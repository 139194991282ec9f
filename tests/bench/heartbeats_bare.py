"""The ceiling of `tests.bench.heartbeats`: a bare grpclib server with no actors.

    python -m tests.bench.heartbeats_bare [--port 0]

It serves only the agent service's Heartbeat, from a plain coroutine: it reads the request and
answers at once (acknowledged, the server time), as the gateway answers an admitted heartbeat,
with no admission, no buffer and no upstream call. It runs on the node's event loop (uvloop
where it installs), so the two servers differ only in the gateway's own work.

Prints `bare listening on 127.0.0.1:PORT` once it accepts connections; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from typing import Any

from grpclib.const import Cardinality, Handler
from grpclib.server import Server, Stream

from protos.yuzu.agent.v1 import agent_pb2

HEARTBEAT = "/yuzu.agent.v1.AgentService/Heartbeat"


class BareHeartbeat:
    async def heartbeat(self, stream: Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        assert request is not None
        response = agent_pb2.HeartbeatResponse(acknowledged=True)
        response.server_time.millis_epoch = int(time.time() * 1000)
        await stream.send_message(response)

    def __mapping__(self) -> dict[str, Handler]:
        return {
            HEARTBEAT: Handler(
                self.heartbeat,
                Cardinality.UNARY_UNARY,
                agent_pb2.HeartbeatRequest,
                agent_pb2.HeartbeatResponse,
            )
        }


async def _main(args: argparse.Namespace) -> None:
    server = Server([BareHeartbeat()])
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
        await server.wait_closed()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.heartbeats_bare")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        import uvloop  # as the node runs (gateway/__main__.py)
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(_main(args))
    else:
        uvloop.run(_main(args))


if __name__ == "__main__":
    main()
