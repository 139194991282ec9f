"""One load-generator process of `tests.bench.agents` (docs/dev/benchmarks.md).

    python -m tests.bench.agents_loadgen --target 127.0.0.1:PORT --count K --first I

Holds K grpcio agents, one channel (one HTTP/2 connection) each. It speaks on stdin/stdout, one
line per message, so the benchmark can start every generator's wave at the same moment:

- prints `ready` once its channels exist;
- on `go`: every agent registers (a RegisterRequest of about `--register-bytes`) and subscribes
  with `x-yuzu-session-id`, all at once; an agent whose Register or Subscribe fails tries again
  after the refusal's `grpc-retry-pushback-ms` when it carries one (exactly that long), else
  after the real agent's reconnect backoff (2, 4, 8 ... s, no jitter: the seed's "What a new
  agent connection sees while shedding"), at most `RECONNECT_BACKOFF_S` times; prints
  `subscribed OK FAILED SECONDS RETRIES TIMEOUTS` when every agent has its Subscribe response
  headers or has given up, RETRIES the attempts after the first of every agent, TIMEOUTS the
  attempts that failed because the connection was not set up in time (`connect_timeout`). The
  streams stay open;
- on `rejoin`: every agent waits for its stream to end (the node went away), then joins again as
  on `go` (the reconnect storm of `tests.bench.storm`); prints the same `subscribed` line;
- on `heartbeat WINDOW INTERVAL` (seconds): every subscribed agent sends one Heartbeat every
  INTERVAL on its own channel (the gateway admits a heartbeat only on the connection that opened
  the session), the agents' first heartbeats spread evenly over the first INTERVAL, until WINDOW
  has passed; prints `heartbeats OK FAILED LATE_MS`, LATE_MS the longest a heartbeat started
  after its due time (so a burst this process sent, not the gateway, can be told);
- on `stop` or end of input: closes every channel and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
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
# The agent's reconnect backoff after a failed Register or Subscribe (seed: "2, 4, 8 ...
# seconds, at most 256 s", no jitter); five retries cover a wave of a minute and more.
RECONNECT_BACKOFF_S = (2.0, 4.0, 8.0, 16.0, 32.0)
# Retries after a refusal that said when to come back: a storm refuses an agent a few times at
# most (the hints follow the node's drain rate), so this bounds only a broken gateway.
MAX_HINTED_RETRIES = 50
PUSHBACK_KEY = "grpc-retry-pushback-ms"
# How grpcio words a connection it could not set up in time: the TCP connect, or the HTTP/2
# handshake ("timed out before receiving SETTINGS"), behind a node too busy to accept.
_CONNECT_TIMEOUT_WORDS = ("timed out", "Timeout occurred")


def connect_timeout(code: grpc.StatusCode, details: str | None) -> bool:
    """Whether a failed call failed because its connection was not set up in time."""
    return code == grpc.StatusCode.UNAVAILABLE and any(
        words in (details or "") for words in _CONNECT_TIMEOUT_WORDS
    )


def pushback_s(metadata: Any) -> float | None:
    """The refusal's `grpc-retry-pushback-ms` in seconds, or None (absent, or not a number)."""
    for key, value in metadata or ():
        if key == PUSHBACK_KEY and isinstance(value, str) and value.isdigit():
            return int(value) / 1000.0
    return None


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


_failures_seen: set[str] = set()


def _first_failure(line: str) -> None:
    """Log each distinct failure once: a wave of 10,000 retrying agents would flood the log."""
    if line not in _failures_seen:
        _failures_seen.add(line)
        print(line, file=sys.stderr)


