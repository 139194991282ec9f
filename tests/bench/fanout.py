"""Benchmark of SendCommand fan-out: `python -m tests.bench.fanout --agents N [--json]`.

Workload (issue 6, section 3): N agents held by a gateway node started as a subprocess
(`python -m gateway`, its upstream the fake server `gateway.devstack.fake_upstream` answering in
2 ms), each one grpcio channel in a few load-generator processes (`tests.bench.fanout_loadgen`)
that answer every command at once (SUCCESS). One grpcio operator client in this process, on the
management listener:

- (a) single-target commands at a steady rate (`--rate`, 200 a second, for `--duration-s`, each
  to a random held agent): the round trip from the call to the agent's answer at the operator,
  p50 and p99;
- (b) a broadcast to all N (empty `agent_ids`), `BROADCASTS` times: the time from the call until
  the last of the N answers reaches the operator (the median is reported).

Both phases start on a settled node: after the cold wave the gateway still tells the fake
server of every new stream (NotifyStreamStatus, several hundred a second on a loaded machine), so
the run waits until none is held or in flight (`/metrics`, reported as `gateway_settle_s`); the
bare relay makes no upstream call and is settled at once.

The same run measures the ceiling: the bare grpclib relay (`tests.bench.fanout_bare`, no actors)
takes the same operator calls, writes to the same N agent streams held by the same load
generators, and writes each reply back to the operator.

Both report the server process's CPU (/proc/<pid>/stat) per answered single-target command over
phase (a) and per broadcast answer over phase (b): what a change to the command path costs (the
RPC metrics, say: docs/dev/benchmarks.md) shows there before the latency moves.

Targets (at N = 5,000 on one node): single-target p99 within 1.5x the bare relay's at 200
commands a second; broadcast within 1.5x the bare relay's. Every command must be answered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2
from tests.bench.agents import (
    START_TIMEOUT_S,
    _listening_port,
    _spawn,
    _stop,
    _wait_or_kill,
    fake_server,
    free_port,
    gateway_config,
    http_get,
    metric_sum,
    process_cpu_s,
    progress,
    running_gateway,
)
from tests.bench.common import Row, add_common_arguments, environment, report

NAME = "fanout"

DEFAULT_AGENTS = 5000
DEFAULT_RATE = 200.0
DEFAULT_DURATION_S = 10.0
BROADCASTS = 3
WARMUP_COMMANDS = 20
TARGET_RATIO = 1.5
UPSTREAM_LATENCY_MS = 2.0
AGENTS_PER_LOADGEN = 2500  # each agent: a channel and an answering task
COMMAND_TIMEOUT_S = 60
CALL_DEADLINE_S = 120.0
SETTLE_S = 1.0
# The gauges that say the gateway is still notifying the fake server of the cold wave's streams
# (it sends them after the agents are held; a node still draining them is not idle).
NOTIFY_BUSY = ("yuzu_gw_upstream_notify_pending", "yuzu_gw_upstream_notify_inflight")
IDLE_NOTIFY_RATE = 100.0  # the slowest drain waited for, notifications a second
IDLE_POLL_S = 0.5  # each scrape runs on the node's loop and lists its open fds (O(agents))
SEND_COMMAND = "/yuzu.server.v1.ManagementService/SendCommand"
_SUCCESS = agent_pb2.CommandResponse.Status.SUCCESS
_RUNNING = agent_pb2.CommandResponse.Status.RUNNING


def agent_id(index: int) -> str:
    return f"bench-agent-{index:06d}"  # tests.bench.fanout_loadgen's ids


@dataclass
class Endpoint:
    """Where the load generators and the operator connect, and the server's metrics port."""

    agent_port: int
    mgmt_port: int
    metrics_port: int | None = None
    pid: int | None = None  # the server process, for its CPU time


