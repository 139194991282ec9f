"""One load-generator process of `tests.bench.heartbeats` (docs/dev/benchmarks.md).

    python -m tests.bench.heartbeats_loadgen --target 127.0.0.1:PORT --count K --first I
        [--tags 30] [--no-join]

Holds K grpcio agents, one channel (one HTTP/2 connection) each, as `tests.bench.agents_loadgen`
does. Without `--no-join` every agent first registers and subscribes (the gateway admits a
heartbeat only for a session it holds, on the connection that opened it); with it, the agents
use made-up session ids of the same shape (the bare server admits anything). It speaks on
stdin/stdout, one line per message:

- prints `ready OK FAILED` once its channels exist and (unless `--no-join`) every agent has
  joined or failed;
- on `run WARMUP WINDOW` (seconds): every ready agent sends Heartbeats with `--tags` status tags
  back to back on its own channel, the next as soon as the previous is answered (as fast as they
  are admitted), for WARMUP + WINDOW seconds; prints `heartbeats OK FAILED`, counting the calls
  answered inside the WINDOW only;
- on `stop` or end of input: closes every channel and exits.

The request is encoded once per agent and sent as bytes, so the generator spends its CPU on the
transport, not on protobuf; every agent sends the same message each time.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import grpc
import grpc.aio

from protos.yuzu.agent.v1 import agent_pb2
from tests.bench.agents_loadgen import SERVICE, Agent

HEARTBEAT_DEADLINE_S = 10.0
DEFAULT_TAGS = 30
# A stock agent's tag: a plugin-scoped key and a short value (seed, "Heartbeat buffer bounds":
# keys of at most 32 characters after the plugin prefix, values of at most 64 bytes).
TAG_VALUE = "ok; last run 2024-01-01T00:00:00Z"


def heartbeat_request(session_id: str, tags: int) -> agent_pb2.HeartbeatRequest:
    """The benchmark's heartbeat: `tags` status tags, a sent time, no snapshot."""
    request = agent_pb2.HeartbeatRequest(session_id=session_id)
    request.sent_at.millis_epoch = int(time.time() * 1000)
    for index in range(tags):
        request.status_tags[f"yuzu.plugin.bench{index:02d}.status"] = TAG_VALUE
    return request


def made_up_session_id(index: int) -> str:
    """A session id of the server's shape (gw-session- and 32 hex), for agents that never join."""
    return f"gw-session-{index:032x}"


def _identity(data: bytes) -> bytes:
    return data


async def _blast(
    agent: Agent, payload: bytes, start: float, warmup: float, window: float
) -> tuple[int, int]:
    """Heartbeats back to back until `start + warmup + window`; those answered inside the window
    are counted (acknowledged, failed)."""
    call = agent.channel.unary_unary(
        SERVICE + "Heartbeat",
        request_serializer=_identity,
        response_deserializer=agent_pb2.HeartbeatResponse.FromString,
    )
    loop = asyncio.get_running_loop()
    counted_from, end = start + warmup, start + warmup + window
    ok = failed = 0
    while loop.time() < end:
        try:
            reply = await call(payload, timeout=HEARTBEAT_DEADLINE_S)
        except grpc.aio.AioRpcError as exc:
            accepted = False
            if failed == 0:
                print(f"heartbeat failed: {exc.code().name} {exc.details()}", file=sys.stderr)
        else:
            accepted = reply.acknowledged
        done = loop.time()
        if counted_from <= done <= end:
            if accepted:
                ok += 1
            else:
                failed += 1
        if not accepted:
            await asyncio.sleep(0.01)  # a refusal is fast: do not spin on it
    return ok, failed


async def _run(agents: list[Agent], payloads: list[bytes], warmup: float, window: float) -> str:
    start = asyncio.get_running_loop().time()
    counts = await asyncio.gather(
        *(
            _blast(agent, payload, start, warmup, window)
            for agent, payload in zip(agents, payloads, strict=True)
        )
    )
    return f"heartbeats {sum(c[0] for c in counts)} {sum(c[1] for c in counts)}"


async def _main(args: argparse.Namespace) -> None:
    agents = [
        Agent(args.target, f"bench-agent-{args.first + i:06d}", args.register_bytes)
        for i in range(args.count)
    ]
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        if args.no_join:
            ready = agents
            for i, agent in enumerate(agents):
                agent.session_id = made_up_session_id(args.first + i)
        else:
            joined = await asyncio.gather(*(agent.join() for agent in agents))
            ready = [agent for agent, ok in zip(agents, joined, strict=True) if ok]
        payloads = [
            heartbeat_request(agent.session_id, args.tags).SerializeToString() for agent in ready
        ]
        print(f"ready {len(ready)} {len(agents) - len(ready)}", flush=True)
        while line := (await reader.readline()).decode().strip():
            if line.startswith("run "):
                _, warmup, window = line.split()
                print(await _run(ready, payloads, float(warmup), float(window)), flush=True)
            elif line == "stop":
                break
    finally:
        await asyncio.gather(*(agent.close() for agent in agents), return_exceptions=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.heartbeats_loadgen")
    parser.add_argument("--target", required=True, help="host:port of the agent listener")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--first", type=int, default=0, help="index of the first agent id")
    parser.add_argument("--tags", type=int, default=DEFAULT_TAGS)
    parser.add_argument("--register-bytes", type=int, default=1024)
    parser.add_argument(
        "--no-join", action="store_true", help="no Register/Subscribe (the bare server)"
    )
    asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