class Agent:
    def __init__(self, target: str, agent_id: str, register_bytes: int) -> None:
        self.channel = grpc.aio.insecure_channel(
            target, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self.request = register_request(agent_id, register_bytes)
        self.stream: grpc.aio.StreamStreamCall | None = None
        self.session_id = ""
        self.subscribed = False
        self.retries = 0
        self.hinted = 0  # retries after a refusal's hint
        self.connect_timeouts = 0
        # The last failed attempt's `grpc-retry-pushback-ms`, in seconds; None without one.
        self.hint_s: float | None = None
        self._heartbeat: grpc.aio.UnaryUnaryMultiCallable | None = None

    async def join(self) -> bool:
        """Register and subscribe, again after each backoff step while an attempt fails. A
        refusal that says when to come back (`grpc-retry-pushback-ms`) is retried after exactly
        that long, as seed 003's daemon does, and takes no backoff step (at most
        `MAX_HINTED_RETRIES` of them)."""
        steps = iter(RECONNECT_BACKOFF_S)
        wait_for_ready = False
        hinted = 0
        while not await self._attempt(wait_for_ready=wait_for_ready):
            if self.hint_s is not None and hinted < MAX_HINTED_RETRIES:
                hinted += 1
                self.hinted += 1
                delay = self.hint_s
            else:
                step = next(steps, None)
                if step is None:
                    return False
                delay = step
            await asyncio.sleep(delay)
            self.retries += 1
            # grpcio redials a failed connection by itself (its own backoff) and fails a call
            # at once while it is down: waiting for it makes a retry one more connection
            # attempt, as the agent's is, and not a call refused on the client side.
            wait_for_ready = True
        return True

    async def _attempt(self, *, wait_for_ready: bool) -> bool:
        register = self.channel.unary_unary(
            SERVICE + "Register",
            request_serializer=_serialize,
            response_deserializer=agent_pb2.RegisterResponse.FromString,
        )
        self.hint_s = None
        try:
            reply = await register(self.request, timeout=DEADLINE_S, wait_for_ready=wait_for_ready)
        except grpc.aio.AioRpcError as exc:
            _first_failure(f"register failed: {exc.code().name} {exc.details()}")
            self.connect_timeouts += connect_timeout(exc.code(), exc.details())
            self.hint_s = pushback_s(exc.trailing_metadata())
            return False
        if not reply.accepted or not reply.session_id:
            _first_failure(f"register refused: {reply.reject_reason}")
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
            _first_failure(f"subscribe failed: {code.name}")
            self.hint_s = pushback_s(await self.stream.trailing_metadata())
            self.stream = None
            return False
        self.subscribed = True
        return True

    async def rejoin(self) -> bool:
        """Join again once the held stream has ended (its node went away)."""
        if self.stream is not None:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
                await self.stream.code()
        self.stream = None
        self.subscribed = False
        self.retries = self.hinted = self.connect_timeouts = 0
        return await self.join()

    async def heartbeat(self) -> str | None:
        """One Heartbeat on the agent's own channel: None when acknowledged, else what failed."""
        if self._heartbeat is None:
            self._heartbeat = self.channel.unary_unary(
                SERVICE + "Heartbeat",
                request_serializer=_serialize,
                response_deserializer=agent_pb2.HeartbeatResponse.FromString,
            )
        request = agent_pb2.HeartbeatRequest(session_id=self.session_id)
        request.sent_at.millis_epoch = int(time.time() * 1000)
        try:
            reply = await self._heartbeat(request, timeout=HEARTBEAT_DEADLINE_S)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name} {exc.details()}"
        return None if reply.acknowledged else "not acknowledged"

    async def close(self) -> None:
        if self.stream is not None:
            self.stream.cancel()
        await self.channel.close()


async def _heartbeats(agents: list[Agent], window: float, interval: float) -> str:
    """Agent i's heartbeats are due at i * interval / N, then every interval, until `window`.
    One coroutine paces them, starting each as its own task at its due time, so a loop turn
    starts only the heartbeats due in it. (One coroutine per agent, all started at once, took a
    turn of 0.8 to 0.9 s at 3,334 agents, most of it the collections of this process's heap,
    and then sent every heartbeat due meanwhile in one burst: the gateway saw 150 to 200 of
    them in one loop turn.)"""
    joined = [agent for agent in agents if agent.subscribed]
    # The channels and streams live to the end: out of every collection of the window.
    gc.collect()
    gc.freeze()
    loop = asyncio.get_running_loop()
    tally = {"ok": 0, "failed": 0}
    pending: set[asyncio.Task[None]] = set()

    async def one(agent: Agent) -> None:
        error = await agent.heartbeat()
        if error is None:
            tally["ok"] += 1
            return
        tally["failed"] += 1
        if tally["failed"] == 1:
            print(f"heartbeat failed: {error}", file=sys.stderr)

    start = loop.time()
    step = interval / max(1, len(joined))
    late = 0.0
    sent = 0
    while joined and (due := start + sent * step) < start + window:
        # Always a yield, even when behind: the tasks started so far get their turn.
        await asyncio.sleep(max(0.0, due - loop.time()))
        late = max(late, loop.time() - due)
        task = loop.create_task(one(joined[sent % len(joined)]))
        pending.add(task)
        task.add_done_callback(pending.discard)
        sent += 1
    await asyncio.gather(*pending)
    return f"heartbeats {tally['ok']} {tally['failed']} {1000.0 * late:.1f}"


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
            if line in ("go", "rejoin"):
                started = time.perf_counter()
                joins = (agent.join() if line == "go" else agent.rejoin() for agent in agents)
                joined = await asyncio.gather(*joins)
                elapsed = time.perf_counter() - started
                ok = sum(joined)
                retries = sum(agent.retries for agent in agents)
                timeouts = sum(agent.connect_timeouts for agent in agents)
                print(
                    f"subscribed {ok} {len(agents) - ok} {elapsed:.3f} {retries} {timeouts}",
                    flush=True,
                )
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