# -- the two servers ------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def gateway_node(workdir: Path, agents: int) -> AsyncIterator[Endpoint]:
    """The gateway as a subprocess, its upstream a fake server, the management listener on a
    fixed free loopback port; returns once /readyz is 200."""
    async with fake_server(UPSTREAM_LATENCY_MS) as fake:
        config = workdir / "bench.config"
        ports = gateway_config(config, agents, fake.port)
        mgmt_port = free_port()
        text = config.read_text().replace(
            "listen => #{port => 0, ip => {127,0,0,1}}",
            f"listen => #{{port => {mgmt_port}, ip => {{127,0,0,1}}}}",
            1,
        )
        config.write_text(text)
        async with running_gateway(workdir, config, ports["health"]) as process:
            yield Endpoint(ports["agent"], mgmt_port, ports["metrics"], process.pid)


@contextlib.asynccontextmanager
async def bare_relay(workdir: Path) -> AsyncIterator[Endpoint]:
    process = await _spawn(
        "-m",
        "tests.bench.fanout_bare",
        log=workdir / "bare.log",
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        port = await _listening_port(process, "the bare relay")
        yield Endpoint(port, port, pid=process.pid)
    finally:
        await _stop(process)


# -- the load generators --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def load_generators(
    workdir: Path, port: int, agents: int, count: int
) -> AsyncIterator[tuple[int, int]]:
    """Start the generators, join every agent; yields (subscribed, failed)."""
    share = math.ceil(agents / count)
    processes: list[asyncio.subprocess.Process] = []

    async def lines(timeout: float) -> list[str]:
        async def one(process: asyncio.subprocess.Process) -> str:
            assert process.stdout is not None
            return (await process.stdout.readline()).decode().strip()

        return list(await asyncio.wait_for(asyncio.gather(*map(one, processes)), timeout))

    try:
        for index in range(count):
            first = index * share
            mine = min(share, agents - first)
            if mine <= 0:
                break
            processes.append(
                await _spawn(
                    "-m",
                    "tests.bench.fanout_loadgen",
                    "--target",
                    f"127.0.0.1:{port}",
                    "--count",
                    str(mine),
                    "--first",
                    str(first),
                    log=workdir / f"loadgen-{index}.log",
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
            )
        if any(line != "ready" for line in await lines(START_TIMEOUT_S)):
            raise RuntimeError("a load generator did not start")
        for process in processes:
            assert process.stdin is not None
            process.stdin.write(b"go\n")
        subscribed = failed = 0
        for line in await lines(START_TIMEOUT_S + agents / 20.0):
            parts = line.split()
            if len(parts) != 4 or parts[0] != "subscribed":
                raise RuntimeError(f"a load generator failed: {line!r}")
            subscribed += int(parts[1])
            failed += int(parts[2])
        yield subscribed, failed
    finally:
        for process in processes:
            if process.stdin is not None and not process.stdin.is_closing():
                with contextlib.suppress(OSError):
                    process.stdin.write(b"stop\n")
                    process.stdin.close()
        await asyncio.gather(*(_wait_or_kill(process) for process in processes))


# -- the operator ---------------------------------------------------------------------------------


@dataclass
class Measured:
    server: str
    agents: int
    subscribed: int = 0
    settle_s: float | None = None  # the wait for the gateway to be idle (`_idle`)
    single_ms: list[float] = field(default_factory=list)
    single_failed: int = 0
    broadcast_s: list[float] = field(default_factory=list)
    broadcast_answers: list[int] = field(default_factory=list)
    # The server process's CPU over each phase (/proc/<pid>/stat).
    single_cpu_s: float | None = None
    broadcast_cpu_s: float | None = None

    @property
    def cpu_us_per_single(self) -> float | None:
        count = len(self.single_ms)
        return 1e6 * self.single_cpu_s / count if self.single_cpu_s is not None and count else None

    @property
    def cpu_us_per_broadcast_answer(self) -> float | None:
        answers = sum(self.broadcast_answers)
        if self.broadcast_cpu_s is None or not answers:
            return None
        return 1e6 * self.broadcast_cpu_s / answers

    def single_percentile(self, q: float) -> float | None:
        if not self.single_ms:
            return None
        ordered = sorted(self.single_ms)
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]

    @property
    def broadcast_median_s(self) -> float | None:
        return statistics.median(self.broadcast_s) if self.broadcast_s else None


