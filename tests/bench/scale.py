"""Benchmark of multi-node scaling as cost: `python -m tests.bench.scale [--agents N] [--repeat R]
[--json]`.

Workload (issue 9, section 4). The same configuration runs twice under the release supervisor
(`tests.bench.scale_release`): one node, then two nodes sharing the agent and management ports
(SO_REUSEPORT) and seeded as one cluster. The fake server runs in this process and records, from
each CONNECTED NotifyStreamStatus, which node (`gateway_node`) holds which agent. On each:

- heartbeats: N agents register and subscribe (the kernel spreads their connections over the
  nodes), then each sends one Heartbeat every `--heartbeat-interval-s` (0.5 s; the load
  generators of `tests.bench.agents`), so one node and two serve the same offered rate, below
  what one core serves; with 0 they send them back to back with 30 tags after a warm-up (those
  of `tests.bench.heartbeats`). The gateway CPU (both node processes summed, /proc/<pid>/stat)
  per acknowledged heartbeat;
- commands: N agents in the load generators of `tests.bench.fanout` answer every command at once;
  an operator on the shared management port, on a connection the kernel gave node 1 (found from
  each node's management listener, read on its console), sends `--broadcasts` broadcasts: the
  gateway CPU per SUCCESS answer. With two nodes it then sends `--commands` single-target
  commands one at a time, alternating between agents node 1 holds and agents node 2 holds: the
  round trip p50 of each kind, and each node's CPU per command of each kind (its threads' run
  time read around every command, summed per kind, less the node's idle rate over the same time).

On a 2-core machine the load generators and the fake server share the cores with the nodes, so
scaling is measured as cost, not speed. Each CPU figure has the nodes' idle CPU rate, read just
before over `IDLE_S`, taken off (their timers: loop monitor, telemetry, cluster probes).

One pair of phases (one node, then two) is a round; `--repeat` rounds (default 3) run one after
the other and each figure is the median over them (a ratio: of the rounds' ratios, so a load
spike that slows a round's two phases alike cancels within it), with each round under `rounds`.

Targets: CPU per heartbeat and per broadcast answer with two nodes within 1.15x of one node (no
cross-node overhead on local work); a command to an agent on the other node within 1.5x of a
local one's round trip (p50).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from gateway.devstack.fake_upstream import Call, FakeUpstream
from protos.yuzu.gateway.v1 import gateway_pb2
from protos.yuzu.server.v1 import management_pb2
from tests.bench.agents import START_TIMEOUT_S
from tests.bench.agents import LoadGenerators as AgentLoadGenerators
from tests.bench.common import Row, add_common_arguments, environment, report
from tests.bench.fanout import (
    AGENTS_PER_LOADGEN,
    SEND_COMMAND,
    _answers,
    _idle,
    _request,
    load_generators,
)
from tests.bench.heartbeats import LoadGenerators, Workload
from tests.bench.scale_release import Release, release

NAME = "scale"

DEFAULT_AGENTS = 300
DEFAULT_LOADGENS = 2
DEFAULT_WARMUP_S = 3.0
DEFAULT_WINDOW_S = 15.0
DEFAULT_COMMANDS = 400
DEFAULT_BROADCASTS = 20
# One pair of phases is one noisy sample on a shared 2-core host (a ratio moved 1.1 to 1.5
# between runs): the figures are medians over this many pairs, each pair run back to back.
DEFAULT_REPEAT = 3
# Paced: 300 agents every 0.5 s offer 600 heartbeats a second, under one node's ceiling on this
# machine (about 1,300/s back to back with the load generators on the same cores). 0: back to back.
DEFAULT_HEARTBEAT_INTERVAL_S = 0.5
TARGET_CPU_RATIO = 1.15
TARGET_RTT_RATIO = 1.5
IDLE_S = 2.0
WARMUP_BROADCASTS = 2
OPERATOR_TRIES = 32  # connections opened until one lands on node 1 (each does with p = 1/N)
CALL_DEADLINE_S = 60.0
_CONNECTED = gateway_pb2.StreamStatusNotification.Event.CONNECTED


def progress(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Load:
    agents: int = DEFAULT_AGENTS
    loadgens: int = DEFAULT_LOADGENS
    warmup_s: float = DEFAULT_WARMUP_S
    window_s: float = DEFAULT_WINDOW_S
    commands: int = DEFAULT_COMMANDS
    broadcasts: int = DEFAULT_BROADCASTS
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S


@dataclass
class Holders:
    """agent id -> the node that reported its stream CONNECTED (the fake server's view)."""

    by_agent: dict[str, str] = field(default_factory=dict)

    def on_call(self, call: Call) -> None:
        if call.method == "NotifyStreamStatus" and call.request.event == _CONNECTED:
            self.by_agent[call.request.agent_id] = call.request.gateway_node


@dataclass
class Phase:
    nodes: int
    heartbeats: int = 0
    heartbeats_failed: int = 0
    heartbeat_cpu_s: float = 0.0
    heartbeat_idle_cpu_s: float = 0.0
    heartbeats_per_node: dict[str, int] = field(default_factory=dict)
    agents_per_node: dict[str, int] = field(default_factory=dict)
    answers: int = 0
    broadcast_cpu_s: float = 0.0
    broadcast_idle_cpu_s: float = 0.0
    broadcast_s: list[float] = field(default_factory=list)
    local_ms: list[float] = field(default_factory=list)
    remote_ms: list[float] = field(default_factory=list)
    commands_failed: int = 0
    # Per node, CPU seconds over the local / cross-node commands, idle share already taken off.
    local_cpu_s: list[float] = field(default_factory=list)
    remote_cpu_s: list[float] = field(default_factory=list)

    @property
    def cpu_us_per_heartbeat(self) -> float | None:
        work = self.heartbeat_cpu_s - self.heartbeat_idle_cpu_s
        return 1e6 * work / self.heartbeats if self.heartbeats else None

    @property
    def cpu_us_per_answer(self) -> float | None:
        work = self.broadcast_cpu_s - self.broadcast_idle_cpu_s
        return 1e6 * work / self.answers if self.answers else None


def run_time_s(pid: int) -> float:
    """Seconds the process's threads have run (/proc/<pid>/task/*/schedstat, in nanoseconds:
    fine enough to read around one command, where /proc/<pid>/stat counts 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


async def settled(rel: Release, agents: int) -> None:
    """Until every node has told the fake server of every new stream (tests.bench.fanout's
    `_idle`), so that neither the idle rate nor the work counts the cold wave's tail."""
    for node in rel.nodes:
        await _idle(node.metrics_port, agents)


async def idle_rate(rel: Release) -> float:
    """The nodes' CPU seconds per second with nothing to do, over `IDLE_S`."""
    before = rel.cpu_s()
    await asyncio.sleep(IDLE_S)
    return (rel.cpu_s() - before) / IDLE_S


# -- heartbeats ------------------------------------------------------------------------------------


async def heartbeat_part(
    rel: Release, load: Load, result: Phase, *, holders: Holders, workdir: Path, quiet: bool
) -> None:
    if load.heartbeat_interval_s > 0:
        await _paced_heartbeats(rel, load, result, workdir=workdir, quiet=quiet)
    else:
        await _back_to_back_heartbeats(rel, load, result, workdir=workdir, quiet=quiet)
    result.heartbeats_per_node = _count(holders.by_agent.values())


async def _paced_heartbeats(
    rel: Release, load: Load, result: Phase, *, workdir: Path, quiet: bool
) -> None:
    """Every agent one Heartbeat every `heartbeat_interval_s` (tests.bench.agents_loadgen): the
    same offered rate for one node and two, below what one core serves."""
    async with AgentLoadGenerators.started(
        workdir, rel.agent_port, load.agents, load.loadgens
    ) as generators:
        generators.go()
        ready, _, _ = await generators.joined(START_TIMEOUT_S + load.agents / 20.0)
        progress(
            f"{result.nodes} node(s): {ready} agents, one heartbeat each every"
            f" {load.heartbeat_interval_s:g} s for {load.window_s:g} s",
            quiet,
        )
        await settled(rel, load.agents)
        idle = await idle_rate(rel)
        before = rel.cpu_s()
        counts = await generators.heartbeats(load.window_s, load.heartbeat_interval_s)
        result.heartbeat_cpu_s = rel.cpu_s() - before
        result.heartbeat_idle_cpu_s = idle * load.window_s
        result.heartbeats, result.heartbeats_failed = counts


async def _back_to_back_heartbeats(
    rel: Release, load: Load, result: Phase, *, workdir: Path, quiet: bool
) -> None:
    """Every agent sends its next Heartbeat (30 tags) as soon as the previous is answered
    (tests.bench.heartbeats_loadgen): as fast as the nodes admit them."""
    workload = Workload(load.agents, load.loadgens, load.warmup_s, load.window_s)
    async with LoadGenerators.started(workdir, rel.agent_port, workload, join=True) as (
        generators,
        ready,
    ):
        progress(
            f"{result.nodes} node(s): {ready} agents heartbeating back to back"
            f" {load.warmup_s:g} + {load.window_s:g} s",
            quiet,
        )
        await settled(rel, load.agents)
        idle = await idle_rate(rel)
        generators.run(load.warmup_s, load.window_s)
        await asyncio.sleep(load.warmup_s)
        before = rel.cpu_s()
        await asyncio.sleep(load.window_s)
        result.heartbeat_cpu_s = rel.cpu_s() - before
        result.heartbeat_idle_cpu_s = idle * load.window_s
        result.heartbeats, result.heartbeats_failed = await generators.counts(START_TIMEOUT_S)


# -- commands ------------------------------------------------------------------------------------


def _count(values: Iterable[str]) -> dict[str, int]:
    """How many of each value, sorted (node name -> agents)."""
    return dict(sorted(Counter(values).items()))


@contextlib.asynccontextmanager
async def operator_on_node_1(rel: Release) -> AsyncIterator[Any]:
    """A SendCommand callable on a management connection the kernel gave node 1."""
    first, others = rel.nodes[0], rel.nodes[1:]
    for _ in range(OPERATOR_TRIES):
        channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{rel.mgmt_port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        await channel.channel_ready()
        if await rel.mgmt_connections(first) == 1 and not any(
            [await rel.mgmt_connections(node) for node in others]
        ):
            try:
                yield channel.unary_stream(
                    SEND_COMMAND,
                    request_serializer=management_pb2.SendCommandRequest.SerializeToString,
                    response_deserializer=management_pb2.SendCommandResponse.FromString,
                )
            finally:
                await channel.close()
            return
        await channel.close()
        await asyncio.sleep(0.05)  # the node sees the close before the next count
    raise RuntimeError(f"no management connection landed on node 1 in {OPERATOR_TRIES} tries")


async def command_part(
    rel: Release, load: Load, result: Phase, *, holders: Holders, workdir: Path, quiet: bool
) -> None:
    loadgens = max(load.loadgens, math.ceil(load.agents / AGENTS_PER_LOADGEN))
    holders.by_agent.clear()
    async with load_generators(workdir, rel.agent_port, load.agents, loadgens) as (subscribed, _):
        deadline = time.monotonic() + 60.0
        while len(holders.by_agent) < subscribed or (
            await rel.metric_total("yuzu_gw_agents_current") < subscribed
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the nodes did not hold every subscribed agent")
            await asyncio.sleep(0.2)
        await settled(rel, load.agents)
        result.agents_per_node = _count(holders.by_agent.values())
        progress(
            f"{result.nodes} node(s): {subscribed} agents held {result.agents_per_node}", quiet
        )
        async with operator_on_node_1(rel) as send:
            for n in range(WARMUP_BROADCASTS):
                await _answers(send(_request(f"w{n}", []), timeout=CALL_DEADLINE_S), 0.0)

            async def broadcasts() -> int:
                ok_total = 0
                for b in range(load.broadcasts):
                    started = time.perf_counter()
                    call = send(_request(f"b{b}", []), timeout=CALL_DEADLINE_S)
                    _, ok, seconds = await _answers(call, started)
                    ok_total += ok
                    result.broadcast_s.append(seconds)
                return ok_total

            progress(f"{result.nodes} node(s): {load.broadcasts} broadcasts", quiet)
            idle = await idle_rate(rel)
            started, before = time.monotonic(), rel.cpu_s()
            result.answers = await broadcasts()
            result.broadcast_cpu_s = rel.cpu_s() - before
            result.broadcast_idle_cpu_s = idle * (time.monotonic() - started)
            if len(rel.nodes) > 1:
                await round_trips(send, rel, load, result, holders=holders, quiet=quiet)


async def round_trips(
    send: Callable[..., Any],
    rel: Release,
    load: Load,
    result: Phase,
    *,
    holders: Holders,
    quiet: bool,
) -> None:
    """Single-target commands one at a time, alternating local (node 1) and remote targets."""
    local_name = rel.nodes[0].name
    local = sorted(a for a, n in holders.by_agent.items() if n == local_name)
    remote = sorted(a for a, n in holders.by_agent.items() if n != local_name)
    if not local or not remote:
        # No round trip to compare: the ratio is reported as n/a (and its target as missed).
        progress(f"the kernel put every agent on one node: {result.agents_per_node}", quiet)
        return
    progress(f"{result.nodes} nodes: {load.commands} single-target commands", quiet)
    pids = [node.pid for node in rel.nodes]
    idle_before = [run_time_s(pid) for pid in pids]
    await asyncio.sleep(IDLE_S)
    idle = [(run_time_s(pid) - cpu) / IDLE_S for pid, cpu in zip(pids, idle_before, strict=True)]
    result.local_cpu_s, result.remote_cpu_s = [0.0] * len(pids), [0.0] * len(pids)
    targets = zip(itertools.cycle(local), itertools.cycle(remote), strict=False)
    for n, (near, far) in zip(range(0, load.commands, 2), targets, strict=False):
        for kind, target, times, cpu in (
            ("l", near, result.local_ms, result.local_cpu_s),
            ("r", far, result.remote_ms, result.remote_cpu_s),
        ):
            before = [run_time_s(pid) for pid in pids]
            started = time.perf_counter()
            try:
                final, ok, seconds = await _answers(
                    send(_request(f"{kind}{n}", [target]), timeout=CALL_DEADLINE_S), started
                )
            except grpc.aio.AioRpcError:
                final = ok = 0
                seconds = 0.0
            elapsed = time.perf_counter() - started
            for index, pid in enumerate(pids):
                cpu[index] += run_time_s(pid) - before[index] - idle[index] * elapsed
            if final == 1 and ok == 1:
                times.append(1000.0 * seconds)
            else:
                result.commands_failed += 1


# -- one phase, the run ---------------------------------------------------------------------------


async def phase(nodes: int, load: Load, workdir: Path, quiet: bool) -> Phase:
    result = Phase(nodes)
    holders = Holders()
    async with FakeUpstream(on_call=holders.on_call) as fake:
        progress(f"{nodes} node(s): starting the release", quiet)
        async with release(workdir, nodes, load.agents, fake.port) as rel:
            await heartbeat_part(rel, load, result, holders=holders, workdir=workdir, quiet=quiet)
            deadline = time.monotonic() + 60.0
            while await rel.metric_total("yuzu_gw_agents_current") > 0:
                if time.monotonic() > deadline:
                    raise RuntimeError("the heartbeat agents were not let go")
                await asyncio.sleep(0.2)
            await command_part(rel, load, result, holders=holders, workdir=workdir, quiet=quiet)
    return result


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _p50(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _per_command(cpu_s: list[float], count: int) -> list[float] | None:
    """Microseconds per command, per node."""
    return [1e6 * seconds / count for seconds in cpu_s] if cpu_s and count else None


def summarise(load: Load, one: Phase, two: Phase) -> dict[str, Any]:
    hb_ratio = _ratio(two.cpu_us_per_heartbeat, one.cpu_us_per_heartbeat)
    answer_ratio = _ratio(two.cpu_us_per_answer, one.cpu_us_per_answer)
    local_p50, remote_p50 = _p50(two.local_ms), _p50(two.remote_ms)
    rtt_ratio = _ratio(remote_p50, local_p50)
    expected_answers = load.broadcasts * load.agents
    per_kind = load.commands // 2
    local_cpu = _per_command(two.local_cpu_s, per_kind)
    remote_cpu = _per_command(two.remote_cpu_s, per_kind)
    return {
        "benchmark": NAME,
        "agents": load.agents,
        "load_generators": load.loadgens,
        "warmup_s": load.warmup_s,
        "window_s": load.window_s,
        "broadcasts": load.broadcasts,
        "commands": load.commands,
        "heartbeat_interval_s": load.heartbeat_interval_s,
        "cpu_us_per_heartbeat_1": one.cpu_us_per_heartbeat,
        "cpu_us_per_heartbeat_2": two.cpu_us_per_heartbeat,
        "cpu_per_heartbeat_ratio_2_vs_1": hb_ratio,
        "heartbeats_per_s_1": one.heartbeats / load.window_s,
        "heartbeats_per_s_2": two.heartbeats / load.window_s,
        "heartbeats_failed": one.heartbeats_failed + two.heartbeats_failed,
        "heartbeat_agents_per_node_2": two.heartbeats_per_node,
        "cpu_us_per_answer_1": one.cpu_us_per_answer,
        "cpu_us_per_answer_2": two.cpu_us_per_answer,
        "cpu_per_answer_ratio_2_vs_1": answer_ratio,
        "answers_1": one.answers,
        "answers_2": two.answers,
        "broadcast_median_s_1": _p50(one.broadcast_s),
        "broadcast_median_s_2": _p50(two.broadcast_s),
        "command_agents_per_node_2": two.agents_per_node,
        "local_rtt_p50_ms": local_p50,
        "cross_node_rtt_p50_ms": remote_p50,
        "cross_node_rtt_ratio": rtt_ratio,
        "cpu_us_per_local_command_by_node": local_cpu,
        "cpu_us_per_cross_node_command_by_node": remote_cpu,
        "cross_node_cpu_ratio": _ratio(
            sum(remote_cpu) if remote_cpu else None, sum(local_cpu) if local_cpu else None
        ),
        "commands_failed": two.commands_failed,
        "raw": {
            str(p.nodes): {
                "heartbeats": p.heartbeats,
                "heartbeat_cpu_s": p.heartbeat_cpu_s,
                "heartbeat_idle_cpu_s": p.heartbeat_idle_cpu_s,
                "broadcast_cpu_s": p.broadcast_cpu_s,
                "broadcast_idle_cpu_s": p.broadcast_idle_cpu_s,
                "broadcast_runs_s": p.broadcast_s,
            }
            for p in (one, two)
        },
        "targets_met": {
            "all_answered": one.answers == expected_answers
            and two.answers == expected_answers
            and two.commands_failed == 0
            and one.heartbeats_failed + two.heartbeats_failed == 0,
            "cpu_per_heartbeat_ratio_2_vs_1": hb_ratio is not None and hb_ratio <= TARGET_CPU_RATIO,
            "cpu_per_answer_ratio_2_vs_1": answer_ratio is not None
            and answer_ratio <= TARGET_CPU_RATIO,
            "cross_node_rtt_ratio": rtt_ratio is not None and rtt_ratio <= TARGET_RTT_RATIO,
        },
        "environment": environment(),
    }


# Over the rounds: the median of each figure (a ratio: of the rounds' ratios, each pairing a
# one-node phase with the two-node phase run right after it), the fewest answers in a round,
# the failures summed; CPU per command by node, node by node; the kernel's spreads in `rounds`.
_MEDIAN_KEYS = (
    "cpu_us_per_heartbeat_1",
    "cpu_us_per_heartbeat_2",
    "heartbeats_per_s_1",
    "heartbeats_per_s_2",
    "cpu_us_per_answer_1",
    "cpu_us_per_answer_2",
    "broadcast_median_s_1",
    "broadcast_median_s_2",
    "local_rtt_p50_ms",
    "cross_node_rtt_p50_ms",
    "cross_node_cpu_ratio",
)
_RATIO_TARGETS = {
    "cpu_per_heartbeat_ratio_2_vs_1": TARGET_CPU_RATIO,
    "cpu_per_answer_ratio_2_vs_1": TARGET_CPU_RATIO,
    "cross_node_rtt_ratio": TARGET_RTT_RATIO,
}
_PER_ROUND_KEYS = (
    "heartbeat_agents_per_node_2",
    "command_agents_per_node_2",
    "raw",
)
_BY_NODE_KEYS = ("cpu_us_per_local_command_by_node", "cpu_us_per_cross_node_command_by_node")


def _median_present(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from the rounds' `summarise` results (the module doc's figures, medians)."""
    result = {k: v for k, v in rounds[0].items() if k not in _PER_ROUND_KEYS}
    for key in (*_MEDIAN_KEYS, *_RATIO_TARGETS):
        result[key] = _median_present(r[key] for r in rounds)
    for key in _RATIO_TARGETS:
        present = [r[key] for r in rounds if r[key] is not None]
        result[f"{key}_min"] = min(present, default=None)
        result[f"{key}_max"] = max(present, default=None)
    for key in _BY_NODE_KEYS:
        by_node = [r[key] for r in rounds if r[key] is not None]
        result[key] = [statistics.median(v) for v in zip(*by_node, strict=True)] or None
    for key in ("answers_1", "answers_2"):
        result[key] = min(r[key] for r in rounds)
    for key in ("heartbeats_failed", "commands_failed"):
        result[key] = sum(r[key] for r in rounds)
    result["repeat"] = len(rounds)
    result["targets_met"] = {
        "all_answered": all(r["targets_met"]["all_answered"] for r in rounds),
        **{
            key: result[key] is not None and result[key] <= target
            for key, target in _RATIO_TARGETS.items()
        },
    }
    result["rounds"] = [{k: v for k, v in r.items() if k != "environment"} for r in rounds]
    return result


async def run(
    load: Load, quiet: bool, *, keep: Path | None = None, repeat: int = 1
) -> dict[str, Any]:
    rounds = []
    with contextlib.ExitStack() as scope:
        if keep is None:
            workdir = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="yuzu-bench-")))
        else:
            workdir = keep
            workdir.mkdir(parents=True)
        for n in range(repeat):
            progress(f"round {n + 1}/{repeat}", quiet)
            one = await phase(1, load, workdir / f"one-{n}", quiet)
            two = await phase(2, load, workdir / f"two-{n}", quiet)
            rounds.append(summarise(load, one, two))
    return combine(rounds)


def _fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def _fmt_nodes(values: list[float] | None) -> str:
    return "n/a" if values is None else " + ".join(f"{v:.0f}" for v in values) + " us"


def rows(result: dict[str, Any]) -> list[Row]:
    met = result["targets_met"]
    expected = result["broadcasts"] * result["agents"]
    return [
        Row(
            "answers 1 / 2 nodes; failed commands, heartbeats",
            f"{result['answers_1']} / {result['answers_2']}; {result['commands_failed']},"
            f" {result['heartbeats_failed']}",
            f"{expected} / {expected}; 0, 0",
            met["all_answered"],
        ),
        Row(
            "heartbeats/s, 1 / 2 nodes",
            f"{_fmt(result['heartbeats_per_s_1'], 0)} / {_fmt(result['heartbeats_per_s_2'], 0)}",
        ),
        Row(
            "gateway CPU per heartbeat, 1 / 2 nodes",
            f"{_fmt(result['cpu_us_per_heartbeat_1'], 0, ' us')}"
            f" / {_fmt(result['cpu_us_per_heartbeat_2'], 0, ' us')}",
        ),
        Row(
            "CPU per heartbeat, 2 nodes / 1",
            _fmt(result["cpu_per_heartbeat_ratio_2_vs_1"]),
            f"<= {TARGET_CPU_RATIO}",
            met["cpu_per_heartbeat_ratio_2_vs_1"],
        ),
        Row(
            "gateway CPU per broadcast answer, 1 / 2 nodes",
            f"{_fmt(result['cpu_us_per_answer_1'], 0, ' us')}"
            f" / {_fmt(result['cpu_us_per_answer_2'], 0, ' us')}",
        ),
        Row(
            "CPU per answer, 2 nodes / 1",
            _fmt(result["cpu_per_answer_ratio_2_vs_1"]),
            f"<= {TARGET_CPU_RATIO}",
            met["cpu_per_answer_ratio_2_vs_1"],
        ),
        Row(
            "command p50, agent on node 1 / on node 2 (via node 1)",
            f"{_fmt(result['local_rtt_p50_ms'], 2, ' ms')}"
            f" / {_fmt(result['cross_node_rtt_p50_ms'], 2, ' ms')}",
        ),
        Row(
            "CPU per command (node 1 + node 2), local / cross-node",
            f"{_fmt_nodes(result['cpu_us_per_local_command_by_node'])}"
            f" / {_fmt_nodes(result['cpu_us_per_cross_node_command_by_node'])}",
        ),
        Row("cross-node / local CPU per command", _fmt(result["cross_node_cpu_ratio"])),
        Row(
            "cross-node / local round trip",
            _fmt(result["cross_node_rtt_ratio"]),
            f"<= {TARGET_RTT_RATIO}",
            met["cross_node_rtt_ratio"],
        ),
        Row(
            "rounds; ratios min / max (heartbeat, answer, round trip)",
            f"{result['repeat']}; "
            + ", ".join(
                f"{_fmt(result[f'{key}_min'])} / {_fmt(result[f'{key}_max'])}"
                for key in _RATIO_TARGETS
            ),
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.scale", description=__doc__)
    parser.add_argument("--agents", type=int, default=DEFAULT_AGENTS)
    parser.add_argument("--loadgens", type=int, default=DEFAULT_LOADGENS)
    parser.add_argument("--warmup-s", type=float, default=DEFAULT_WARMUP_S)
    parser.add_argument("--window-s", type=float, default=DEFAULT_WINDOW_S)
    parser.add_argument("--commands", type=int, default=DEFAULT_COMMANDS)
    parser.add_argument("--broadcasts", type=int, default=DEFAULT_BROADCASTS)
    parser.add_argument(
        "--heartbeat-interval-s",
        type=float,
        default=DEFAULT_HEARTBEAT_INTERVAL_S,
        help="each agent's heartbeat interval (0: back to back, 30 tags, after --warmup-s)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=DEFAULT_REPEAT,
        help="pairs of phases (one node, then two); the figures are medians over them",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--keep-logs", type=Path, help="a new directory to keep every process's log in"
    )
    add_common_arguments(parser, NAME)
    args = parser.parse_args(argv)
    if (
        min(args.agents, args.loadgens, args.commands, args.broadcasts, args.repeat) <= 0
        or args.window_s <= 0
    ):
        parser.error(
            "--agents, --loadgens, --commands, --broadcasts, --repeat, --window-s must be positive"
        )
    load = Load(
        args.agents,
        args.loadgens,
        args.warmup_s,
        args.window_s,
        args.commands,
        args.broadcasts,
        args.heartbeat_interval_s,
    )
    result = asyncio.run(run(load, args.quiet, keep=args.keep_logs, repeat=args.repeat))
    report(result, rows(result), args.out, args.json)


if __name__ == "__main__":
    main()
