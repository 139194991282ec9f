"""One load-generator process of `tests.bench.fanout`: agents that answer every command at once.

    python -m tests.bench.fanout_loadgen --target 127.0.0.1:PORT --count K --first I

Holds K grpcio agents (`tests.bench.agents_loadgen.Agent`: one channel, one HTTP/2 connection
each, ids `bench-agent-<first + i>`). It speaks on stdin/stdout, one line per message:

- prints `ready` once its channels exist;
- on `go`: every agent registers and subscribes, all at once; prints `subscribed OK FAILED
  SECONDS`. From then on each subscribed agent answers every CommandRequest on its stream with one
  CommandResponse (SUCCESS, the command's id) as soon as it reads it;
- on `stop` or end of input: prints `answered N` (the commands answered) and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time

import grpc
import grpc.aio

from protos.yuzu.agent.v1 import agent_pb2
from tests.bench.agents_loadgen import Agent

_SUCCESS = agent_pb2.CommandResponse.Status.SUCCESS


async def answer(agent: Agent) -> int:
    """Answer every command on the agent's stream at once; the number answered."""
    stream = agent.stream
    assert stream is not None
    answered = 0
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
        while (request := await stream.read()) is not grpc.aio.EOF:
            await stream.write(
                agent_pb2.CommandResponse(command_id=request.command_id, status=_SUCCESS)
            )
            answered += 1
    return answered


async def _main(args: argparse.Namespace) -> None:
    agents = [
        Agent(args.target, f"bench-agent-{args.first + i:06d}", args.register_bytes)
        for i in range(args.count)
    ]
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    answering: list[asyncio.Task[int]] = []
    print("ready", flush=True)
    try:
        while line := (await reader.readline()).decode().strip():
            if line == "go":
                started = time.perf_counter()
                joined = await asyncio.gather(*(agent.join() for agent in agents))
                elapsed = time.perf_counter() - started
                ok = sum(joined)
                answering = [
                    loop.create_task(answer(agent)) for agent in agents if agent.subscribed
                ]
                print(f"subscribed {ok} {len(agents) - ok} {elapsed:.3f}", flush=True)
            elif line == "stop":
                break
    finally:
        for task in answering:
            task.cancel()
        counts = await asyncio.gather(*answering, return_exceptions=True)
        print(f"answered {sum(c for c in counts if isinstance(c, int))}", flush=True)
        await asyncio.gather(*(agent.close() for agent in agents), return_exceptions=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.fanout_loadgen")
    parser.add_argument("--target", required=True, help="host:port of the agent listener")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--first", type=int, default=0, help="index of the first agent id")
    parser.add_argument("--register-bytes", type=int, default=512)
    asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
