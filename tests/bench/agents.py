"""Benchmark of a cold wave of agents: `python -m tests.bench.agents [--agents N] [--json]`.

Workload (issue 4, section 7): N agents, each one grpcio channel (one HTTP/2 connection) in a few
load-generator processes (`tests.bench.agents_loadgen`), register (a RegisterRequest of about
2 KB) and subscribe all at once, against a gateway node started as a subprocess
(`python -m gateway`) whose upstream channel dials the fake server
(`gateway.devstack.fake_upstream`, a subprocess answering in 2 ms). The streams stay open.

The same run measures the ceiling: the bare grpclib server (`tests.bench.agents_bare`, no
actors, the same two upstream calls per agent) under the same load generators, against a fresh
fake server.

For each server: the time until every agent is subscribed and the fake server has received N
NotifyStreamStatus calls (counted from its `--verbose` call log), the server's CPU seconds
(/proc/<pid>/stat) and RSS growth (/proc/<pid>/status) from before the wave to after it, both
divided by N. For the gateway also the notifications dropped and lost (`/metrics`).

Targets: 0 notifications dropped; CPU per agent joined within 1.3x the bare server's; memory
per held agent, less the bytes of the Register the gateway keeps for replay, within 1.25x the
bare server's per held stream.

Then, for the gateway only, the held agents heartbeat (each one Heartbeat every
`HEARTBEAT_INTERVAL_S` on its own channel, spread evenly) for `HEARTBEAT_WINDOW_S`. The longest
event-loop stall while they are held and heartbeating (the issue's measure) comes from the node's
`yuzu_gw_event_loop_stall_seconds` histogram read before and after the window: the upper bound
of the lowest bucket holding every wake-up of the window (so "at most", to the bucket's
resolution). Target: under 50 ms. The longest stall of the cold wave
(`yuzu_gw_event_loop_max_stall_seconds` read before the window) is reported beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.node.metrics import GC_GENERATIONS
from gateway.listeners.server import REUSEPORT_VAR
from gateway.node.multinode import NODE_COUNT_VAR, NODE_INDEX_VAR
from tests.bench.agents_loadgen import register_request
from tests.bench.common import (
    REPO_ROOT,
    Row,
    add_common_arguments,
    environment,
    process_cpu_s,
    report,
)

NAME = "agents"

DEFAULT_AGENTS = 1000
DEFAULT_LATENCY_MS = 2.0
REGISTER_BYTES = 2048
AGENTS_PER_LOADGEN = 4500  # well under the 20,000 open-file limit of a process
TARGET_CPU_RATIO = 1.3
TARGET_MEMORY_RATIO = 1.25
TARGET_MAX_STALL_MS = 50.0
# The stock agent's cadence (seed: "30 s heartbeat cadence" in the rig runs); a window of one
# interval gives every held agent one heartbeat.
HEARTBEAT_INTERVAL_S = 30.0
HEARTBEAT_WINDOW_S = 30.0
MAX_STALL_METRIC = "yuzu_gw_event_loop_max_stall_seconds"
STALL_BUCKET_METRIC = "yuzu_gw_event_loop_stall_seconds_bucket"
BUSY_STALL_BUCKET_METRIC = "yuzu_gw_event_loop_busy_stall_seconds_bucket"
GC_PAUSE_BUCKET_METRIC = "yuzu_gw_gc_pause_seconds_bucket"
FULL_GC_SAMPLE = 'python_gc_collections_total{generation="2"}'
START_TIMEOUT_S = 60.0
SETTLE_S = 1.0
# How long the announcements may trail the last agent's join: up to 10 notifications are in
# flight (the seed's cap) while a saturated node serves 48 Registers at once, so at 10,000
# agents on two cores the CONNECTED calls of the wave's tail trail it by seconds.
ANNOUNCE_WAIT_S = 60.0
STOP_TIMEOUT_S = 10.0
TEST_CONFIG = REPO_ROOT / "sys_config" / "test.config"
VM_ARGS = REPO_ROOT / "sys_config" / "vm.args"

_LISTENING = re.compile(rb"listening on ([\d.]+):(\d+)")
_NOTIFY_LINE = b"NotifyStreamStatus from"


def default_loadgens(agents: int) -> int:
    return max(2, math.ceil(agents / AGENTS_PER_LOADGEN))


def progress(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


# -- /proc ----------------------------------------------------------------------------------------


def process_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_ports(count: int) -> int:
    """The first of `count` consecutive free loopback ports (node k of a multi-node host holds
    the configured health and metrics ports + k - 1)."""
    for _ in range(100):
        first = free_port()
        with contextlib.ExitStack() as probes:
            try:
                for port in range(first + 1, first + count):
                    probe = probes.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return first
    raise RuntimeError(f"no {count} consecutive free ports")


# -- subprocesses ---------------------------------------------------------------------------------


async def _stop(process: asyncio.subprocess.Process, sig: int = signal.SIGTERM) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(sig)
    try:
        await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def _spawn(*args: str, log: Path | None = None, **kwargs: Any) -> asyncio.subprocess.Process:
    stderr: Any = subprocess.DEVNULL
    if log is not None:
        stderr = log.open("ab")
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, *args, cwd=REPO_ROOT, stderr=stderr, **kwargs
        )
    finally:
        if log is not None:
            stderr.close()


async def _listening_port(process: asyncio.subprocess.Process, what: str) -> int:
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT_S)
    match = _LISTENING.search(line)
    if match is None:
        raise RuntimeError(f"{what} did not start: {line!r}")
    return int(match.group(2))


@dataclass
class Fake:
    port: int
    notified: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.asynccontextmanager
async def fake_server(latency_ms: float) -> AsyncIterator[Fake]:
    """The fake server in a subprocess, every call answered after `latency_ms`; counts the
    NotifyStreamStatus calls it logs (`--verbose`)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.devstack.fake_upstream",
        "--port",
        "0",
        "--latency-ms",
        f"*={latency_ms:g}",
        "--verbose",
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    counter: asyncio.Task[None] | None = None
    try:
        fake = Fake(await _listening_port(process, "the fake server"))

        async def count() -> None:
            assert process.stderr is not None
            while line := await process.stderr.readline():
                if line.startswith(_NOTIFY_LINE):
                    fake.notified += 1
                    fake.changed.set()

        counter = asyncio.get_running_loop().create_task(count())
        yield fake
    finally:
        await _stop(process)
        if counter is not None:
            counter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await counter


