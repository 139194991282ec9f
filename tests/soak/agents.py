"""One agent process of the soak: `python -m tests.soak.agents --target TARGET [--target ...]
--count K --first I --token CANARY`.

Holds K grpcio agents, one channel (one HTTP/2 connection) each, as tests/bench/agents_loadgen.py
does, agent i of them dialling the i-th target round the list (a gRPC target: a two-node soak
names both nodes, `ipv4:127.0.0.1:A,127.0.0.1:B`, and pick_first moves an agent to the second
when the first ends), and lives as the stock agent does until told to stop:

1. Register, with the canary as its enrolment token (the node must never log it);
2. Subscribe with `x-yuzu-session-id`; answer every command on the stream RUNNING then SUCCESS
   (gateway/devstack/behaviour.py), and heartbeat every `HEARTBEAT_S` on its own channel;
3. when the stream ends, or a heartbeat is answered NOT_FOUND (the session is gone), register
   again after the stock agent's backoff: 2, 4, 8 ... s, at most 256 s, no jitter (seed:
   "Connection drain"), starting over once it has subscribed.

It speaks on stdin/stdout, one line per message: prints `ready`; on `report` prints one JSON
object (per agent: its current subscribed session or "", and every session a Register
granted it, in order); on `stop` or end of input closes every channel and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from typing import Any

import grpc
import grpc.aio

from gateway.devstack import behaviour
from gateway.devstack.agents import Target, open_channel
from protos.yuzu.agent.v1 import agent_pb2

SERVICE = "/yuzu.agent.v1.AgentService/"
SESSION_KEY = "x-yuzu-session-id"
# The stock agent's reconnect backoff (no jitter, #5990).
BACKOFF = behaviour.Backoff(base_s=2.0, cap_s=256.0, jitter=0.0)
HEARTBEAT_S = 10.0
RPC_TIMEOUT_S = 30.0
ANSWER_DELAY_S = 0.05
_ERRORS = (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError)


def agent_id(index: int) -> str:
    return f"soak-agent-{index:06d}"


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


class SoakAgent:
    def __init__(self, agent: str, target: Target, token: str, rng: random.Random) -> None:
        self.agent_id = agent
        self.target = target
        self.request = behaviour.register_request(agent)
        self.request.enrollment_token = token
        self.rng = rng
        self.current = ""
        self.sessions: list[str] = []  # every session granted, oldest first
        self.subscribes = 0
        self.started = time.monotonic()

    async def run(self) -> None:
        attempt = 0
        async with open_channel(self.target, BACKOFF) as channel:
            while True:
                subscribed_before = self.subscribes
                with contextlib.suppress(*_ERRORS):
                    await self._session(channel)
                self.current = ""
                attempt = 0 if self.subscribes > subscribed_before else attempt + 1
                await asyncio.sleep(BACKOFF.delay(attempt, 0.0))

    def _unary(self, channel: grpc.aio.Channel, method: str, response: Any) -> Any:
        return channel.unary_unary(
            SERVICE + method,
            request_serializer=_serialize,
            response_deserializer=response.FromString,
        )

    async def _session(self, channel: grpc.aio.Channel) -> None:
        register = self._unary(channel, "Register", agent_pb2.RegisterResponse)
        reply = await register(self.request, timeout=RPC_TIMEOUT_S)
        if not reply.accepted or not reply.session_id:
            return
        self.sessions.append(reply.session_id)
        call = channel.stream_stream(
            SERVICE + "Subscribe",
            request_serializer=_serialize,
            response_deserializer=agent_pb2.CommandRequest.FromString,
        )(metadata=((SESSION_KEY, reply.session_id),))
        try:
            await call.initial_metadata()
            if call.done():  # a trailers-only answer: the Subscribe was refused
                return
            self.subscribes += 1
            self.current = reply.session_id
            lock = asyncio.Lock()
            tasks = [
                asyncio.create_task(self._commands(call, lock)),
                asyncio.create_task(self._heartbeats(channel, call, lock, reply.session_id)),
            ]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            call.cancel()

    async def _answer(
        self, call: grpc.aio.StreamStreamCall, lock: asyncio.Lock, command: Any
    ) -> None:
        running, done = behaviour.answers(command, self.agent_id, time.time())
        async with lock:
            await call.write(running)
        await asyncio.sleep(ANSWER_DELAY_S)
        async with lock:
            await call.write(done)

    async def _commands(self, call: grpc.aio.StreamStreamCall, lock: asyncio.Lock) -> None:
        while (command := await call.read()) is not grpc.aio.EOF:
            await self._answer(call, lock, command)

    async def _heartbeats(
        self,
        channel: grpc.aio.Channel,
        call: grpc.aio.StreamStreamCall,
        lock: asyncio.Lock,
        session_id: str,
    ) -> None:
        beat = self._unary(channel, "Heartbeat", agent_pb2.HeartbeatResponse)
        await asyncio.sleep(self.rng.uniform(0.0, HEARTBEAT_S))
        while True:
            uptime = time.monotonic() - self.started
            request = behaviour.heartbeat(session_id, time.time(), uptime)
            try:
                reply = await beat(request, timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return  # the session is gone: a stock agent registers again
            else:
                for command in reply.pending_commands:
                    await self._answer(call, lock, command)
            await asyncio.sleep(HEARTBEAT_S)

    def report(self) -> dict[str, Any]:
        return {"current": self.current, "sessions": self.sessions}


async def _main(args: argparse.Namespace) -> None:
    targets = [Target(target) for target in args.target]
    seeds = random.Random(args.seed)
    agents = [
        SoakAgent(
            agent_id(args.first + i),
            targets[i % len(targets)],
            args.token,
            random.Random(seeds.random()),
        )
        for i in range(args.count)
    ]
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks = [asyncio.create_task(agent.run()) for agent in agents]
    print("ready", flush=True)
    try:
        while line := (await reader.readline()).decode().strip():
            if line == "report":
                report = {agent.agent_id: agent.report() for agent in agents}
                print(json.dumps(report, separators=(",", ":")), flush=True)
            elif line == "stop":
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.agents")
    parser.add_argument(
        "--target", action="append", required=True, help="a gRPC target of the agent listener"
    )
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--first", type=int, default=0, help="index of the first agent id")
    parser.add_argument("--token", required=True, help="the canary enrolment token")
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
