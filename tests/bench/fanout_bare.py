"""The ceiling of `tests.bench.fanout`: a bare grpclib relay with no actors.

    python -m tests.bench.fanout_bare [--port 0]

One plain grpclib server on one port serves both sides from plain coroutines:

- the agents' Register (answered here, accepted, no upstream call: registration is not what the
  benchmark measures) and Subscribe (the stream is held; the commands for its agent are written
  from one queue; every answer is handed to the operator call that waits for it);
- the operators' SendCommand: the command is put on each target's queue (every held agent when
  `agent_ids` is empty), and each answer is written back to the operator as it arrives until
  every target has answered with a final status.

It keeps no timeout, no duplicate check and no bound: the least a relay can do. Prints `bare
listening on 127.0.0.1:PORT` once it accepts connections; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2

AGENT = "/yuzu.agent.v1.AgentService/"
MGMT = "/yuzu.server.v1.ManagementService/"
SESSION_KEY = "x-yuzu-session-id"
_RUNNING = agent_pb2.CommandResponse.Status.RUNNING

Answer = tuple[str, agent_pb2.CommandResponse]


class BareRelay:
    def __init__(self) -> None:
        self.sessions: dict[str, str] = {}  # session id -> agent id
        self.outbound: dict[str, asyncio.Queue[agent_pb2.CommandRequest]] = {}  # agent id ->
        self.waiting: dict[tuple[str, str], asyncio.Queue[Answer]] = {}  # (agent, command) ->

    async def register(self, stream: Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        assert request is not None
        session_id = f"bare-{request.info.agent_id}"
        self.sessions[session_id] = request.info.agent_id
        await stream.send_message(agent_pb2.RegisterResponse(session_id=session_id, accepted=True))

    async def subscribe(self, stream: Stream[Any, Any]) -> None:
        session_id = str(stream.metadata.get(SESSION_KEY, "")) if stream.metadata else ""
        agent_id = self.sessions.get(session_id)
        if agent_id is None:
            raise GRPCError(Status.NOT_FOUND, "no registration")
        queue: asyncio.Queue[agent_pb2.CommandRequest] = asyncio.Queue()
        self.outbound[agent_id] = queue
        await stream.send_initial_metadata()
        reader = asyncio.ensure_future(self._answers(stream, agent_id))
        try:
            while True:
                await stream.send_message(await queue.get())
        finally:
            reader.cancel()
            self.outbound.pop(agent_id, None)

    async def _answers(self, stream: Stream[Any, Any], agent_id: str) -> None:
        async for response in stream:
            waiter = self.waiting.get((agent_id, response.command_id))
            if waiter is not None:
                waiter.put_nowait((agent_id, response))

    async def send_command(self, stream: Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        assert request is not None
        command = request.command
        answers: asyncio.Queue[Answer] = asyncio.Queue()
        targets = [a for a in (request.agent_ids or self.outbound) if a in self.outbound]
        for agent_id in targets:
            self.waiting[(agent_id, command.command_id)] = answers
            self.outbound[agent_id].put_nowait(command)
        owed = len(targets)
        try:
            while owed:
                agent_id, response = await answers.get()
                await stream.send_message(
                    management_pb2.SendCommandResponse(agent_id=agent_id, response=response)
                )
                if response.status != _RUNNING:
                    owed -= 1
                    self.waiting.pop((agent_id, command.command_id), None)
        finally:
            for agent_id in targets:
                self.waiting.pop((agent_id, command.command_id), None)

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
            MGMT + "SendCommand": Handler(
                self.send_command,
                Cardinality.UNARY_STREAM,
                management_pb2.SendCommandRequest,
                management_pb2.SendCommandResponse,
            ),
        }


async def _main(args: argparse.Namespace) -> None:
    server = Server([BareRelay()])
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.fanout_bare")
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