# The test posture's lift of the storm bound (sys_config/test.config: its clients do not wait
# out a hint); `production_admission` drops it, so a node admits with its defaults.
_ADMISSION_LIFT = re.compile(
    r"^ *\{(register|subscribe)_admission_pending_max, \d+\},\n"
    r"|^ *\{admission_drain_target_ms, \d+\},\n",
    re.MULTILINE,
)


def gateway_config(
    path: Path,
    agents: int,
    fake_port: int,
    *,
    production_admission: bool = False,
    nodes: int = 1,
) -> dict[str, int]:
    """The test config with fixed free loopback ports, room for the agents, and an
    upstream_client dialing the fake server (with the default admission when
    `production_admission`); returns the ports, node 1's where `nodes` share the host."""
    ports = {"agent": free_port(), "health": free_ports(nodes), "metrics": free_ports(nodes)}
    text = TEST_CONFIG.read_text()
    if production_admission:
        text, lifted = _ADMISSION_LIFT.subn("", text)
        if lifted != 3:
            raise RuntimeError(f"{TEST_CONFIG}: the admission lift is not where it was")
    text = text.replace("{health_port, 0}", f"{{health_port, {ports['health']}}}")
    text = text.replace("{prometheus_port, 0}", f"{{prometheus_port, {ports['metrics']}}}")
    # The first listener is the agent one; the others keep port 0 (a free port each).
    text = text.replace(
        "listen => #{port => 0, ip => {127,0,0,1}}",
        f"listen => #{{port => {ports['agent']}, ip => {{127,0,0,1}}}}",
        1,
    )
    text = text.replace("max_connections => 1000", f"max_connections => {max(1000, agents + 100)}")
    upstream = (
        "{upstream_client, #{channels => [{default_channel,"
        f' [{{http, "127.0.0.1", {fake_port}, []}}], #{{}}}}]}}}}'
    )
    text = text.replace("{allow_no_upstream, true}", upstream)
    path.write_text(text)
    return ports


