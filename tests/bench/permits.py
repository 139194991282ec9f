"""Benchmark of the permit-bound upstream call path: `python -m tests.bench.permits [--json]`.

Workload (issue 3, section 6; the seed's "Why these numbers"): N simultaneous ProxyRegister
calls (default 600) through the whole call path (`UpstreamCalls`: the published breaker state,
a permit asked of the real `upstream_regulator` actor, the real upstream channel on grpclib,
the outcome told to the `upstream` actor) to the grpcio fake server answering in 50 ms, with
48 register permits.

The fake server runs in a SUBPROCESS (`python -m gateway.devstack.fake_upstream --latency-ms
ProxyRegister=50`), so the gateway's loop does not share its time with the server's. Peak in
flight is counted on the gateway side, around the channel's `unary`, and the pool's own peak is
read too. The Little's-law bound is N / permits x latency (600 / 48 x 50 ms = 0.625 s).

Targets: 0 refused, peak in flight = permits, elapsed within 1.1 x the bound (the Erlang
gateway measured 0.67 s). See docs/upstream-calls.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any

import grpc.aio
from thespian.actors import ActorSystem

from actors.core.permits import Caller, Pool
from actors.upstream.actor import Upstream
from actors.upstream.api import (
    CHANNEL_ACTOR_NAME,
    PROXY_REGISTER,
    UpstreamCallError,
    UpstreamRefused,
    upstream_channel,
)
from actors.upstream.api import REGULATOR_NAME as REGULATOR
from actors.upstream.api import UPSTREAM_NAME as UPSTREAM
from actors.upstream.regulator import Regulator
from gateway.node.children.upstream import regulator_args, upstream_args
from gateway.upstream.calls import UpstreamCalls
from gateway.upstream.channel_actor import UpstreamChannelActor
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.gc_policy import NODE_GC_THRESHOLD
from supervisors.runtime import LoopSystemBase
from tests.bench.common import (
    REPO_ROOT,
    Row,
    add_common_arguments,
    environment,
    process_cpu_s,
    report,
    run_on_uvloop,
)
from tests.support.fake_channel import upstream_context

NAME = "permits"

DEFAULT_CALLS = 600
DEFAULT_PERMITS = 48
DEFAULT_LATENCY_MS = 50.0
DEFAULT_REPEAT = 5
TARGET_RATIO = 1.1  # elapsed within 1.1 x the Little's-law bound
WARMUP_CALLS = 96  # two rounds: the connection, the codecs and the actors are hot
SERVER_START_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0

_LISTENING = re.compile(r"listening on ([\d.]+):(\d+)")


# -- the fake server, in its own process ----------------------------------------------------------


@contextlib.asynccontextmanager
async def fake_server(latency_ms: float) -> AsyncIterator[tuple[int, int]]:
    """Start `python -m gateway.devstack.fake_upstream` on a free port; yields (port, pid)."""
    command = [
        sys.executable,
        "-m",
        "gateway.devstack.fake_upstream",
        "--port",
        "0",
        "--latency-ms",
        f"ProxyRegister={latency_ms:g}",
    ]
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), SERVER_START_TIMEOUT_S)
        match = _LISTENING.search(line.decode(errors="replace"))
        if match is None:
            raise RuntimeError(f"the fake server did not start: {line!r}")
        yield int(match.group(2)), process.pid
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 5.0)
            except TimeoutError:
                process.kill()
                await process.wait()


# -- the gateway side -----------------------------------------------------------------------------


class InFlight:
    """Counts calls inside the channel's `unary` (the gateway side of in flight)."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def wrap(self, unary: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.now += 1
            self.peak = max(self.peak, self.now)
            try:
                return await unary(*args, **kwargs)
            finally:
                self.now -= 1

        return counted


class PoolPeak:
    """The most register permits the regulator's pool held at once: read after every batch of
    effects the regulator performs (every message that can grant), so no grant is missed."""

    def __init__(self, regulator: Regulator) -> None:
        self.peak = 0
        original = regulator._perform

        def perform(effects: list[Any]) -> None:
            original(effects)
            self.peak = max(self.peak, regulator.pool.held(Pool.REGISTER))

        regulator._perform = perform  # type: ignore[method-assign]


