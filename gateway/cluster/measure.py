"""Measure the inter-node transport on loopback: the challenge, the round trip of a signed call
(`Ping`) next to the same call unsigned, so the cost of the authentication shows, and one
forwarded command answered at once, on its own signed call (one HTTP/2 stream per command, the
transport before the command stream) and on the link's command stream (gateway/cluster/commands.py).

    python -m gateway.cluster.measure [--calls N] [--json]

Prints p50/p99 in microseconds and the CPU per round trip (docs/cluster.md quotes a run). One
process, one loop: the figures include both ends' Python work, as a cross-node command's hop
does. The dialled side answers the command itself (no router, no agent): what is left is the
transport's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from google.protobuf import empty_pb2
from grpclib.client import Channel
from grpclib.const import Cardinality, Handler
from grpclib.server import Stream

from actors.cluster.api import PeerFrame
from gateway.cluster.transport import SERVICE, ClusterServer, ClusterService, PeerLink
from gateway.config.cluster_seeds import PeerAddr
from gateway.mgmt.command import ResponseWriter
from gateway.mgmt.metrics import CommandOutcome
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2 as mgmt

COOKIE = "m" * 64
Empty = empty_pb2.Empty
REQUEST = mgmt.SendCommandRequest(
    agent_ids=["agent-1"],
    command=agent_pb2.CommandRequest(command_id="m1", plugin="bench", action="noop"),
    timeout_seconds=30,
)
ANSWER = mgmt.SendCommandResponse(
    agent_id="agent-1",
    response=agent_pb2.CommandResponse(
        command_id="m1", status=agent_pb2.CommandResponse.Status.SUCCESS, output="ok"
    ),
)
NAMES = ("challenge", "signed_call", "unsigned_call", "command_own_call", "command_on_stream")


class _Service(ClusterService):
    """The real service, its command route answering at once, plus two baselines: an unsigned
    Ping, and a forwarded command on its own signed server-streaming call."""

    def __mapping__(self) -> dict[str, Handler]:
        mapping = super().__mapping__()
        mapping[SERVICE + "PlainPing"] = Handler(self._ping, Cardinality.UNARY_UNARY, Empty, Empty)
        mapping[SERVICE + "CallCommand"] = self._signed(
            "CallCommand",
            self._call_command,
            Cardinality.UNARY_STREAM,
            mgmt.SendCommandRequest,
            mgmt.SendCommandResponse,
        )
        return mapping

    async def _call_command(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        await stream.send_message(ANSWER)

    def _route(
        self, request: mgmt.SendCommandRequest, stream: ResponseWriter
    ) -> Awaitable[CommandOutcome]:
        return self._answer(stream)

    async def _answer(self, stream: ResponseWriter) -> CommandOutcome:
        await stream.send_message(ANSWER)
        return "completed"


def _percentiles(samples: list[float], cpu_s: float) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_us": round(statistics.median(ordered) * 1e6, 1),
        "p99_us": round(ordered[int(len(ordered) * 0.99) - 1] * 1e6, 1),
        "cpu_us": round(cpu_s / len(samples) * 1e6, 1),
    }


async def _timed(count: int, once: Callable[[int], Awaitable[object]]) -> dict[str, float]:
    samples = []
    cpu = time.process_time()
    for n in range(count):
        start = time.perf_counter()
        await once(n)
        samples.append(time.perf_counter() - start)
    return _percentiles(samples, time.process_time() - cpu)


async def measure(calls: int) -> dict[str, Any]:
    # The service reads no plane for Challenge, Ping and its own command route.
    server = ClusterServer(_Service(COOKIE, "server", cast(Any, None), lambda: None))
    await server.start("127.0.0.1", 0)
    port = server.bound_port(0)
    addr = PeerAddr("127.0.0.1", port)
    link = PeerLink(addr, COOKIE, "client")
    plain = Channel("127.0.0.1", port)
    answered: dict[int, asyncio.Future[None]] = {}

    def deliver(msg: object) -> None:
        if isinstance(msg, PeerFrame) and (waiter := answered.pop(msg.seq, None)) is not None:
            waiter.set_result(None)

    async def challenge(_: int) -> None:
        assert await link.challenge(5) == "up"

    async def unsigned(_: int) -> None:
        async with plain.request(
            SERVICE + "PlainPing", Cardinality.UNARY_UNARY, Empty, Empty, timeout=5
        ) as stream:
            await stream.send_message(Empty(), end=True)
            await stream.recv_message()
            await stream.recv_trailing_metadata()

    async def own_call(_: int) -> None:
        async for _answer in link.stream("CallCommand", REQUEST, mgmt.SendCommandResponse, 5):
            pass

    async def on_stream(n: int) -> None:
        waiter = answered[n] = asyncio.get_running_loop().create_future()
        link.forward(n, REQUEST)
        await waiter

    result: dict[str, Any] = {"calls": calls}
    try:
        result["challenge"] = await _timed(min(calls, 200), challenge)
        result["signed_call"] = await _timed(calls, lambda _: link.unary("Ping", Empty(), Empty, 5))
        result["unsigned_call"] = await _timed(calls, unsigned)
        result["command_own_call"] = await _timed(calls, own_call)
        assert await link.dial(5, deliver) == "up"
        result["command_on_stream"] = await _timed(calls, on_stream)
    finally:
        link.close()
        plain.close()
        server.leave()
        await server.wait_closed()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args.calls))
    if args.json:
        print(json.dumps(result))
        return
    for name in NAMES:
        row = result[name]
        print(
            f"{name:18} p50 {row['p50_us']:8.1f} us   p99 {row['p99_us']:8.1f} us"
            f"   cpu {row['cpu_us']:8.1f} us"
        )


if __name__ == "__main__":
    main()