async def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    async def fetch() -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body

    return await asyncio.wait_for(fetch(), timeout)


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of `name` (all label sets) in a Prometheus exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class Server:
    pid: int
    agent_port: int
    metrics_port: int | None = None
    # A gateway's, to start it again on the same ports (`tests.bench.storm`'s restart).
    health_port: int | None = None
    config: Path | None = None
    # Nodes 2..N of a multi-node host (`tests.bench.storm --nodes`), sharing the agent port;
    # node k's health and metrics ports are node 1's + k - 1.
    siblings: tuple[int, ...] = ()

    @property
    def pids(self) -> tuple[int, ...]:
        return (self.pid, *self.siblings)

    @property
    def metrics_ports(self) -> list[int]:
        if self.metrics_port is None:
            return []
        return [self.metrics_port + k for k in range(len(self.pids))]


@contextlib.asynccontextmanager
async def gateway_node(
    workdir: Path,
    agents: int,
    fake_port: int,
    *,
    production_admission: bool = False,
    nodes: int = 1,
) -> AsyncIterator[Server]:
    """One node, or `nodes` on one host as `rel/yuzu_gw start --nodes N` runs them (each its own
    process, the listener port shared through SO_REUSEPORT, docs/multinode.md)."""
    config = workdir / "bench.config"
    ports = gateway_config(
        config, agents, fake_port, production_admission=production_admission, nodes=nodes
    )
    async with running_nodes(workdir, config, ports["health"], nodes) as processes:
        first, *others = (process.pid for process in processes)
        yield Server(
            first, ports["agent"], ports["metrics"], ports["health"], config, tuple(others)
        )


@contextlib.asynccontextmanager
async def running_nodes(
    workdir: Path, config: Path, health_port: int, nodes: int
) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """`running_gateway` for each of a host's `nodes`, node 1 first; yields once all are ready."""
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                running_gateway(workdir, config, health_port, node=(k, nodes))
            )
            for k in range(1, nodes + 1)
        ]


def node_env(node: tuple[int, int]) -> dict[str, str]:
    """Node k of N's variables, as the release supervisor sets them; none for one node."""
    index, count = node
    if count == 1:
        return {}
    return {
        NODE_INDEX_VAR: str(index),
        NODE_COUNT_VAR: str(count),
        REUSEPORT_VAR: "1",
    }