def _request(i: int) -> agent_pb2.RegisterRequest:
    request = agent_pb2.RegisterRequest()
    request.info.agent_id = f"bench-agent-{i:05d}"
    return request


async def _burst(calls: UpstreamCalls, n: int) -> tuple[float, int, int]:
    """n simultaneous register calls; (elapsed seconds, refused, failed)."""

    async def one(i: int) -> str:
        try:
            await calls.call(
                Caller.REGISTER,
                PROXY_REGISTER,
                _request(i),
                agent_pb2.RegisterResponse,
                grpc_timeout_s=None,
            )
        except UpstreamRefused:
            return "refused"
        except UpstreamCallError:
            return "failed"
        return "ok"

    started = time.perf_counter()
    outcomes = await asyncio.gather(*(one(i) for i in range(n)))
    elapsed = time.perf_counter() - started
    return elapsed, outcomes.count("refused"), outcomes.count("failed")


async def _bare_burst(
    unary: Callable[..., Coroutine[Any, Any, Any]], n: int, permits: int
) -> float:
    """The same burst on the bare channel behind an asyncio.Semaphore: no breaker, no actors,
    no permit messages. What the transport alone allows on this host right now."""
    gate = asyncio.Semaphore(permits)

    async def one(i: int) -> None:
        async with gate:
            await unary(PROXY_REGISTER, _request(i), agent_pb2.RegisterResponse, timeout=5.0)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - started


async def _grpcio_burst(port: int, n: int, permits: int, rounds: int) -> list[float]:
    """The reference: the same bursts from grpcio's own client (Google's C-core) behind an
    asyncio.Semaphore, on a connection of its own. If even this misses the target, the fake
    server, not the gateway, is what bounds the run on this host."""
    gate = asyncio.Semaphore(permits)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        rpc = channel.unary_unary(
            PROXY_REGISTER,
            request_serializer=agent_pb2.RegisterRequest.SerializeToString,
            response_deserializer=agent_pb2.RegisterResponse.FromString,
        )

        async def one(i: int) -> None:
            async with gate:
                await rpc(_request(i), timeout=5.0)

        await asyncio.gather(*(one(i) for i in range(WARMUP_CALLS)))
        times = []
        for _ in range(rounds):
            gc.collect()
            started = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(n)))
            times.append(time.perf_counter() - started)
    return times