def _request(command_id: str, targets: list[str]) -> management_pb2.SendCommandRequest:
    return management_pb2.SendCommandRequest(
        agent_ids=targets,
        command=agent_pb2.CommandRequest(command_id=command_id, plugin="bench", action="noop"),
        timeout_seconds=COMMAND_TIMEOUT_S,
    )


async def _answers(call: Any, started: float) -> tuple[int, int, float]:
    """(terminal answers, of which SUCCESS, seconds from `started` to the last one)."""
    final = ok = 0
    last = started
    async for response in call:
        if response.response.status != _RUNNING:
            final += 1
            ok += response.response.status == _SUCCESS
            last = time.perf_counter()
    return final, ok, last - started


def _cpu(pid: int | None) -> float | None:
    return process_cpu_s(pid) if pid is not None else None


def _spent(pid: int | None, before: float | None) -> float | None:
    after = _cpu(pid)
    return after - before if after is not None and before is not None else None


async def operate(
    result: Measured,
    mgmt_port: int,
    *,
    agents: int,
    rate: float,
    duration_s: float,
    quiet: bool,
    pid: int | None = None,
) -> None:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{mgmt_port}")
    send = channel.unary_stream(
        SEND_COMMAND,
        request_serializer=management_pb2.SendCommandRequest.SerializeToString,
        response_deserializer=management_pb2.SendCommandResponse.FromString,
    )
    rng = random.Random(7)
    try:
        for n in range(WARMUP_COMMANDS):
            await _answers(send(_request(f"w{n}", [agent_id(n % agents)]), timeout=30), 0.0)

        async def single(n: int) -> None:
            started = time.perf_counter()
            target = agent_id(rng.randrange(agents))
            try:
                final, ok, seconds = await _answers(
                    send(_request(f"s{n}", [target]), timeout=CALL_DEADLINE_S), started
                )
            except grpc.aio.AioRpcError:
                final = ok = 0
                seconds = 0.0
            if final == 1 and ok == 1:
                result.single_ms.append(1000.0 * seconds)
            else:
                result.single_failed += 1

        count = max(1, int(rate * duration_s))
        progress(f"{result.server}: {count} single-target commands at {rate:g}/s", quiet)
        loop = asyncio.get_running_loop()
        start = loop.time()
        cpu_before = _cpu(pid)
        tasks = []
        for n in range(count):
            await asyncio.sleep(max(0.0, start + n / rate - loop.time()))
            tasks.append(asyncio.ensure_future(single(n)))
        await asyncio.gather(*tasks)
        result.single_cpu_s = _spent(pid, cpu_before)

        broadcast_cpu_s = 0.0
        for b in range(BROADCASTS):
            progress(f"{result.server}: broadcast {b + 1} of {BROADCASTS} to {agents}", quiet)
            started = time.perf_counter()
            cpu_before = _cpu(pid)
            _, ok, seconds = await _answers(
                send(_request(f"b{b}", []), timeout=CALL_DEADLINE_S), started
            )
            spent = _spent(pid, cpu_before)
            broadcast_cpu_s += spent or 0.0
            result.broadcast_s.append(seconds)
            result.broadcast_answers.append(ok)
            await asyncio.sleep(SETTLE_S)
        result.broadcast_cpu_s = broadcast_cpu_s if pid is not None else None
    finally:
        await channel.close()