@contextlib.asynccontextmanager
async def running_gateway(
    workdir: Path, config: Path, health_port: int, *, node: tuple[int, int] = (1, 1)
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`python -m gateway` booted from `config` with a fresh cookie and run directory under
    `workdir`, its log in `workdir/gateway.log`; yields once /readyz answers 200, stops it. A
    second boot in the same `workdir` is a restart: the run directory is the first one's.
    `node`: (k, N), node k of N on this host, with a run directory and log of its own
    (`run-k`, `gateway-k.log`) and its health port offset."""
    index, count = node
    suffix = "" if count == 1 else f"-{index}"
    run_dir = workdir / f"run{suffix}"
    run_dir.mkdir(exist_ok=True)
    health_port += index - 1
    env = dict(os.environ)
    env.update(
        YUZU_GW_CONFIG=str(config),
        YUZU_GW_VM_ARGS=str(VM_ARGS),
        YUZU_GW_COOKIE=secrets.token_hex(32),
        YUZU_GW_RUN_DIR=str(run_dir),
        **node_env(node),
    )
    log = workdir / f"gateway{suffix}.log"
    process = await _spawn(
        "-m", "gateway", log=log, env=env, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"the gateway exited {process.returncode}; see {log}")
            with contextlib.suppress(OSError, TimeoutError, IndexError, ValueError):
                status, _ = await http_get(health_port, "/readyz", 2.0)
                if status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway was not ready within {START_TIMEOUT_S} s")
            await asyncio.sleep(0.1)
        yield process
    finally:
        await _stop(process)


@contextlib.asynccontextmanager
async def bare_server(workdir: Path, fake_port: int) -> AsyncIterator[Server]:
    process = await _spawn(
        "-m",
        "tests.bench.agents_bare",
        "--upstream",
        f"127.0.0.1:{fake_port}",
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
        # The longest any heartbeat of the last window started after its due time, over every
        # generator: how far the offered load was from evenly spread (a generator's own stall
        # sends what fell due meanwhile as one burst).
        self.send_late_max_s = 0.0

    @classmethod
    @contextlib.asynccontextmanager
    async def started(
        cls, workdir: Path, port: int, agents: int, count: int
    ) -> AsyncIterator[LoadGenerators]:
        share = math.ceil(agents / count)
        processes: list[asyncio.subprocess.Process] = []
        try:
            for index in range(count):
                first = index * share
                mine = min(share, agents - first)
                if mine <= 0:
                    break
                processes.append(
                    await _spawn(
                        "-m",
                        "tests.bench.agents_loadgen",
                        "--target",
                        f"127.0.0.1:{port}",
                        "--count",
                        str(mine),
                        "--first",
                        str(first),
                        "--register-bytes",
                        str(REGISTER_BYTES),
                        log=workdir / f"loadgen-{index}.log",
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                    )
                )
            generators = cls(processes)
            for line in await generators._read_all():
                if line != "ready":
                    raise RuntimeError(f"a load generator did not start: {line!r}")
            yield generators
        finally:
            for process in processes:
                if process.stdin is not None and not process.stdin.is_closing():
                    with contextlib.suppress(OSError):
                        process.stdin.write(b"stop\n")
                        process.stdin.close()
            await asyncio.gather(*(_wait_or_kill(process) for process in processes))

    async def _read_all(self, timeout: float = START_TIMEOUT_S) -> list[str]:
        async def one(process: asyncio.subprocess.Process) -> str:
            assert process.stdout is not None
            return (await process.stdout.readline()).decode().strip()

        return list(
            await asyncio.wait_for(asyncio.gather(*(one(p) for p in self.processes)), timeout)
        )

    def go(self) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(b"go\n")

    async def heartbeats(self, window: float, interval: float) -> tuple[int, int]:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(f"heartbeat {window:g} {interval:g}\n".encode())
        ok = failed = 0
        late_ms = 0.0
        for line in await self._read_all(window + START_TIMEOUT_S):
            parts = line.split()
            if len(parts) != 4 or parts[0] != "heartbeats":
                raise RuntimeError(f"a load generator failed: {line!r}")
            ok += int(parts[1])
            failed += int(parts[2])
            late_ms = max(late_ms, float(parts[3]))
        self.send_late_max_s = late_ms / 1000.0
        return ok, failed

    def rejoin(self) -> None:
        """Every agent joins again once its stream ends; read the outcome with `joined`."""
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(b"rejoin\n")

    async def joined(self, timeout: float) -> Joined:
        """The outcome over every generator once its wave has ended."""
        outcome = Joined()
        for line in await self._read_all(timeout):
            parts = line.split()
            if len(parts) != 6 or parts[0] != "subscribed":
                raise RuntimeError(f"a load generator failed: {line!r}")
            outcome.subscribed += int(parts[1])
            outcome.failed += int(parts[2])
            outcome.retries += int(parts[4])
            outcome.connect_timeouts += int(parts[5])
        return outcome


@dataclass
class Joined:
    """A wave's outcome at the load generators: agents subscribed and given up, retries after a
    failed attempt, and attempts that failed because the connection was not set up in time."""

    subscribed: int = 0
    failed: int = 0
    retries: int = 0
    connect_timeouts: int = 0


async def _wait_or_kill(process: asyncio.subprocess.Process) -> None:
    try:
        await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


# -- one wave -------------------------------------------------------------------------------------


@dataclass
class Wave:
    server: str
    agents: int
    subscribed: int
    failed: int
    retries: int
    announced: int
    seconds_to_all: float | None
    seconds_to_last_join: float
    announced_at_last_join: int
    cpu_s: float
    rss_growth_bytes: int
    connect_timeouts: int = 0
    dropped: float | None = None
    lost: float | None = None
    agents_current: float | None = None
    heartbeats_ok: int = 0
    heartbeats_failed: int = 0
    heartbeat_send_late_max_s: float | None = None
    max_stall_after_wave_s: float | None = None
    max_stall_s: float | None = None
    stalls_over_target_in_window: float | None = None
    max_busy_stall_s: float | None = None
    max_gc_pause_s: list[float | None] = field(default_factory=list)
    full_gcs_in_window: float | None = None
    # The longest stall from the wave's start to its end (all announced), at most: the lower of
    # the histogram window's bucket bound and the since-start maximum.
    max_stall_in_wave_s: float | None = None

    @property
    def cpu_ms_per_agent(self) -> float:
        return 1000.0 * self.cpu_s / self.agents

    @property
    def bytes_per_agent(self) -> float:
        return self.rss_growth_bytes / self.agents


@dataclass(frozen=True)
class Heartbeating:
    window_s: float = HEARTBEAT_WINDOW_S
    interval_s: float = HEARTBEAT_INTERVAL_S


def sample(text: str, series: str) -> float | None:
    """The value of one exact series (name and labels as exposed), or None."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def stall_buckets(
    text: str, metric: str = STALL_BUCKET_METRIC, labels: str = ""
) -> dict[float, float]:
    """The cumulative counts of a histogram, by upper bound (`+Inf` as infinity); `labels`:
    the series' other labels as exposed before `le` (e.g. 'generation="1",')."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(metric + "{" + labels + "le="):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float(le)] = float(line.rsplit(" ", 1)[1])
    return buckets


def window_max_stall(window: dict[float, float]) -> float | None:
    """The upper bound of the lowest bucket holding every observation of a window (cumulative
    counts by upper bound): the longest stall was at most that. None when nothing was observed."""
    total = window.get(math.inf, 0.0)
    if total <= 0:
        return None
    return min(le for le, count in window.items() if count >= total)


async def scrape(metrics_port: int) -> str:
    _, body = await http_get(metrics_port, "/metrics")
    return body.decode(errors="replace")


@dataclass(frozen=True)
class Held:
    """What a wave holds once every agent has joined, for a caller's `held` step."""

    server: Server
    fake: Fake
    generators: LoadGenerators
    workdir: Path