async def run_benchmark(
    calls: int = DEFAULT_CALLS,
    permits: int = DEFAULT_PERMITS,
    latency_ms: float = DEFAULT_LATENCY_MS,
    repeat: int = DEFAULT_REPEAT,
    *,
    quiet: bool = False,
    reference: bool = True,
) -> dict[str, Any]:
    """The measurement, on the running loop: `repeat` bursts of `calls` calls through the call
    path, each followed by one on the bare channel; then, with `reference`, `repeat` bursts
    from a grpcio client."""

    def progress(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)

    bound_s = calls / permits * latency_ms / 1000.0
    async with fake_server(latency_ms) as (port, server_pid):
        loop = asyncio.get_running_loop()
        runtime = LoopSystemBase(loop)
        system = ActorSystem(systemBase=runtime, transientUnique=True)
        endpoint = f'{{http, "127.0.0.1", {port}, []}}'
        ctx = upstream_context(
            f"[{{upstream_client, #{{channels => [{{default_channel, [{endpoint}], #{{}}}}]}}}},"
            f" {{upstream_register_concurrency, {permits}}}]"
        )
        try:
            system.createActor(UpstreamChannelActor, ctx, CHANNEL_ACTOR_NAME)
            system.createActor(Upstream, upstream_args(ctx), UPSTREAM)
            regulator_address = system.createActor(Regulator, regulator_args(ctx), REGULATOR)
            channel = upstream_channel(runtime)
            assert channel is not None
            deadline = loop.time() + CONNECT_TIMEOUT_S
            while channel.live_connections() == 0:  # type: ignore[attr-defined]
                if loop.time() > deadline:
                    raise RuntimeError("no connection to the fake server")
                await asyncio.sleep(0.01)
            in_flight = InFlight()
            bare_unary = channel.unary
            channel.unary = in_flight.wrap(bare_unary)  # type: ignore[method-assign]
            regulator_ref = runtime.ref(regulator_address)
            assert regulator_ref is not None
            pool_peak = PoolPeak(regulator_ref.instance)  # type: ignore[arg-type]
            calls_api = UpstreamCalls(runtime, ctx.config)
            progress(f"warm-up: {WARMUP_CALLS} calls")
            await _burst(calls_api, WARMUP_CALLS)
            await _bare_burst(bare_unary, WARMUP_CALLS, permits)
            runs = []
            for n in range(repeat):
                in_flight.peak = pool_peak.peak = 0
                gc.collect()
                cpu, server_cpu = time.process_time(), process_cpu_s(server_pid)
                elapsed, refused, failed = await _burst(calls_api, calls)
                cpu = time.process_time() - cpu
                server_cpu = process_cpu_s(server_pid) - server_cpu
                # Interleaved, so both see the same host load.
                gc.collect()
                bare_cpu = time.process_time()
                bare = await _bare_burst(bare_unary, calls, permits)
                bare_cpu = time.process_time() - bare_cpu
                run = {
                    "elapsed_s": round(elapsed, 4),
                    "bare_elapsed_s": round(bare, 4),
                    "refused": refused,
                    "failed": failed,
                    "peak_in_flight": in_flight.peak,
                    "peak_permits_held": pool_peak.peak,
                    "gateway_cpu_s": round(cpu, 4),
                    "bare_cpu_s": round(bare_cpu, 4),
                    "server_cpu_s": round(server_cpu, 4),
                    "load_average_1m": os.getloadavg()[0],
                }
                runs.append(run)
                progress(f"run {n + 1}/{repeat}: {run}")
        finally:
            runtime.shutdown()
        grpcio = await _grpcio_burst(port, calls, permits, repeat) if reference else []
        if grpcio:
            progress(f"grpcio client reference: {[round(t, 4) for t in grpcio]}")
    elapsed_median = statistics.median(r["elapsed_s"] for r in runs)
    bare_median = statistics.median(r["bare_elapsed_s"] for r in runs)
    refused_total = sum(r["refused"] + r["failed"] for r in runs)
    peak = max(r["peak_in_flight"] for r in runs)
    result: dict[str, Any] = {
        "benchmark": NAME,
        "calls": calls,
        "permits": permits,
        "latency_ms": latency_ms,
        "repeat": repeat,
        "bound_s": round(bound_s, 4),
        "elapsed_s": round(elapsed_median, 4),
        "elapsed_min_s": round(min(r["elapsed_s"] for r in runs), 4),
        "elapsed_max_s": round(max(r["elapsed_s"] for r in runs), 4),
        "ratio_to_bound": round(elapsed_median / bound_s, 3),
        "bare_elapsed_s": round(bare_median, 4),
        "ratio_to_bare": round(elapsed_median / bare_median, 3),
        "grpcio_client_elapsed_s": round(statistics.median(grpcio), 4) if grpcio else None,
        "refused": sum(r["refused"] for r in runs),
        "failed": sum(r["failed"] for r in runs),
        "peak_in_flight": peak,
        "peak_permits_held": max(r["peak_permits_held"] for r in runs),
        "gateway_cpu_s": round(statistics.median(r["gateway_cpu_s"] for r in runs), 4),
        "bare_cpu_s": round(statistics.median(r["bare_cpu_s"] for r in runs), 4),
        "server_cpu_s": round(statistics.median(r["server_cpu_s"] for r in runs), 4),
        # The same per call: what to compare between runs on a shared host, where elapsed
        # moves with the load and CPU time much less.
        **{
            f"{key}_us_per_call": round(
                statistics.median(r[f"{key}_s"] for r in runs) / calls * 1e6, 1
            )
            for key in ("gateway_cpu", "bare_cpu", "server_cpu")
        },
        "load_average_1m": os.getloadavg()[0],
        "runs": runs,
        "targets_met": {
            "refused": refused_total == 0,
            "peak_in_flight": peak == permits,
            "elapsed_within_1_1x_bound": elapsed_median <= TARGET_RATIO * bound_s,
        },
        "environment": environment(),
        "loop": type(asyncio.get_running_loop()).__module__,
    }
    return result


