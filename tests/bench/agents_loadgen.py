"""One load-generator process of `tests.bench.agents` (docs/benchmarks.md).

    python -m tests.bench.agents_loadgen --target 127.0.0.1:PORT --count K --first I

Holds K grpcio agents, one channel (one HTTP/2 connection) each. It speaks on stdin/stdout, one
line per message, so the benchmark can start every generator's wave at the same moment:

- prints `ready` once its channels exist;
- on `go`: every agent registers (a RegisterRequest of about `--register-bytes`) and subscribes
  with `x-yuzu-session-id`, all at once; prints `subscribed OK FAILED SECONDS` when every agent
  has its Subscribe response headers (or has failed). The streams stay open;
- on `heartbeat WINDOW INTERVAL` (seconds): every subscribed agent sends one Heartbeat every
  INTERVAL on its own channel (the gateway admits a heartbeat only on the connection that opened
  the session), the agents' first heartbeats spread evenly over the first INTERVAL, until WINDOW
  has passed; prints `heartbeats OK FAILED`;
- on `stop` or end of input: closes every channel and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import grpc
import grpc.aio

from protos.yuzu.agent.v1 import agent_pb2

SERVICE = "/yuzu.agent.v1.AgentService/"
SESSION_KEY = "x-yuzu-session-id"
DEADLINE_S = 60.0
HEARTBEAT_DEADLINE_S = 10.0


def register_request(agent_id: str, size: int) -> agent_pb2.RegisterRequest:
    """A RegisterRequest of about `size` bytes serialized: padded with scopable_tags."""
    request = agent_pb2.RegisterRequest()
    request.info.agent_id = agent_id
    request.info.hostname = f"{agent_id}.bench.invalid"
    request.info.agent_version = "1.0.0-bench"
    request.info.plugins.add(name="os")
    tag = 0
    while request.ByteSize() < size:
        missing = size - request.ByteSize()
        # each entry costs about len(value) + 16 bytes of key and framing
        request.info.scopable_tags[f"bench.tag.{tag:03d}"] = "v" * max(1, min(120, missing - 16))
        tag += 1
    return request


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


class Agent:
    def __init__(self, target: str, agent_id: str, register_bytes: int) -> None:
        self.channel = grpc.aio.insecure_channel(
            target, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self.request = register_request(agent_id, register_bytes)
        self.stream: grpc.aio.StreamStreamCall | None = None
        self.session_id = ""
        self.subscribed = False

    async def join(self) -> bool:
        register = self.channel.unary_unary(
            SERVICE + "Register",
            request_serializer=_serialize,
            response_deserializer=agent_pb2.RegisterResponse.FromString,
        )
        try:
            reply = await register(self.request, timeout=DEADLINE_S)
        except grpc.aio.AioRpcError as exc:
            print(f"register failed: {exc.code().name} {exc.details()}", file=sys.stderr)
            return False
        if not reply.accepted or not reply.session_id:
            print(f"register refused: {reply.reject_reason}", file=sys.stderr)
            return False
        subscribe = self.channel.stream_stream(
            SERVICE + "Subscribe",
            request_serializer=_serialize,
            response_deserializer=agent_pb2.CommandRequest.FromString,
        )
        self.session_id = reply.session_id
        self.stream = subscribe(metadata=((SESSION_KEY, reply.session_id),))
        await self.stream.initial_metadata()
        if self.stream.done():  # a trailers-only answer: the Subscribe was refused
            code = await self.stream.code()
            print(f"subscribe failed: {code.name}", file=sys.stderr)
            return False
        self.subscribed = True
        return True

    async def heartbeats(
        self, start: float, offset: float, window: float, interval: float
    ) -> tuple[int, int]:
        """One Heartbeat every `interval` from `start + offset` until `start + window` (loop
        time); the counts of acknowledged and failed heartbeats."""
        heartbeat = self.channel.unary_unary(
            SERVICE + "Heartbeat",
            request_serializer=_serialize,
            response_deserializer=agent_pb2.HeartbeatResponse.FromString,
        )
        loop = asyncio.get_running_loop()
        ok = failed = 0
        due = start + offset
        while due < start + window:
            await asyncio.sleep(max(0.0, due - loop.time()))
            request = agent_pb2.HeartbeatRequest(session_id=self.session_id)
            request.sent_at.millis_epoch = int(time.time() * 1000)
            try:
                reply = await heartbeat(request, timeout=HEARTBEAT_DEADLINE_S)
            except grpc.aio.AioRpcError as exc:
                failed += 1
                if failed == 1:
                    print(f"heartbeat failed: {exc.code().name} {exc.details()}", file=sys.stderr)
            else:
                if reply.acknowledged:
                    ok += 1
                else:
                    failed += 1
            due += interval
        return ok, failed

    async def close(self) -> None:
        if self.stream is not None:
            self.stream.cancel()
        await self.channel.close()


async def _heartbeats(agents: list[Agent], window: float, interval: float) -> str:
    joined = [agent for agent in agents if agent.subscribed]
    start = asyncio.get_running_loop().time()
    step = interval / max(1, len(joined))
    counts = await asyncio.gather(
        *(agent.heartbeats(start, i * step, window, interval) for i, agent in enumerate(joined))
    )
    ok = sum(c[0] for c in counts)
    failed = sum(c[1] for c in counts)
    return f"heartbeats {ok} {failed}"


async def _main(args: argparse.Namespace) -> None:
    agents = [
        Agent(args.target, f"bench-agent-{args.first + i:06d}", args.register_bytes)
        for i in range(args.count)
    ]
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("ready", flush=True)
    try:
        while line := (await reader.readline()).decode().strip():
            if line == "go":
                started = time.perf_counter()
                joined = await asyncio.gather(*(agent.join() for agent in agents))
                elapsed = time.perf_counter() - started
                ok = sum(joined)
                print(f"subscribed {ok} {len(agents) - ok} {elapsed:.3f}", flush=True)
            elif line.startswith("heartbeat "):
                _, window, interval = line.split()
                print(await _heartbeats(agents, float(window), float(interval)), flush=True)
            elif line == "stop":
                break
    finally:
        await asyncio.gather(*(agent.close() for agent in agents), return_exceptions=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.agents_loadgen")
    parser.add_argument("--target", required=True, help="host:port of the agent listener")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--first", type=int, default=0, help="index of the first agent id")
    parser.add_argument("--register-bytes", type=int, default=2048)
    asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