async def measure(
    kind: str,
    agents: int,
    loadgens: int,
    rate: float,
    duration_s: float,
    *,
    workdir: Path,
    quiet: bool,
) -> Measured:
    result = Measured(kind, agents)
    async with contextlib.AsyncExitStack() as stack:
        if kind == "gateway":
            endpoint = await stack.enter_async_context(gateway_node(workdir, agents))
        else:
            endpoint = await stack.enter_async_context(bare_relay(workdir))
        progress(f"{kind}: {agents} agents from {loadgens} load generators", quiet)
        result.subscribed, _ = await stack.enter_async_context(
            load_generators(workdir, endpoint.agent_port, agents, loadgens)
        )
        if endpoint.metrics_port is not None:
            await _held(endpoint.metrics_port, result.subscribed)
            result.settle_s = await _idle(endpoint.metrics_port, agents)
        await asyncio.sleep(SETTLE_S)
        await operate(
            result,
            endpoint.mgmt_port,
            agents=agents,
            rate=rate,
            duration_s=duration_s,
            quiet=quiet,
            pid=endpoint.pid,
        )
    return result


async def _held(metrics_port: int, agents: int) -> None:
    """Wait until the gateway holds every subscribed agent (its owners registered)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        _, body = await http_get(metrics_port, "/metrics")
        if metric_sum(body.decode(errors="replace"), "yuzu_gw_agents_current") >= agents:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError("the gateway did not hold every subscribed agent")


async def _idle(metrics_port: int, agents: int) -> float:
    """Wait until the gateway has told the fake server of every stream of the cold wave (no
    NotifyStreamStatus held or in flight, twice in a row), so that the commands are measured on
    a settled node as the bare relay's are; the seconds waited."""
    started = time.monotonic()
    deadline = started + START_TIMEOUT_S + agents / IDLE_NOTIFY_RATE
    quiet = 0
    while quiet < 2:
        if time.monotonic() > deadline:
            raise RuntimeError("the gateway did not finish notifying the cold wave")
        _, body = await http_get(metrics_port, "/metrics")
        text = body.decode(errors="replace")
        busy = sum(metric_sum(text, name) for name in NOTIFY_BUSY)
        quiet = quiet + 1 if busy == 0 else 0
        await asyncio.sleep(IDLE_POLL_S)
    return time.monotonic() - started


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


async def run(
    agents: int, loadgens: int, *, rate: float, duration_s: float, quiet: bool, keep: Path | None
) -> dict[str, Any]:
    with contextlib.ExitStack() as scope:
        if keep is None:
            workdir = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="yuzu-bench-")))
        else:
            workdir = keep
            workdir.mkdir(parents=True)
        results = {}
        for kind in ("gateway", "bare"):
            (workdir / kind).mkdir()
            results[kind] = await measure(
                kind, agents, loadgens, rate, duration_s, workdir=workdir / kind, quiet=quiet
            )
    gateway, bare = results["gateway"], results["bare"]
    single_p99, bare_p99 = gateway.single_percentile(0.99), bare.single_percentile(0.99)
    broadcast, bare_broadcast = gateway.broadcast_median_s, bare.broadcast_median_s
    single_ratio = _ratio(single_p99, bare_p99)
    broadcast_ratio = _ratio(broadcast, bare_broadcast)
    answers = min(gateway.broadcast_answers, default=0)
    commands = max(1, int(rate * duration_s))
    return {
        "benchmark": NAME,
        "agents": agents,
        "load_generators": loadgens,
        "rate_per_s": rate,
        "duration_s": duration_s,
        "subscribed": gateway.subscribed,
        "gateway_settle_s": gateway.settle_s,
        "single_commands": commands,
        "single_failed": gateway.single_failed,
        "single_p50_ms": gateway.single_percentile(0.5),
        "single_p99_ms": single_p99,
        "bare_single_p50_ms": bare.single_percentile(0.5),
        "bare_single_p99_ms": bare_p99,
        "single_p99_ratio_vs_bare": single_ratio,
        "broadcast_s": broadcast,
        "broadcast_runs_s": gateway.broadcast_s,
        "bare_broadcast_s": bare_broadcast,
        "bare_broadcast_runs_s": bare.broadcast_s,
        "broadcast_ratio_vs_bare": broadcast_ratio,
        "answers": answers,
        "bare_answers": min(bare.broadcast_answers, default=0),
        "bare_single_failed": bare.single_failed,
        # The server's CPU per answered single-target command (the whole process: the operator's
        # call, the router, the owner, the agent stream) and per broadcast answer.
        "cpu_us_per_single_command": gateway.cpu_us_per_single,
        "bare_cpu_us_per_single_command": bare.cpu_us_per_single,
        "cpu_us_per_broadcast_answer": gateway.cpu_us_per_broadcast_answer,
        "bare_cpu_us_per_broadcast_answer": bare.cpu_us_per_broadcast_answer,
        "targets_met": {
            "all_answered": gateway.single_failed == 0 and answers == agents,
            "single_p99_ratio_vs_bare": single_ratio is not None and single_ratio <= TARGET_RATIO,
            "broadcast_ratio_vs_bare": broadcast_ratio is not None
            and broadcast_ratio <= TARGET_RATIO,
        },
        "environment": environment(),
    }