def table_rows(result: dict[str, Any]) -> list[Row]:
    met = result["targets_met"]
    permits = result["permits"]
    return [
        Row("calls (simultaneous)", str(result["calls"])),
        Row("register permits", str(permits)),
        Row("server latency", f"{result['latency_ms']:g} ms"),
        Row("Little's-law bound", f"{result['bound_s']:.3f} s"),
        Row(
            f"elapsed (median of {result['repeat']})",
            f"{result['elapsed_s']:.3f} s ({result['ratio_to_bound']:.2f} x bound)",
            f"<= {TARGET_RATIO * result['bound_s']:.3f} s",
            met["elapsed_within_1_1x_bound"],
        ),
        Row(
            "bare channel + semaphore (median)",
            f"{result['bare_elapsed_s']:.3f} s (call path / bare: {result['ratio_to_bare']:.2f})",
        ),
        Row(
            "reference: grpcio client + semaphore (median)",
            "-"
            if result["grpcio_client_elapsed_s"] is None
            else f"{result['grpcio_client_elapsed_s']:.3f} s",
        ),
        Row(
            "elapsed min / max", f"{result['elapsed_min_s']:.3f} / {result['elapsed_max_s']:.3f} s"
        ),
        Row(
            "refused + failed (all runs)",
            f"{result['refused']} + {result['failed']}",
            "0",
            met["refused"],
        ),
        Row(
            "peak in flight (gateway side)",
            str(result["peak_in_flight"]),
            str(permits),
            met["peak_in_flight"],
        ),
        Row("peak permits held (pool)", str(result["peak_permits_held"])),
        Row(
            "gateway CPU per burst, call path / bare (median)",
            f"{result['gateway_cpu_s']:.3f} / {result['bare_cpu_s']:.3f} s",
        ),
        Row(
            "gateway CPU per call, call path / bare (median)",
            f"{result['gateway_cpu_us_per_call']:.0f} / {result['bare_cpu_us_per_call']:.0f} us",
        ),
        Row(
            "fake server CPU per burst / per call (median)",
            f"{result['server_cpu_s']:.3f} s / {result['server_cpu_us_per_call']:.0f} us",
        ),
        Row("host load average (1 min)", f"{result['load_average_1m']:.2f}"),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.permits",
        description="Simultaneous permit-bound ProxyRegister calls through the real channel "
        "to the fake server, against the Little's-law bound.",
    )
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS, help="default 600")
    parser.add_argument("--permits", type=int, default=DEFAULT_PERMITS, help="default 48")
    parser.add_argument(
        "--latency-ms", type=float, default=DEFAULT_LATENCY_MS, help="server latency (50)"
    )
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, help="bursts (5)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the grpcio-client reference bursts against the same server",
    )
    add_common_arguments(parser, NAME)
    args = parser.parse_args(argv)
    # The node's collector settings (supervisors.gc_policy), so the run measures what
    # production runs; put back afterwards for a caller in the same process (the smoke test).
    previous = gc.get_threshold()
    gc.set_threshold(*NODE_GC_THRESHOLD)
    try:
        run = run_benchmark(
            args.calls,
            args.permits,
            args.latency_ms,
            args.repeat,
            quiet=args.quiet,
            reference=not args.no_reference,
        )
        result = run_on_uvloop(run)
    finally:
        gc.set_threshold(*previous)
    report(result, table_rows(result), args.out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
