"""Benchmark of heartbeat ingest: `python -m tests.bench.heartbeats [--agents N] [--json]`.

Workload (issue 5, section 5 (a)): N agents in a few load-generator processes
(`tests.bench.heartbeats_loadgen`), one grpcio channel (one HTTP/2 connection) each, register and
subscribe to a gateway node started as a subprocess (`python -m gateway`) whose upstream channel
dials the fake server (`gateway.devstack.fake_upstream`, run in this process). Then every agent
sends Heartbeats with 30 status tags back to back, the next as soon as the previous is answered,
for a warm-up and then a measured window.

The same run measures the ceiling: the bare grpclib server (`tests.bench.heartbeats_bare`: only
AgentService.Heartbeat, answered at once, no actors) under the same load generators sending the
same messages (without registering: it admits anything).

Reported for each server, over the window: admitted (acknowledged) heartbeats per second and the
server's CPU per heartbeat (/proc/<pid>/stat). For the gateway also the upstream bytes per
admitted heartbeat (the BatchHeartbeat requests the fake server received in the window, encoded
size, over the heartbeats admitted in it: the buffer keeps one entry per session, so a session
heartbeating many times a second costs one entry a flush), the BatchHeartbeat calls and entries,
the heartbeats refused and the buffer's drops (`/metrics`).

Target: the gateway admits at least 0.8 x the bare server's rate (`ratio_vs_bare`), so that
admission, buffering and flushing cost at most a fifth of the transport's own cost. On a 2-CPU
machine the load generators and the server share the CPUs: read `cpu_ratio_vs_bare` (the bare
server's CPU per heartbeat over the gateway's) beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from gateway.devstack.fake_upstream import Call, FakeUpstream
from tests.bench.agents import (
    START_TIMEOUT_S,
    Server,
    _listening_port,
    _spawn,
    _stop,
    _wait_or_kill,
    gateway_node,
    http_get,
    metric_sum,
    process_cpu_s,
)
from tests.bench.common import Row, add_common_arguments, environment, report
from tests.bench.heartbeats_loadgen import DEFAULT_TAGS, heartbeat_request, made_up_session_id

NAME = "heartbeats"

DEFAULT_AGENTS = 100
DEFAULT_LOADGENS = 2
DEFAULT_WARMUP_S = 3.0
DEFAULT_WINDOW_S = 10.0
TARGET_RATIO = 0.8
# The node runs the shipped flush interval (C31, 1 s), not test.config's 100 ms: upstream bytes
# per heartbeat depend on it.
INTERVAL_ENV = "YUZU_GW_HEARTBEAT_INTERVAL_MS"
DEFAULT_FLUSH_INTERVAL_MS = 1000
SETTLE_S = 0.5


@dataclass(frozen=True)
class Workload:
    """N agents in `loadgens` processes, each heartbeating for `warmup_s` then `window_s`."""

    agents: int = DEFAULT_AGENTS
    loadgens: int = DEFAULT_LOADGENS
    warmup_s: float = DEFAULT_WARMUP_S
    window_s: float = DEFAULT_WINDOW_S
    tags: int = DEFAULT_TAGS
    flush_interval_ms: int = DEFAULT_FLUSH_INTERVAL_MS


def progress(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


# -- the fake server's view of the flushes ------------------------------------------------------


@dataclass
class Flushes:
    """BatchHeartbeat requests the fake server received: calls, entries, encoded bytes."""

    calls: int = 0
    entries: int = 0
    bytes: int = 0

    def on_call(self, call: Call) -> None:
        if call.method == "BatchHeartbeat":
            self.calls += 1
            self.entries += len(call.request.heartbeats)
            self.bytes += call.request.ByteSize()

    def since(self, before: Flushes) -> Flushes:
        return Flushes(
            self.calls - before.calls, self.entries - before.entries, self.bytes - before.bytes
        )

    def copy(self) -> Flushes:
        return Flushes(self.calls, self.entries, self.bytes)


# -- servers and load generators -----------------------------------------------------------------


@contextlib.asynccontextmanager
async def bare_server(workdir: Path) -> AsyncIterator[Server]:
    process = await _spawn(
        "-m",
        "tests.bench.heartbeats_bare",
        log=workdir / "bare.log",
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        yield Server(process.pid, await _listening_port(process, "the bare server"))
    finally:
        await _stop(process)


class LoadGenerators:
    """The load-generator processes, each holding its share of the agents."""

    def __init__(self, processes: list[asyncio.subprocess.Process]) -> None:
        self.processes = processes

    @classmethod
    @contextlib.asynccontextmanager
    async def started(
        cls, workdir: Path, port: int, load: Workload, *, join: bool
    ) -> AsyncIterator[tuple[LoadGenerators, int]]:
        """Yields the generators and how many agents are ready (joined, with `join`)."""
        agents = load.agents
        share = math.ceil(agents / load.loadgens)
        processes: list[asyncio.subprocess.Process] = []
        try:
            for index in range(load.loadgens):
                first = index * share
                mine = min(share, agents - first)
                if mine <= 0:
                    break
                args = ["--target", f"127.0.0.1:{port}", "--count", str(mine)]
                args += ["--first", str(first), "--tags", str(load.tags)]
                processes.append(
                    await _spawn(
                        "-m",
                        "tests.bench.heartbeats_loadgen",
                        *args,
                        *(() if join else ("--no-join",)),
                        log=workdir / f"loadgen-{index}.log",
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                    )
                )
            generators = cls(processes)
            ready = 0
            for line in await generators._read_all(START_TIMEOUT_S + agents / 20.0):
                parts = line.split()
                if len(parts) != 3 or parts[0] != "ready":
                    raise RuntimeError(f"a load generator did not start: {line!r}")
                ready += int(parts[1])
            yield generators, ready
        finally:
            for process in processes:
                if process.stdin is not None and not process.stdin.is_closing():
                    with contextlib.suppress(OSError):
                        process.stdin.write(b"stop\n")
                        process.stdin.close()
            await asyncio.gather(*(_wait_or_kill(process) for process in processes))

    async def _read_all(self, timeout: float) -> list[str]:
        async def one(process: asyncio.subprocess.Process) -> str:
            assert process.stdout is not None
            return (await process.stdout.readline()).decode().strip()

        return list(
            await asyncio.wait_for(asyncio.gather(*(one(p) for p in self.processes)), timeout)
        )

    def run(self, warmup_s: float, window_s: float) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(f"run {warmup_s:g} {window_s:g}\n".encode())

    async def counts(self, timeout: float) -> tuple[int, int]:
        ok = failed = 0
        for line in await self._read_all(timeout):
            parts = line.split()
            if len(parts) != 3 or parts[0] != "heartbeats":
                raise RuntimeError(f"a load generator failed: {line!r}")
            ok += int(parts[1])
            failed += int(parts[2])
        return ok, failed


# -- one phase -------------------------------------------------------------------------------------


@dataclass
class Phase:
    server: str
    ready: int
    window_s: float
    acknowledged: int
    failed: int
    cpu_s: float
    flushes: Flushes | None = None
    metrics: dict[str, float] | None = None

    @property
    def per_s(self) -> float:
        return self.acknowledged / self.window_s

    @property
    def cpu_us_per_heartbeat(self) -> float | None:
        return 1e6 * self.cpu_s / self.acknowledged if self.acknowledged else None


_GATEWAY_METRICS = (
    "yuzu_gw_heartbeat_rejected_total",
    "yuzu_gw_heartbeat_session_mismatch_total",
    "yuzu_gw_heartbeat_buffer_dropped_total",
    "yuzu_gw_heartbeat_coalesced_total",
    "yuzu_gw_event_loop_max_stall_seconds",
)


async def phase(kind: str, load: Workload, *, workdir: Path, quiet: bool) -> Phase:
    """One server under the load generators: `gateway` (agents join first, the fake server
    counts the flushes) or `bare`."""
    gateway = kind == "gateway"
    flushes = Flushes() if gateway else None
    async with contextlib.AsyncExitStack() as stack:
        if flushes is not None:
            fake = await stack.enter_async_context(FakeUpstream(on_call=flushes.on_call))
            # gateway_node copies this process's environment when it starts the node.
            with mock.patch.dict(os.environ, {INTERVAL_ENV: str(load.flush_interval_ms)}):
                node = gateway_node(workdir, load.agents, fake.port)
                server = await stack.enter_async_context(node)
        else:
            server = await stack.enter_async_context(bare_server(workdir))
        progress(f"{kind}: {load.agents} agents from {load.loadgens} load generators", quiet)
        generators, ready = await stack.enter_async_context(
            LoadGenerators.started(workdir, server.agent_port, load, join=gateway)
        )
        progress(
            f"{kind}: {ready} ready; heartbeating {load.warmup_s:g} + {load.window_s:g} s", quiet
        )
        await asyncio.sleep(SETTLE_S)
        generators.run(load.warmup_s, load.window_s)
        await asyncio.sleep(load.warmup_s)
        cpu_before = process_cpu_s(server.pid)
        flushed_before = None if flushes is None else flushes.copy()
        await asyncio.sleep(load.window_s)
        cpu_s = process_cpu_s(server.pid) - cpu_before
        if flushes is not None and flushed_before is not None:
            flushes = flushes.since(flushed_before)
        acknowledged, failed = await generators.counts(START_TIMEOUT_S)
        result = Phase(kind, ready, load.window_s, acknowledged, failed, cpu_s, flushes)
        if server.metrics_port is not None:
            _, body = await http_get(server.metrics_port, "/metrics")
            text = body.decode(errors="replace")
            result.metrics = {name: metric_sum(text, name) for name in _GATEWAY_METRICS}
        return result


# -- the run -------------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


async def run(load: Workload, quiet: bool, *, keep: Path | None = None) -> dict[str, Any]:
    """One run, gateway then bare; `keep`: a new directory for the processes' logs."""
    with contextlib.ExitStack() as scope:
        if keep is None:
            workdir = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="yuzu-bench-")))
        else:
            workdir = keep
            workdir.mkdir(parents=True)
        (workdir / "gateway").mkdir()
        (workdir / "bare").mkdir()
        gateway = await phase("gateway", load, workdir=workdir / "gateway", quiet=quiet)
        bare = await phase("bare", load, workdir=workdir / "bare", quiet=quiet)
    heartbeat_bytes = heartbeat_request(made_up_session_id(0), load.tags).ByteSize()
    flushes = gateway.flushes or Flushes()
    metrics = gateway.metrics or {}
    ratio = _ratio(gateway.per_s, bare.per_s)
    cpu_ratio = _ratio(bare.cpu_us_per_heartbeat, gateway.cpu_us_per_heartbeat)
    progress(
        f"gateway {gateway.per_s:.0f}/s, bare {bare.per_s:.0f}/s, ratio"
        f" {'n/a' if ratio is None else f'{ratio:.2f}'}",
        quiet,
    )
    return {
        "benchmark": NAME,
        "agents": load.agents,
        "load_generators": load.loadgens,
        "tags": load.tags,
        "heartbeat_bytes": heartbeat_bytes,
        "warmup_s": load.warmup_s,
        "window_s": load.window_s,
        "flush_interval_ms": load.flush_interval_ms,
        "joined": gateway.ready,
        "heartbeats_per_s": gateway.per_s,
        "bare_per_s": bare.per_s,
        "ratio_vs_bare": ratio,
        "heartbeats_acknowledged": gateway.acknowledged,
        "heartbeats_failed": gateway.failed,
        "bare_heartbeats_acknowledged": bare.acknowledged,
        "bare_heartbeats_failed": bare.failed,
        "cpu_us_per_heartbeat": gateway.cpu_us_per_heartbeat,
        "bare_cpu_us_per_heartbeat": bare.cpu_us_per_heartbeat,
        "cpu_ratio_vs_bare": cpu_ratio,
        "upstream_bytes_per_heartbeat": _ratio(flushes.bytes, gateway.acknowledged),
        "batch_heartbeat_calls": flushes.calls,
        "batch_heartbeat_entries": flushes.entries,
        "batch_heartbeat_bytes": flushes.bytes,
        "heartbeats_rejected_total": metrics.get("yuzu_gw_heartbeat_rejected_total"),
        "heartbeat_mismatch_total": metrics.get("yuzu_gw_heartbeat_session_mismatch_total"),
        "buffer_dropped_total": metrics.get("yuzu_gw_heartbeat_buffer_dropped_total"),
        "coalesced_total": metrics.get("yuzu_gw_heartbeat_coalesced_total"),
        "max_loop_stall_ms": (
            1000.0 * metrics["yuzu_gw_event_loop_max_stall_seconds"]
            if "yuzu_gw_event_loop_max_stall_seconds" in metrics
            else None
        ),
        "targets_met": {
            "all_joined": gateway.ready == load.agents,
            "no_heartbeat_failed": gateway.failed == 0,
            "ratio_vs_bare": ratio is not None and ratio >= TARGET_RATIO,
        },
        "environment": environment(),
    }