def _fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def rows(result: dict[str, Any]) -> list[Row]:
    met = result["targets_met"]
    n = result["agents"]
    return [
        Row(
            "answered: single failed / broadcast answers",
            f"{result['single_failed']} / {result['answers']}",
            f"0 / {n}",
            met["all_answered"],
        ),
        Row("gateway settle after the cold wave", _fmt(result["gateway_settle_s"], 1, " s")),
        Row(
            "single-target p50, gateway / bare",
            f"{_fmt(result['single_p50_ms'], 2, ' ms')}"
            f" / {_fmt(result['bare_single_p50_ms'], 2, ' ms')}",
        ),
        Row(
            "single-target p99, gateway / bare",
            f"{_fmt(result['single_p99_ms'], 2, ' ms')}"
            f" / {_fmt(result['bare_single_p99_ms'], 2, ' ms')}",
        ),
        Row(
            "single-target p99 ratio vs bare",
            _fmt(result["single_p99_ratio_vs_bare"]),
            f"<= {TARGET_RATIO}",
            met["single_p99_ratio_vs_bare"],
        ),
        Row(
            "broadcast to all, gateway / bare",
            f"{_fmt(result['broadcast_s'], 3, ' s')} / {_fmt(result['bare_broadcast_s'], 3, ' s')}",
        ),
        Row(
            "server CPU per single-target command, gateway / bare",
            f"{_fmt(result['cpu_us_per_single_command'], 0, ' us')}"
            f" / {_fmt(result['bare_cpu_us_per_single_command'], 0, ' us')}",
        ),
        Row(
            "server CPU per broadcast answer, gateway / bare",
            f"{_fmt(result['cpu_us_per_broadcast_answer'], 1, ' us')}"
            f" / {_fmt(result['bare_cpu_us_per_broadcast_answer'], 1, ' us')}",
        ),
        Row(
            "broadcast ratio vs bare",
            _fmt(result["broadcast_ratio_vs_bare"]),
            f"<= {TARGET_RATIO}",
            met["broadcast_ratio_vs_bare"],
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.fanout", description=__doc__)
    parser.add_argument("--agents", type=int, default=DEFAULT_AGENTS)
    parser.add_argument(
        "--loadgens", type=int, help="load-generator processes (default: one per 2,500 agents)"
    )
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="single-target commands/s")
    parser.add_argument("--duration-s", type=float, default=DEFAULT_DURATION_S)
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--keep-logs", type=Path, help="a new directory to keep every process's log in"
    )
    add_common_arguments(parser, NAME)
    args = parser.parse_args(argv)
    if args.agents <= 0 or args.rate <= 0 or args.duration_s <= 0:
        parser.error("--agents, --rate and --duration-s must be positive")
    loadgens = args.loadgens or math.ceil(args.agents / AGENTS_PER_LOADGEN)
    result = asyncio.run(
        run(
            args.agents,
            loadgens,
            rate=args.rate,
            duration_s=args.duration_s,
            quiet=args.quiet,
            keep=args.keep_logs,
        )
    )
    report(result, rows(result), args.out, args.json)


if __name__ == "__main__":
    main()