async def wave(
    kind: str,
    agents: int,
    loadgens: int,
    latency_ms: float,
    *,
    workdir: Path,
    quiet: bool,
    heartbeating: Heartbeating | None = None,
    held: Callable[[Held], Awaitable[None]] | None = None,
    production_admission: bool = False,
    nodes: int = 1,
) -> Wave:
    """One server's cold wave; `held`: a last step run while the agents are still held;
    `production_admission`: the node admits with its defaults (`tests.bench.storm`); `nodes`:
    the gateway's nodes on this host (their CPU and RSS summed, the longest stall of any)."""
    if heartbeating is not None and nodes != 1:
        raise ValueError("the heartbeat window is measured on one node")
    timeout = START_TIMEOUT_S + agents / 20.0
    async with contextlib.AsyncExitStack() as stack:
        fake = await stack.enter_async_context(fake_server(latency_ms))
        if kind == "gateway":
            node = gateway_node(
                workdir,
                agents,
                fake.port,
                production_admission=production_admission,
                nodes=nodes,
            )
            server = await stack.enter_async_context(node)
        else:
            server = await stack.enter_async_context(bare_server(workdir, fake.port))
        generators = await stack.enter_async_context(
            LoadGenerators.started(workdir, server.agent_port, agents, loadgens)
        )
        await asyncio.sleep(SETTLE_S)
        progress(f"{kind}: {agents} agents from {loadgens} load generators", quiet)
        cpu_before = sum(map(process_cpu_s, server.pids))
        rss_before = sum(map(process_rss_bytes, server.pids))
        stalls_before = [stall_buckets(await scrape(port)) for port in server.metrics_ports]
        started = time.perf_counter()
        generators.go()
        outcome = await generators.joined(timeout)
        subscribed, failed, retries = outcome.subscribed, outcome.failed, outcome.retries
        joined_s = time.perf_counter() - started
        announced_at_join = fake.notified
        seconds: float | None = None
        try:
            deadline = time.monotonic() + ANNOUNCE_WAIT_S
            while fake.notified < subscribed and time.monotonic() < deadline:
                fake.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(fake.changed.wait(), 0.5)
            if fake.notified >= agents:
                seconds = time.perf_counter() - started
        finally:
            announced = fake.notified
        await asyncio.sleep(SETTLE_S)
        result = Wave(
            server=kind,
            agents=agents,
            subscribed=subscribed,
            failed=failed,
            retries=retries,
            announced=announced,
            seconds_to_all=seconds,
            seconds_to_last_join=joined_s,
            announced_at_last_join=announced_at_join,
            cpu_s=sum(map(process_cpu_s, server.pids)) - cpu_before,
            rss_growth_bytes=sum(map(process_rss_bytes, server.pids)) - rss_before,
            connect_timeouts=outcome.connect_timeouts,
        )
        if server.metrics_port is not None:
            texts = [await scrape(port) for port in server.metrics_ports]
            result.max_stall_in_wave_s = max(map(_stall_in_wave, texts, stalls_before))
            result.dropped = nodes_sum(texts, "yuzu_gw_upstream_notify_dropped_total")
            result.lost = nodes_sum(texts, "yuzu_gw_upstream_notify_lost_total")
            result.agents_current = nodes_sum(texts, "yuzu_gw_agents_current")
            text = texts[0]
            if heartbeating is not None:
                result.max_stall_after_wave_s = metric_sum(text, MAX_STALL_METRIC)
                full_gcs_before = sample(text, FULL_GC_SAMPLE)
                progress(
                    f"{kind}: heartbeating for {heartbeating.window_s:g} s"
                    f" (one per agent every {heartbeating.interval_s:g} s)",
                    quiet,
                )
                result.heartbeats_ok, result.heartbeats_failed = await generators.heartbeats(
                    heartbeating.window_s, heartbeating.interval_s
                )
                result.heartbeat_send_late_max_s = generators.send_late_max_s
                before = stall_buckets(text)
                busy_before = stall_buckets(text, BUSY_STALL_BUCKET_METRIC)
                gc_before = [
                    stall_buckets(text, GC_PAUSE_BUCKET_METRIC, f'generation="{g}",')
                    for g in GC_GENERATIONS
                ]
                text = await scrape(server.metrics_port)
                result.max_gc_pause_s = [
                    window_max_stall(
                        {
                            le: n - before_g.get(le, 0.0)
                            for le, n in stall_buckets(
                                text, GC_PAUSE_BUCKET_METRIC, f'generation="{g}",'
                            ).items()
                        }
                    )
                    for g, before_g in zip(GC_GENERATIONS, gc_before, strict=True)
                ]
                window = {le: n - before.get(le, 0.0) for le, n in stall_buckets(text).items()}
                result.max_stall_s = window_max_stall(window)
                result.max_busy_stall_s = window_max_stall(
                    {
                        le: n - busy_before.get(le, 0.0)
                        for le, n in stall_buckets(text, BUSY_STALL_BUCKET_METRIC).items()
                    }
                )
                result.stalls_over_target_in_window = window.get(math.inf, 0.0) - window.get(
                    TARGET_MAX_STALL_MS / 1000.0, 0.0
                )
                full_gcs_after = sample(text, FULL_GC_SAMPLE)
                if full_gcs_before is not None and full_gcs_after is not None:
                    result.full_gcs_in_window = full_gcs_after - full_gcs_before
        progress(
            f"{kind}: {subscribed} subscribed, {failed} gave up, {retries} retries,"
            f" {announced} announced"
            f" in {seconds if seconds is None else round(seconds, 3)} s",
            quiet,
        )
        if held is not None:
            await held(Held(server, fake, generators, workdir))
        return result