def _fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def rows(result: dict[str, Any]) -> list[Row]:
    met = result["targets_met"]
    n = result["agents"]
    return [
        Row("agents joined", f"{result['joined']} of {n}", f"{n}", met["all_joined"]),
        Row(
            "gateway: heartbeats admitted per second",
            _fmt(result["heartbeats_per_s"], 0, "/s"),
        ),
        Row("bare grpclib server: heartbeats per second", _fmt(result["bare_per_s"], 0, "/s")),
        Row(
            "rate, gateway / bare",
            _fmt(result["ratio_vs_bare"]),
            f">= {TARGET_RATIO}",
            met["ratio_vs_bare"],
        ),
        Row(
            "heartbeats failed (gateway)",
            str(result["heartbeats_failed"]),
            "0",
            met["no_heartbeat_failed"],
        ),
        Row("gateway CPU per heartbeat", _fmt(result["cpu_us_per_heartbeat"], 0, " us")),
        Row("bare CPU per heartbeat", _fmt(result["bare_cpu_us_per_heartbeat"], 0, " us")),
        Row("CPU per heartbeat, bare / gateway", _fmt(result["cpu_ratio_vs_bare"])),
        Row("heartbeat request size", f"{result['heartbeat_bytes']} B"),
        Row(
            "upstream bytes per admitted heartbeat",
            _fmt(result["upstream_bytes_per_heartbeat"], 1, " B"),
        ),
        Row(
            "BatchHeartbeat calls / entries in the window",
            f"{result['batch_heartbeat_calls']} / {result['batch_heartbeat_entries']}",
        ),
        Row("buffer drops (all reasons)", _fmt(result["buffer_dropped_total"], 0)),
        Row("longest event-loop stall", _fmt(result["max_loop_stall_ms"], 1, " ms")),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.heartbeats", description=__doc__)
    parser.add_argument("--agents", type=int, default=DEFAULT_AGENTS)
    parser.add_argument("--loadgens", type=int, default=DEFAULT_LOADGENS)
    parser.add_argument("--warmup-s", type=float, default=DEFAULT_WARMUP_S)
    parser.add_argument("--window-s", type=float, default=DEFAULT_WINDOW_S)
    parser.add_argument("--tags", type=int, default=DEFAULT_TAGS)
    parser.add_argument(
        "--flush-interval-ms",
        type=int,
        default=DEFAULT_FLUSH_INTERVAL_MS,
        help="the node's heartbeat_batch_interval_ms (default: the shipped 1000)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--keep-logs", type=Path, help="a new directory to keep every process's log in"
    )
    add_common_arguments(parser, NAME)
    args = parser.parse_args(argv)
    if args.agents <= 0 or args.loadgens <= 0 or args.window_s <= 0 or args.warmup_s < 0:
        parser.error("--agents, --loadgens and --window-s must be positive")
    load = Workload(
        args.agents, args.loadgens, args.warmup_s, args.window_s, args.tags, args.flush_interval_ms
    )
    result = asyncio.run(run(load, args.quiet, keep=args.keep_logs))
    report(result, rows(result), args.out, args.json)


if __name__ == "__main__":
    main()
