"""Measure the inter-node transport on loopback: the challenge, and the round trip of a signed
call (`Ping`) next to the same call unsigned, so the cost of the authentication shows.

    python -m gateway.cluster.measure [--calls N] [--json]

Prints p50/p99 in microseconds (docs/cluster.md quotes a run). One process, one loop: the
figures include both ends' Python work, as a cross-node command's hop does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any, cast

from google.protobuf import empty_pb2
from grpclib.client import Channel
from grpclib.const import Cardinality, Handler

from gateway.cluster.seeds import PeerAddr
from gateway.cluster.transport import SERVICE, ClusterServer, ClusterService, PeerLink

COOKIE = "m" * 64
Empty = empty_pb2.Empty


class _Service(ClusterService):
    """The real service plus one unsigned Ping, the baseline."""

    def __mapping__(self) -> dict[str, Handler]:
        mapping = super().__mapping__()
        mapping[SERVICE + "PlainPing"] = Handler(self._ping, Cardinality.UNARY_UNARY, Empty, Empty)
        return mapping


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_us": round(statistics.median(ordered) * 1e6, 1),
        "p99_us": round(ordered[int(len(ordered) * 0.99) - 1] * 1e6, 1),
    }


async def measure(calls: int) -> dict[str, Any]:
    # The service reads no plane for Challenge and Ping.
    server = ClusterServer(_Service(COOKIE, "server", cast(Any, None), lambda: None))
    await server.start("127.0.0.1", 0)
    port = server.bound_port(0)
    link = PeerLink(PeerAddr("127.0.0.1", port), COOKIE, "client")
    plain = Channel("127.0.0.1", port)
    try:
        challenges = []
        for _ in range(min(calls, 200)):
            start = time.perf_counter()
            assert await link.challenge(5) == "up"
            challenges.append(time.perf_counter() - start)
        signed, unsigned = [], []
        for _ in range(calls):
            start = time.perf_counter()
            await link.unary("Ping", Empty(), Empty, 5)
            signed.append(time.perf_counter() - start)
            start = time.perf_counter()
            async with plain.request(
                SERVICE + "PlainPing", Cardinality.UNARY_UNARY, Empty, Empty, timeout=5
            ) as stream:
                await stream.send_message(Empty(), end=True)
                await stream.recv_message()
                await stream.recv_trailing_metadata()
            unsigned.append(time.perf_counter() - start)
    finally:
        link.close()
        plain.close()
        server.leave()
        await server.wait_closed()
    return {
        "calls": calls,
        "challenge": _percentiles(challenges),
        "signed_call": _percentiles(signed),
        "unsigned_call": _percentiles(unsigned),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args.calls))
    if args.json:
        print(json.dumps(result))
        return
    for name in ("challenge", "signed_call", "unsigned_call"):
        print(
            f"{name:14} p50 {result[name]['p50_us']:8.1f} us   p99 {result[name]['p99_us']:8.1f} us"
        )


if __name__ == "__main__":
    main()