def nodes_sum(texts: list[str], name: str) -> float:
    """`metric_sum` over the expositions of a host's nodes."""
    return sum(metric_sum(text, name) for text in texts)


def _stall_in_wave(text: str, before: dict[float, float]) -> float:
    """A node's longest stall of the wave, at most: its histogram's window to a bucket bound,
    or its since-start maximum when lower."""
    in_wave = window_max_stall(
        {le: n - before.get(le, 0.0) for le, n in stall_buckets(text).items()}
    )
    return min(b for b in (in_wave, metric_sum(text, MAX_STALL_METRIC)) if b is not None)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds


async def run(
    agents: int,
    loadgens: int,
    latency_ms: float,
    quiet: bool,
    heartbeating: Heartbeating | None = None,
    *,
    keep: Path | None = None,
) -> dict[str, Any]:
    """One run; `keep`: a directory to keep the processes' logs in (else a temporary one)."""
    heartbeating = heartbeating or Heartbeating()
    register_bytes = register_request("bench-agent-000000", REGISTER_BYTES).ByteSize()
    with contextlib.ExitStack() as scope:
        if keep is None:
            workdir = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="yuzu-bench-")))
        else:
            workdir = keep
            workdir.mkdir(parents=True)
        (workdir / "gateway").mkdir()
        (workdir / "bare").mkdir()
        gateway = await wave(
            "gateway",
            agents,
            loadgens,
            latency_ms,
            workdir=workdir / "gateway",
            quiet=quiet,
            heartbeating=heartbeating,
        )
        bare = await wave(
            "bare", agents, loadgens, latency_ms, workdir=workdir / "bare", quiet=quiet
        )
    kb_per_agent = (gateway.bytes_per_agent - register_bytes) / 1024.0
    bare_kb = bare.bytes_per_agent / 1024.0
    dropped = None if gateway.dropped is None else int(gateway.dropped + (gateway.lost or 0))
    cpu_ratio = _ratio(gateway.cpu_ms_per_agent, bare.cpu_ms_per_agent)
    memory_ratio = _ratio(kb_per_agent, bare_kb)
    all_subscribed = gateway.subscribed == agents and gateway.seconds_to_all is not None
    max_stall_ms = _ms(gateway.max_stall_s)
    return {
        "benchmark": NAME,
        "agents": agents,
        "load_generators": loadgens,
        "upstream_latency_ms": latency_ms,
        "register_bytes": register_bytes,
        "subscribed": gateway.subscribed,
        "subscribe_failed": gateway.failed,
        "join_retries": gateway.retries,
        "announced": gateway.announced,
        "agents_current": gateway.agents_current,
        "seconds_to_all_subscribed": gateway.seconds_to_all,
        # How far the announcements trailed the joins: the wave's last join, and how many of
        # its N CONNECTED calls the fake server had by then.
        "seconds_to_last_join": gateway.seconds_to_last_join,
        "announced_at_last_join": gateway.announced_at_last_join,
        "notifications_dropped": dropped,
        "notify_dropped_total": gateway.dropped,
        "notify_lost_total": gateway.lost,
        "cpu_ms_per_agent": gateway.cpu_ms_per_agent,
        "bare_cpu_ms_per_agent": bare.cpu_ms_per_agent,
        "cpu_per_agent_ratio": cpu_ratio,
        "rss_bytes_per_agent": gateway.bytes_per_agent,
        "kb_per_agent": kb_per_agent,
        "bare_kb_per_stream": bare_kb,
        "memory_per_agent_ratio": memory_ratio,
        "max_loop_stall_ms": max_stall_ms,
        "max_loop_stall_after_wave_ms": _ms(gateway.max_stall_after_wave_s),
        "heartbeat_window_s": heartbeating.window_s,
        "heartbeat_interval_s": heartbeating.interval_s,
        "heartbeats_acknowledged": gateway.heartbeats_ok,
        "heartbeats_failed": gateway.heartbeats_failed,
        "heartbeat_send_late_max_ms": _ms(gateway.heartbeat_send_late_max_s),
        "full_gcs_in_window": gateway.full_gcs_in_window,
        "stalls_over_target_in_window": gateway.stalls_over_target_in_window,
        "max_loop_busy_stall_ms": _ms(gateway.max_busy_stall_s),
        # The window's longest collection of each generation, at most (a bucket bound).
        "max_gc_pause_ms_by_generation": [_ms(v) for v in gateway.max_gc_pause_s],
        "bare": {
            "subscribed": bare.subscribed,
            "subscribe_failed": bare.failed,
            "join_retries": bare.retries,
            "announced": bare.announced,
            "seconds_to_all_subscribed": bare.seconds_to_all,
            "seconds_to_last_join": bare.seconds_to_last_join,
            "announced_at_last_join": bare.announced_at_last_join,
            "cpu_s": bare.cpu_s,
            "rss_growth_bytes": bare.rss_growth_bytes,
        },
        "gateway": {"cpu_s": gateway.cpu_s, "rss_growth_bytes": gateway.rss_growth_bytes},
        "targets_met": {
            "all_subscribed": all_subscribed,
            "notifications_dropped": dropped == 0,
            "cpu_per_agent_ratio": cpu_ratio is not None and cpu_ratio <= TARGET_CPU_RATIO,
            "memory_per_agent_ratio": memory_ratio is not None
            and memory_ratio <= TARGET_MEMORY_RATIO,
            # A bucket bound: the window's longest stall was at most this.
            "max_loop_stall_ms": max_stall_ms is not None and max_stall_ms <= TARGET_MAX_STALL_MS,
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
            "time to all subscribed and announced",
            _fmt(result["seconds_to_all_subscribed"], 3, " s"),
            f"{n} of {n}",
            met["all_subscribed"],
        ),
        Row("subscribed / announced", f"{result['subscribed']} / {result['announced']}"),
        Row(
            "last join after / announced by then, gateway",
            f"{result['seconds_to_last_join']:.3f} s / {result['announced_at_last_join']}",
        ),
        Row(
            "last join after / announced by then, bare",
            f"{result['bare']['seconds_to_last_join']:.3f} s"
            f" / {result['bare']['announced_at_last_join']}",
        ),
        Row(
            "agents' retries after a failed join, gateway / bare",
            f"{result['join_retries']} / {result['bare']['join_retries']}",
        ),
        Row(
            "notifications dropped (+ lost)",
            str(result["notifications_dropped"]),
            "0",
            met["notifications_dropped"],
        ),
        Row("gateway CPU per agent joined", _fmt(result["cpu_ms_per_agent"], 3, " ms")),
        Row("bare CPU per agent joined", _fmt(result["bare_cpu_ms_per_agent"], 3, " ms")),
        Row(
            "CPU per agent, gateway / bare",
            _fmt(result["cpu_per_agent_ratio"]),
            f"<= {TARGET_CPU_RATIO}",
            met["cpu_per_agent_ratio"],
        ),
        Row(
            "gateway KB per held agent (less the Register)",
            _fmt(result["kb_per_agent"], 1, " KB"),
        ),
        Row("bare KB per held stream", _fmt(result["bare_kb_per_stream"], 1, " KB")),
        Row(
            "memory per agent, gateway / bare",
            _fmt(result["memory_per_agent_ratio"]),
            f"<= {TARGET_MEMORY_RATIO}",
            met["memory_per_agent_ratio"],
        ),
        Row(
            "heartbeats acknowledged / failed",
            f"{result['heartbeats_acknowledged']} / {result['heartbeats_failed']}",
        ),
        Row(
            "longest a heartbeat left its load generator after its due time",
            _fmt(result["heartbeat_send_late_max_ms"], 1, " ms"),
        ),
        Row(
            "longest event-loop stall, held and heartbeating (at most)",
            _fmt(result["max_loop_stall_ms"], 1, " ms"),
            f"<= {TARGET_MAX_STALL_MS:g} ms",
            met["max_loop_stall_ms"],
        ),
        Row(
            "  of which on the node's CPU (at most; the rest is waiting for a core)",
            _fmt(result["max_loop_busy_stall_ms"], 1, " ms"),
        ),
        Row(
            "  longest collection in that window, generation 0 / 1 / 2 (at most)",
            " / ".join(_fmt(v, 1, " ms") for v in result["max_gc_pause_ms_by_generation"]),
        ),
        Row(
            "stalls over the target in that window / full collections",
            f"{_fmt(result['stalls_over_target_in_window'], 0)}"
            f" / {_fmt(result['full_gcs_in_window'], 0)}",
        ),
        Row(
            "longest event-loop stall of the cold wave",
            _fmt(result["max_loop_stall_after_wave_ms"], 1, " ms"),
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.agents", description=__doc__)
    parser.add_argument("--agents", type=int, default=DEFAULT_AGENTS)
    parser.add_argument(
        "--loadgens",
        type=int,
        help="load-generator processes (default: 2, or one per 4,500 agents, at most 4+)",
    )
    parser.add_argument("--latency-ms", type=float, default=DEFAULT_LATENCY_MS)
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--heartbeat-window-s",
        type=float,
        default=HEARTBEAT_WINDOW_S,
        help="how long the held agents heartbeat after the wave",
    )
    parser.add_argument(
        "--heartbeat-interval-s",
        type=float,
        default=HEARTBEAT_INTERVAL_S,
        help="seconds between two heartbeats of one agent",
    )
    parser.add_argument(
        "--keep-logs", type=Path, help="a new directory to keep every process's log in"
    )
    add_common_arguments(parser, NAME)
    args = parser.parse_args(argv)
    if args.agents <= 0:
        parser.error("--agents must be positive")
    loadgens = args.loadgens or default_loadgens(args.agents)
    heartbeating = Heartbeating(args.heartbeat_window_s, args.heartbeat_interval_s)
    result = asyncio.run(
        run(args.agents, loadgens, args.latency_ms, args.quiet, heartbeating, keep=args.keep_logs)
    )
    report(result, rows(result), args.out, args.json)


if __name__ == "__main__":
    main()
