"""Benchmark of multi-node scaling as cost: `python -m tests.bench.scale [--agents N] [--repeat R]
[--json]`.

Workload (issue 9, section 4). The same configuration runs three times under the release
supervisor (`tests.bench.scale_release`): one node; two nodes sharing the agent and management
ports (SO_REUSEPORT) and seeded as one cluster; and, as the control, the same two nodes NOT
clustered (no seed list, a seed name that cannot resolve, no configured cluster port: each
serves alone). The fake server runs in this process and records, from each CONNECTED
NotifyStreamStatus, which node (`gateway_node`) holds which agent. On each:

- heartbeats: N agents register and subscribe (the kernel spreads their connections over the
  nodes), then each sends one Heartbeat every `--heartbeat-interval-s` (0.5 s; the load
  generators of `tests.bench.agents`), so one node and two serve the same offered rate, below
  what one core serves; with 0 they send them back to back with 30 tags after a warm-up (those
  of `tests.bench.heartbeats`). The gateway CPU (both node processes summed, /proc/<pid>/stat)
  per acknowledged heartbeat;
- commands: N agents in the load generators of `tests.bench.fanout` answer every command at once;
  an operator on the shared management port, on a connection the kernel gave node 1 (found from
  each node's management listener, read on its console), sends `--broadcasts` broadcasts: the
  gateway CPU per SUCCESS answer. Unclustered, a node reaches only its own agents, so the
  operator holds a connection on each node and sends each broadcast on both at once. With two
  clustered nodes it then sends `--commands` single-target commands one at a time, alternating
  between agents node 1 holds and agents node 2 holds: the round trip p50 of each kind, and each
  node's CPU per command of each kind (its threads' run time read around every command, summed
  per kind, less the node's idle rate over the same time). Unclustered, half as many, all to
  agents node 1 holds (the local path's control).

On a 2-core machine the load generators and the fake server share the cores with the nodes, so
scaling is measured as cost, not speed. Each CPU figure has the nodes' idle CPU rate, read just
before over `IDLE_S`, taken off (their timers: loop monitor, telemetry, cluster probes).

The control splits the two-node ratio in two: 2 / 1 = (2 unclustered / 1) x (2 / 2 unclustered),
exactly within a round. The first factor is the host's (two busy processes on two cores instead
of one: more wake-ups and context switches, colder caches, fewer events per loop turn); the
second is the cluster's own cost on the same two processes.

The three phases are a round; `--repeat` rounds (default 3) run one after the other and each
figure is the median over them (a ratio: of the rounds' ratios, so a load spike that slows a
round's phases alike cancels within it), with each round under `rounds`. Within a round the
clustered phase runs in the middle, next to both phases it is compared with, and every other
round runs backwards (1, 2, 2u; then 2u, 2, 1): a steady drift of the host's load then pushes
each ratio one way in one round and the other way in the next, not always the same way.

Targets: CPU per heartbeat and per broadcast answer with two nodes within 1.15x of one node (no
cross-node overhead on local work); a command to an agent on the other node within 1.5x of a
local one's round trip (p50). The control's ratios have no target: they say how much of the
first is the host's and how much the cluster's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
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
from tests.bench.scale_release import Node, Release, release

NAME = "scale"

DEFAULT_AGENTS = 300
DEFAULT_LOADGENS = 2
DEFAULT_WARMUP_S = 3.0
DEFAULT_WINDOW_S = 15.0
DEFAULT_COMMANDS = 400
DEFAULT_BROADCASTS = 20
# One round of phases is one noisy sample on a shared 2-core host (a ratio moved 1.1 to 1.5
# between runs): the figures are medians over this many rounds, each run back to back.
DEFAULT_REPEAT = 3
# Paced: 300 agents every 0.5 s offer 600 heartbeats a second, under one node's ceiling on this
# machine (about 1,300/s back to back with the load generators on the same cores). 0: back to back.
DEFAULT_HEARTBEAT_INTERVAL_S = 0.5
TARGET_CPU_RATIO = 1.15
TARGET_RTT_RATIO = 1.5
IDLE_S = 2.0
WARMUP_BROADCASTS = 2
# Connections opened, per node wanted, until one lands on it (each does with p = 1/N).
OPERATOR_TRIES = 32
CALL_DEADLINE_S = 60.0
_CONNECTED = gateway_pb2.StreamStatusNotification.Event.CONNECTED
# (nodes, clustered) of a round's phases, in the order of its even rounds (odd ones: reversed).
PHASES = ((1, True), (2, True), (2, False))


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
    clustered: bool = True
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
    def label(self) -> str:
        """The keys' suffix: "1", "2", "2u" (two nodes, unclustered)."""
        return f"{self.nodes}{'' if self.clustered or self.nodes == 1 else 'u'}"

    @property
    def title(self) -> str:
        return f"{self.nodes} {'' if self.clustered else 'unclustered '}node(s)"

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
        ready = (await generators.joined(START_TIMEOUT_S + load.agents / 20.0)).subscribed
        progress(
            f"{result.title}: {ready} agents, one heartbeat each every"
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
            f"{result.title}: {ready} agents heartbeating back to back"
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


def _send_command(channel: grpc.aio.Channel) -> Callable[..., Any]:
    return channel.unary_stream(
        SEND_COMMAND,
        request_serializer=management_pb2.SendCommandRequest.SerializeToString,
        response_deserializer=management_pb2.SendCommandResponse.FromString,
    )


async def _landed_on(rel: Release, held: dict[str, grpc.aio.Channel]) -> str | None:
    """The node holding the one management connection beyond `held`'s (one a node), or None
    when the counts say otherwise (a close the node has not seen yet, another client)."""
    extra = [await rel.mgmt_connections(node) - (node.name in held) for node in rel.nodes]
    if sorted(extra) != [0] * (len(extra) - 1) + [1]:
        return None
    return rel.nodes[extra.index(1)].name


@contextlib.asynccontextmanager
async def operators(
    rel: Release, wanted: Sequence[Node]
) -> AsyncIterator[list[Callable[..., Any]]]:
    """A SendCommand callable for each node of `wanted`, in its order, each on a management
    connection the kernel gave that node: connections to the shared port are opened until one
    landed on each; one that lands elsewhere is closed."""
    names = [node.name for node in wanted]
    held: dict[str, grpc.aio.Channel] = {}
    try:
        for _ in range(OPERATOR_TRIES * len(names)):
            if len(held) == len(names):
                break
            # Its own subchannel: a new TCP connection each time, for the kernel to place.
            channel = grpc.aio.insecure_channel(
                f"127.0.0.1:{rel.mgmt_port}", options=[("grpc.use_local_subchannel_pool", 1)]
            )
            await channel.channel_ready()
            landed = await _landed_on(rel, held)
            if landed in names and landed not in held:
                held[landed] = channel
            else:
                await channel.close()
                await asyncio.sleep(0.05)  # the node sees the close before the next count
        missing = [name for name in names if name not in held]
        if missing:
            raise RuntimeError(f"no management connection landed on {missing} in time")
        yield [_send_command(held[name]) for name in names]
    finally:
        for channel in held.values():
            await channel.close()


async def broadcast(sends: Sequence[Callable[..., Any]], command_id: str) -> tuple[int, float]:
    """One broadcast on every operator connection at once: (SUCCESS answers, seconds until the
    last of them)."""
    started = time.perf_counter()
    replies = await asyncio.gather(
        *(
            _answers(send(_request(command_id, []), timeout=CALL_DEADLINE_S), started)
            for send in sends
        )
    )
    return sum(ok for _, ok, _ in replies), max(seconds for _, _, seconds in replies)


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
        progress(f"{result.title}: {subscribed} agents held {result.agents_per_node}", quiet)
        # Unclustered, a node reaches only the agents it holds: an operator on each node.
        wanted = rel.nodes[:1] if result.clustered else rel.nodes
        async with operators(rel, wanted) as sends:
            for n in range(WARMUP_BROADCASTS):
                await broadcast(sends, f"w{n}")
            progress(f"{result.title}: {load.broadcasts} broadcasts", quiet)
            idle = await idle_rate(rel)
            started, before = time.monotonic(), rel.cpu_s()
            for b in range(load.broadcasts):
                ok, seconds = await broadcast(sends, f"b{b}")
                result.answers += ok
                result.broadcast_s.append(seconds)
            result.broadcast_cpu_s = rel.cpu_s() - before
            result.broadcast_idle_cpu_s = idle * (time.monotonic() - started)
            if len(rel.nodes) > 1:
                await round_trips(sends[0], rel, load, result, holders=holders, quiet=quiet)


async def round_trips(
    send: Callable[..., Any],
    rel: Release,
    load: Load,
    result: Phase,
    *,
    holders: Holders,
    quiet: bool,
) -> None:
    """Single-target commands one at a time through node 1: clustered, alternating local (node 1)
    and remote targets, `load.commands` in all; unclustered, the local half only (node 1 cannot
    reach node 2's agents)."""
    local_name = rel.nodes[0].name
    local = sorted(a for a, n in holders.by_agent.items() if n == local_name)
    remote = sorted(a for a, n in holders.by_agent.items() if n != local_name)
    kinds = [("l", local, result.local_ms, result.local_cpu_s)]
    if result.clustered:
        kinds.append(("r", remote, result.remote_ms, result.remote_cpu_s))
    if not all(agents for _, agents, _, _ in kinds):
        # No round trip to compare: the ratio is reported as n/a (and its target as missed).
        progress(f"the kernel put every agent on one node: {result.agents_per_node}", quiet)
        return
    progress(f"{result.title}: {len(kinds) * (load.commands // 2)} single-target commands", quiet)
    pids = [node.pid for node in rel.nodes]
    idle_before = [run_time_s(pid) for pid in pids]
    await asyncio.sleep(IDLE_S)
    idle = [(run_time_s(pid) - cpu) / IDLE_S for pid, cpu in zip(pids, idle_before, strict=True)]
    for _, _, _, cpu in kinds:
        cpu[:] = [0.0] * len(pids)
    for n in range(load.commands // 2):
        for kind, agents, times, cpu in kinds:
            before = [run_time_s(pid) for pid in pids]
            started = time.perf_counter()
            request = _request(f"{kind}{n}", [agents[n % len(agents)]])
            try:
                final, ok, seconds = await _answers(send(request, timeout=CALL_DEADLINE_S), started)
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


async def phase(result: Phase, load: Load, workdir: Path, quiet: bool) -> Phase:
    holders = Holders()
    async with FakeUpstream(on_call=holders.on_call) as fake:
        progress(f"{result.title}: starting the release", quiet)
        async with release(
            workdir, result.nodes, load.agents, fake.port, clustered=result.clustered
        ) as rel:
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


def summarise(load: Load, one: Phase, two: Phase, alone: Phase, order: list[str]) -> dict[str, Any]:
    """One round's figures: `one` one node, `two` two clustered, `alone` two unclustered."""
    phases = (one, two, alone)
    hb_ratio = _ratio(two.cpu_us_per_heartbeat, one.cpu_us_per_heartbeat)
    answer_ratio = _ratio(two.cpu_us_per_answer, one.cpu_us_per_answer)
    local_p50, remote_p50 = _p50(two.local_ms), _p50(two.remote_ms)
    rtt_ratio = _ratio(remote_p50, local_p50)
    expected_answers = load.broadcasts * load.agents
    per_kind = load.commands // 2
    local_cpu = _per_command(two.local_cpu_s, per_kind)
    remote_cpu = _per_command(two.remote_cpu_s, per_kind)
    failed_heartbeats = sum(p.heartbeats_failed for p in phases)
    failed_commands = two.commands_failed + alone.commands_failed
    return {
        "benchmark": NAME,
        "agents": load.agents,
        "load_generators": load.loadgens,
        "warmup_s": load.warmup_s,
        "window_s": load.window_s,
        "broadcasts": load.broadcasts,
        "commands": load.commands,
        "heartbeat_interval_s": load.heartbeat_interval_s,
        "order": order,
        "cpu_us_per_heartbeat_1": one.cpu_us_per_heartbeat,
        "cpu_us_per_heartbeat_2": two.cpu_us_per_heartbeat,
        "cpu_us_per_heartbeat_2u": alone.cpu_us_per_heartbeat,
        "cpu_per_heartbeat_ratio_2_vs_1": hb_ratio,
        "cpu_per_heartbeat_ratio_2u_vs_1": _ratio(
            alone.cpu_us_per_heartbeat, one.cpu_us_per_heartbeat
        ),
        "cpu_per_heartbeat_ratio_2_vs_2u": _ratio(
            two.cpu_us_per_heartbeat, alone.cpu_us_per_heartbeat
        ),
        "heartbeats_per_s_1": one.heartbeats / load.window_s,
        "heartbeats_per_s_2": two.heartbeats / load.window_s,
        "heartbeats_per_s_2u": alone.heartbeats / load.window_s,
        "heartbeats_failed": failed_heartbeats,
        "heartbeat_agents_per_node_2": two.heartbeats_per_node,
        "heartbeat_agents_per_node_2u": alone.heartbeats_per_node,
        "cpu_us_per_answer_1": one.cpu_us_per_answer,
        "cpu_us_per_answer_2": two.cpu_us_per_answer,
        "cpu_us_per_answer_2u": alone.cpu_us_per_answer,
        "cpu_per_answer_ratio_2_vs_1": answer_ratio,
        "cpu_per_answer_ratio_2u_vs_1": _ratio(alone.cpu_us_per_answer, one.cpu_us_per_answer),
        "cpu_per_answer_ratio_2_vs_2u": _ratio(two.cpu_us_per_answer, alone.cpu_us_per_answer),
        "answers_1": one.answers,
        "answers_2": two.answers,
        "answers_2u": alone.answers,
        "broadcast_median_s_1": _p50(one.broadcast_s),
        "broadcast_median_s_2": _p50(two.broadcast_s),
        "broadcast_median_s_2u": _p50(alone.broadcast_s),
        "command_agents_per_node_2": two.agents_per_node,
        "command_agents_per_node_2u": alone.agents_per_node,
        "local_rtt_p50_ms": local_p50,
        "cross_node_rtt_p50_ms": remote_p50,
        "cross_node_rtt_ratio": rtt_ratio,
        "local_rtt_p50_ms_2u": _p50(alone.local_ms),
        "cpu_us_per_local_command_by_node": local_cpu,
        "cpu_us_per_cross_node_command_by_node": remote_cpu,
        "cpu_us_per_local_command_by_node_2u": _per_command(alone.local_cpu_s, per_kind),
        "cross_node_cpu_ratio": _ratio(
            sum(remote_cpu) if remote_cpu else None, sum(local_cpu) if local_cpu else None
        ),
        "commands_failed": failed_commands,
        "raw": {
            p.label: {
                "heartbeats": p.heartbeats,
                "heartbeat_cpu_s": p.heartbeat_cpu_s,
                "heartbeat_idle_cpu_s": p.heartbeat_idle_cpu_s,
                "broadcast_cpu_s": p.broadcast_cpu_s,
                "broadcast_idle_cpu_s": p.broadcast_idle_cpu_s,
                "broadcast_runs_s": p.broadcast_s,
            }
            for p in phases
        },
        "targets_met": {
            "all_answered": all(p.answers == expected_answers for p in phases)
            and failed_commands == 0
            and failed_heartbeats == 0,
            "cpu_per_heartbeat_ratio_2_vs_1": hb_ratio is not None and hb_ratio <= TARGET_CPU_RATIO,
            "cpu_per_answer_ratio_2_vs_1": answer_ratio is not None
            and answer_ratio <= TARGET_CPU_RATIO,
            "cross_node_rtt_ratio": rtt_ratio is not None and rtt_ratio <= TARGET_RTT_RATIO,
        },
        "environment": environment(),
    }


# Over the rounds: the median of each figure (a ratio: of the rounds' ratios, each pairing phases
# of the same round), the fewest answers in a round, the failures summed; CPU per command by
# node, node by node; the kernel's spreads and each round's order in `rounds`.
_MEDIAN_KEYS = (
    "cpu_us_per_heartbeat_1",
    "cpu_us_per_heartbeat_2",
    "cpu_us_per_heartbeat_2u",
    "heartbeats_per_s_1",
    "heartbeats_per_s_2",
    "heartbeats_per_s_2u",
    "cpu_us_per_answer_1",
    "cpu_us_per_answer_2",
    "cpu_us_per_answer_2u",
    "broadcast_median_s_1",
    "broadcast_median_s_2",
    "broadcast_median_s_2u",
    "local_rtt_p50_ms",
    "cross_node_rtt_p50_ms",
    "local_rtt_p50_ms_2u",
    "cross_node_cpu_ratio",
)
_RATIO_TARGETS = {
    "cpu_per_heartbeat_ratio_2_vs_1": TARGET_CPU_RATIO,
    "cpu_per_answer_ratio_2_vs_1": TARGET_CPU_RATIO,
    "cross_node_rtt_ratio": TARGET_RTT_RATIO,
}
# The control's decomposition of the first two targets' ratios: no target of their own.
_RATIO_CONTROLS = (
    "cpu_per_heartbeat_ratio_2u_vs_1",
    "cpu_per_heartbeat_ratio_2_vs_2u",
    "cpu_per_answer_ratio_2u_vs_1",
    "cpu_per_answer_ratio_2_vs_2u",
)
_PER_ROUND_KEYS = (
    "order",
    "heartbeat_agents_per_node_2",
    "heartbeat_agents_per_node_2u",
    "command_agents_per_node_2",
    "command_agents_per_node_2u",
    "raw",
)
_BY_NODE_KEYS = (
    "cpu_us_per_local_command_by_node",
    "cpu_us_per_cross_node_command_by_node",
    "cpu_us_per_local_command_by_node_2u",
)


def _median_present(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from the rounds' `summarise` results (the module doc's figures, medians)."""
    result = {k: v for k, v in rounds[0].items() if k not in _PER_ROUND_KEYS}
    for key in (*_MEDIAN_KEYS, *_RATIO_TARGETS, *_RATIO_CONTROLS):
        result[key] = _median_present(r[key] for r in rounds)
    for key in (*_RATIO_TARGETS, *_RATIO_CONTROLS):
        present = [r[key] for r in rounds if r[key] is not None]
        result[f"{key}_min"] = min(present, default=None)
        result[f"{key}_max"] = max(present, default=None)
    for key in _BY_NODE_KEYS:
        by_node = [r[key] for r in rounds if r[key] is not None]
        result[key] = [statistics.median(v) for v in zip(*by_node, strict=True)] or None
    for key in ("answers_1", "answers_2", "answers_2u"):
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
            # Backwards every other round: see the module doc.
            ordered = PHASES if n % 2 == 0 else PHASES[::-1]
            order = [Phase(nodes, clustered) for nodes, clustered in ordered]
            done = {}
            for result in order:
                done[result.label] = await phase(
                    result, load, workdir / f"{n}-{result.label}", quiet
                )
            labels = [p.label for p in order]
            rounds.append(summarise(load, done["1"], done["2"], done["2u"], labels))
    return combine(rounds)


def _fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def _fmt_nodes(values: list[float] | None) -> str:
    return "n/a" if values is None else " + ".join(f"{v:.0f}" for v in values) + " us"


def _fmt_each(result: dict[str, Any], key: str, digits: int = 2, unit: str = "") -> str:
    """`key` of the phases 1 / 2 / 2u (`<key>_1`, ...)."""
    return " / ".join(_fmt(result[f"{key}_{label}"], digits, unit) for label in ("1", "2", "2u"))


def _fmt_min_max(result: dict[str, Any], keys: Iterable[str]) -> str:
    return ", ".join(f"{_fmt(result[f'{key}_min'])} / {_fmt(result[f'{key}_max'])}" for key in keys)


def rows(result: dict[str, Any]) -> list[Row]:
    met = result["targets_met"]
    expected = result["broadcasts"] * result["agents"]
    return [
        Row(
            "answers 1 / 2 / 2 unclustered nodes; failed commands, heartbeats",
            f"{_fmt_each(result, 'answers', 0)}; {result['commands_failed']},"
            f" {result['heartbeats_failed']}",
            f"{expected} / {expected} / {expected}; 0, 0",
            met["all_answered"],
        ),
        Row("heartbeats/s, 1 / 2 / 2 unclustered nodes", _fmt_each(result, "heartbeats_per_s", 0)),
        Row(
            "gateway CPU per heartbeat, 1 / 2 / 2 unclustered nodes",
            _fmt_each(result, "cpu_us_per_heartbeat", 0, " us"),
        ),
        Row(
            "CPU per heartbeat, 2 nodes / 1",
            _fmt(result["cpu_per_heartbeat_ratio_2_vs_1"]),
            f"<= {TARGET_CPU_RATIO}",
            met["cpu_per_heartbeat_ratio_2_vs_1"],
        ),
        Row(
            "  = host (2 unclustered / 1) x cluster (2 / 2 unclustered)",
            f"{_fmt(result['cpu_per_heartbeat_ratio_2u_vs_1'])}"
            f" x {_fmt(result['cpu_per_heartbeat_ratio_2_vs_2u'])}",
            "informational",
        ),
        Row(
            "gateway CPU per broadcast answer, 1 / 2 / 2 unclustered nodes",
            _fmt_each(result, "cpu_us_per_answer", 0, " us"),
        ),
        Row(
            "CPU per answer, 2 nodes / 1",
            _fmt(result["cpu_per_answer_ratio_2_vs_1"]),
            f"<= {TARGET_CPU_RATIO}",
            met["cpu_per_answer_ratio_2_vs_1"],
        ),
        Row(
            "  = host (2 unclustered / 1) x cluster (2 / 2 unclustered)",
            f"{_fmt(result['cpu_per_answer_ratio_2u_vs_1'])}"
            f" x {_fmt(result['cpu_per_answer_ratio_2_vs_2u'])}",
            "informational",
        ),
        Row(
            "command p50, agent on node 1 / on node 2 (via node 1); unclustered, on node 1",
            f"{_fmt(result['local_rtt_p50_ms'], 2, ' ms')}"
            f" / {_fmt(result['cross_node_rtt_p50_ms'], 2, ' ms')};"
            f" {_fmt(result['local_rtt_p50_ms_2u'], 2, ' ms')}",
        ),
        Row(
            "CPU per command (node 1 + node 2), local / cross-node; unclustered, local",
            f"{_fmt_nodes(result['cpu_us_per_local_command_by_node'])}"
            f" / {_fmt_nodes(result['cpu_us_per_cross_node_command_by_node'])};"
            f" {_fmt_nodes(result['cpu_us_per_local_command_by_node_2u'])}",
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
            f"{result['repeat']}; {_fmt_min_max(result, _RATIO_TARGETS)}",
        ),
        Row(
            "control ratios min / max (heartbeat 2u/1, 2/2u; answer 2u/1, 2/2u)",
            _fmt_min_max(result, _RATIO_CONTROLS),
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
        help="rounds of phases (1 node, 2, 2 unclustered); the figures are medians over them",
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
