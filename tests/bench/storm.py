"""Benchmark of admission under a storm (issue 19): `python -m tests.bench.storm [--agents N]`.

Workload: `tests.bench.agents`' cold wave, at 10,000 agents by default: N grpcio agents (one
channel each, in a few load-generator processes) register and subscribe all at once against one
gateway node (`python -m gateway`, its upstream the fake server at 2 ms), then the same against
the bare grpclib server (`tests.bench.agents_bare`) in the same run. The agents honour the
admission's `grpc-retry-pushback-ms` exactly, else retry on the real agent's backoff.

Then, still holding the N agents, the reconnect storm: the node is killed (SIGKILL) and started
again on the same ports and run directory; every agent waits for its stream to end and joins
again as on the first wave. `reconnect_storm_s` runs from the kill until every agent has its
Subscribe again.

Reported (docs/dev/benchmarks.md, "Storm"):
- `connect_timeouts`: attempts whose connection was not set up in time (grpcio's "timed out
  before receiving SETTINGS", "connect() timed out"), counted at the agents; target 0;
- `all_joined_s`: from the wave's start until every agent is subscribed and the fake server has
  all N CONNECTED announcements; target under 60 s;
- `cpu_bound_ratio`: `all_joined_s` / the node's CPU seconds over the same span (N x its CPU
  per join, refused attempts included); target <= 1.2, close to CPU-bound;
- `cpu_bound_ratio_vs_bare`: that ratio over the bare server's own (its wave's time over its
  CPU) in the same run: on a host whose load generators share the node's cores the bare
  transport is not CPU-bound either, and this says how much of the distance is the gateway's;
  target <= 1.1;
- `dropped`: notifications dropped or lost (`/metrics`); target 0;
- `max_stall_ms`: the longest event-loop stall of the wave, at most (the loop monitor's histogram
  window, to its bucket's bound, or the since-start maximum when lower); target under the
  benchmark agents' heartbeat deadline;
- `refusals` and `hints` by call: the node's `yuzu_gw_admission_*` families after the wave (and
  after the restart, under `reconnect`);
- `bare`: the bare server's connect time-outs, time to all joined and CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench.agents import (
    ANNOUNCE_WAIT_S,
    DEFAULT_LATENCY_MS,
    START_TIMEOUT_S,
    Held,
    Server,
    Wave,
    default_loadgens,
    progress,
    running_nodes,
    sample,
    scrape,
    stall_buckets,
    wave,
    window_max_stall,
)
from tests.bench.agents_loadgen import HEARTBEAT_DEADLINE_S
from tests.bench.common import Row, add_common_arguments, environment, report
from tests.bench.storm_backlog import Sampler

NAME = "storm"

DEFAULT_AGENTS = 10_000
TARGET_CPU_BOUND_RATIO = 1.2
TARGET_RATIO_VS_BARE = 1.1
TARGET_ALL_JOINED_S = 60.0
TARGET_MAX_STALL_MS = 1000.0 * HEARTBEAT_DEADLINE_S
CALLS = ("register", "subscribe")
ADMITTED = "yuzu_gw_admission_admitted_total"
REFUSED = "yuzu_gw_admission_refused_total"
HINT = "yuzu_gw_admission_hint_seconds"

_LABELS = re.compile(r'(\w+)="([^"]*)"')


def labelled(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of `name` in a Prometheus exposition, with its labels."""
    found = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line[len(name) + 1 :].rpartition("} ")
            found.append((dict(_LABELS.findall(labels)), float(value)))
    return found


def admission(texts: list[str]) -> dict[str, Any]:
    """The admission's record by call, over a host's nodes (their expositions): admitted,
    refused by reason, and the hints given (how many, their mean, and the bucket bound of the
    longest)."""
    by_call: dict[str, Any] = {}
    for call in CALLS:
        admitted = 0.0
        refused: dict[str, int] = {}
        count = total = 0.0
        longest: float | None = None
        for text in texts:
            admitted += sum(v for labels, v in labelled(text, ADMITTED) if labels["call"] == call)
            for labels, value in labelled(text, REFUSED):
                if labels.get("call") == call:
                    reason = labels.get("reason", "")
                    refused[reason] = refused.get(reason, 0) + int(value)
            count += sample(text, f'{HINT}_count{{call="{call}"}}') or 0.0
            total += sample(text, f'{HINT}_sum{{call="{call}"}}') or 0.0
            buckets = stall_buckets(text, HINT + "_bucket", f'call="{call}",')
            node_longest = window_max_stall(buckets)
            if node_longest is not None:
                longest = max(longest or 0.0, node_longest)
        by_call[call] = {
            "admitted": int(admitted),
            "refused": refused,
            "hints": int(count),
            "hint_mean_ms": 1000.0 * total / count if count else None,
            "hint_max_ms_at_most": None if longest is None else 1000.0 * longest,
        }
    return by_call


async def scrape_nodes(server: Server) -> list[str]:
    return [await scrape(port) for port in server.metrics_ports]


async def reconnect_storm(held: Held, agents: int, quiet: bool) -> dict[str, Any]:
    """Kill the nodes holding the agents (SIGKILL), start them again, and time the agents'
    return."""
    server = held.server
    config, health_port = server.config, server.health_port
    assert config is not None and health_port is not None
    nodes = len(server.pids)
    announced_before = held.fake.notified
    held.generators.rejoin()
    progress(f"reconnect storm: SIGKILL to the {nodes} node(s) holding {agents}", quiet)
    sampler = Sampler()
    sampler.start()
    started = time.perf_counter()
    for pid in server.pids:
        os.kill(pid, signal.SIGKILL)
    async with running_nodes(held.workdir, config, health_port, nodes) as processes:
        ready_s = time.perf_counter() - started
        outcome = await held.generators.joined(START_TIMEOUT_S + agents / 20.0)
        back_s = time.perf_counter() - started
        deadline = time.monotonic() + ANNOUNCE_WAIT_S
        while held.fake.notified - announced_before < agents and time.monotonic() < deadline:
            held.fake.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(held.fake.changed.wait(), 0.5)
        announced = held.fake.notified - announced_before
        announced_s = time.perf_counter() - started if announced >= agents else None
        backlog = (await sampler.stop()).of(server.agent_port)
        texts = await scrape_nodes(server)
        progress(
            f"reconnect storm: {outcome.subscribed} back in {back_s:.3f} s"
            f" ({outcome.retries} retries, node ready after {ready_s:.3f} s)",
            quiet,
        )
        return {
            "restarted_pids": [process.pid for process in processes],
            "node_ready_s": ready_s,
            "subscribed": outcome.subscribed,
            "subscribe_failed": outcome.failed,
            "join_retries": outcome.retries,
            "connect_timeouts": outcome.connect_timeouts,
            "seconds_to_all_subscribed": back_s if outcome.subscribed == agents else None,
            "announced": announced,
            "seconds_to_all_announced": announced_s,
            "admission": admission(texts),
            "accept_queue": backlog,
        }


def _ratio_of(result: Wave) -> float | None:
    """A wave's time to all joined over its server's CPU seconds (1.0: CPU-bound)."""
    if result.seconds_to_all is None or result.cpu_s <= 0:
        return None
    return result.seconds_to_all / result.cpu_s


def _dropped(gateway: Wave) -> int | None:
    return None if gateway.dropped is None else int(gateway.dropped + (gateway.lost or 0))


def _server(result: Wave) -> dict[str, Any]:
    return {
        "subscribed": result.subscribed,
        "subscribe_failed": result.failed,
        "join_retries": result.retries,
        "connect_timeouts": result.connect_timeouts,
        "announced": result.announced,
        "all_joined_s": result.seconds_to_all,
        "seconds_to_last_join": result.seconds_to_last_join,
        "cpu_s": result.cpu_s,
        "cpu_ms_per_agent": result.cpu_ms_per_agent,
    }


async def run(
    agents: int,
    loadgens: int,
    latency_ms: float,
    quiet: bool,
    *,
    keep: Path | None = None,
    nodes: int = 1,
) -> dict[str, Any]:
    """One run; `keep`: a directory to keep the processes' logs in (else a temporary one);
    `nodes`: the gateway's nodes on this host, sharing the agent port."""
    storm: dict[str, Any] = {}
    sampler = Sampler()

    async def held(state: Held) -> None:
        storm["accept_queue"] = (await sampler.stop()).of(state.server.agent_port)
        texts = await scrape_nodes(state.server)
        storm["admission"] = admission(texts)
        # Each node's own record: their admissions are theirs (docs/agent-plane.md).
        storm["admission_by_node"] = [admission([text]) for text in texts]
        storm["reconnect"] = await reconnect_storm(state, agents, quiet)

    async def bare_held(state: Held) -> None:
        storm["bare_accept_queue"] = (await sampler.stop()).of(state.server.agent_port)

    with contextlib.ExitStack() as scope:
        if keep is None:
            workdir = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="yuzu-storm-")))
        else:
            workdir = keep
            workdir.mkdir(parents=True)
        (workdir / "gateway").mkdir()
        (workdir / "bare").mkdir()
        sampler.start()
        gateway = await wave(
            "gateway",
            agents,
            loadgens,
            latency_ms,
            workdir=workdir / "gateway",
            quiet=quiet,
            held=held,
            # The node's own defaults, not the test posture's lifted bound: the storm is theirs.
            production_admission=True,
            nodes=nodes,
        )
        sampler = Sampler()
        sampler.start()
        bare = await wave(
            "bare",
            agents,
            loadgens,
            latency_ms,
            workdir=workdir / "bare",
            quiet=quiet,
            held=bare_held,
        )
    all_joined = gateway.seconds_to_all
    ratio = _ratio_of(gateway)
    bare_ratio = _ratio_of(bare)
    vs_bare = None if ratio is None or bare_ratio is None else ratio / bare_ratio
    dropped = _dropped(gateway)
    stall_ms = (
        None
        if gateway.max_stall_in_wave_s is None
        else round(1000 * gateway.max_stall_in_wave_s, 1)
    )
    reconnect = storm["reconnect"]
    by_call = storm["admission"]
    return {
        "benchmark": NAME,
        "agents": agents,
        "nodes": nodes,
        "load_generators": loadgens,
        "upstream_latency_ms": latency_ms,
        "connect_timeouts": gateway.connect_timeouts,
        "all_joined_s": all_joined,
        "cpu_bound_ratio": ratio,
        "cpu_bound_ratio_bare": bare_ratio,
        "cpu_bound_ratio_vs_bare": vs_bare,
        "dropped": dropped,
        "max_stall_ms": stall_ms,
        "reconnect_storm_s": reconnect["seconds_to_all_subscribed"],
        "refusals": {call: by_call[call]["refused"] for call in CALLS},
        "admission": by_call,
        "admission_by_node": storm["admission_by_node"],
        # Where the new connections waited: the agent listener's accept queue (storm_backlog.py).
        "accept_queue": storm["accept_queue"],
        "gateway": _server(gateway),
        "bare": _server(bare) | {"accept_queue": storm["bare_accept_queue"]},
        "reconnect": reconnect,
        "targets_met": {
            "connect_timeouts": gateway.connect_timeouts == 0,
            "all_joined": gateway.subscribed == agents and all_joined is not None,
            "all_joined_s": all_joined is not None and all_joined < TARGET_ALL_JOINED_S,
            "cpu_bound_ratio": ratio is not None and ratio <= TARGET_CPU_BOUND_RATIO,
            "cpu_bound_ratio_vs_bare": vs_bare is not None and vs_bare <= TARGET_RATIO_VS_BARE,
            "dropped": dropped == 0,
            "max_stall_ms": stall_ms is not None and stall_ms < TARGET_MAX_STALL_MS,
            "reconnect_all_back": reconnect["seconds_to_all_subscribed"] is not None,
        },
        "environment": environment() | {"loadavg": os.getloadavg()},
    }


def _fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def _refusals(by_call: dict[str, Any]) -> str:
    return "; ".join(
        f"{call} {sum(by_call[call]['refused'].values())}"
        f" (hint mean {_fmt(by_call[call]['hint_mean_ms'], 0, ' ms')},"
        f" max <= {_fmt(by_call[call]['hint_max_ms_at_most'], 0, ' ms')})"
        for call in CALLS
    )


def _queue(queue: dict[str, int | None]) -> str:
    return (
        f"{queue['accept_queue_max']} / {queue['backlog']}"
        f" ({queue['listen_overflows']} listen overflows on the host, {queue['samples']} samples)"
    )


def rows(result: dict[str, Any]) -> list[Row]:
    met = result["targets_met"]
    n = result["agents"]
    gateway, bare, reconnect = result["gateway"], result["bare"], result["reconnect"]
    return [
        Row(
            "connect time-outs, gateway",
            str(result["connect_timeouts"]),
            "0",
            met["connect_timeouts"],
        ),
        Row("connect time-outs, bare grpclib", str(bare["connect_timeouts"])),
        Row(
            "time to all subscribed and announced, gateway",
            _fmt(result["all_joined_s"], 3, " s"),
            f"{n} of {n}, < {TARGET_ALL_JOINED_S:g} s",
            met["all_joined"] and met["all_joined_s"],
        ),
        Row("time to all subscribed and announced, bare", _fmt(bare["all_joined_s"], 3, " s")),
        Row(
            "all joined / node CPU (N x CPU per join)",
            _fmt(result["cpu_bound_ratio"]),
            f"<= {TARGET_CPU_BOUND_RATIO}",
            met["cpu_bound_ratio"],
        ),
        Row(
            "  the same, gateway over bare (its own, bare)",
            f"{_fmt(result['cpu_bound_ratio_vs_bare'])} ({_fmt(result['cpu_bound_ratio_bare'])})",
            f"<= {TARGET_RATIO_VS_BARE}",
            met["cpu_bound_ratio_vs_bare"],
        ),
        Row(
            "node CPU per join, gateway / bare",
            f"{gateway['cpu_ms_per_agent']:.3f} ms / {bare['cpu_ms_per_agent']:.3f} ms",
        ),
        Row(
            "retries after a failed join, gateway / bare",
            f"{gateway['join_retries']} / {bare['join_retries']}",
        ),
        Row("refused with a hint (wave)", _refusals(result["admission"])),
        Row("notifications dropped (+ lost)", str(result["dropped"]), "0", met["dropped"]),
        Row(
            "longest loop stall of the wave (at most)",
            _fmt(result["max_stall_ms"], 0, " ms"),
            f"< {TARGET_MAX_STALL_MS:g} ms",
            met["max_stall_ms"],
        ),
        Row(
            "reconnect storm: SIGKILL to all back",
            _fmt(result["reconnect_storm_s"], 3, " s"),
            f"{n} of {n}",
            met["reconnect_all_back"],
        ),
        Row(
            "  node ready / back / retries / connect time-outs",
            f"{reconnect['node_ready_s']:.3f} s / {reconnect['subscribed']}"
            f" / {reconnect['join_retries']} / {reconnect['connect_timeouts']}",
        ),
        Row("  refused with a hint (reconnect)", _refusals(reconnect["admission"])),
        Row("accept queue deepest / backlog, gateway", _queue(result["accept_queue"])),
        Row("accept queue deepest / backlog, bare", _queue(bare["accept_queue"])),
        Row("accept queue deepest / backlog, reconnect", _queue(reconnect["accept_queue"])),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.storm", description=__doc__)
    parser.add_argument("--agents", type=int, default=DEFAULT_AGENTS)
    parser.add_argument(
        "--loadgens", type=int, help="load-generator processes (default: one per 4,500 agents)"
    )
    parser.add_argument("--latency-ms", type=float, default=DEFAULT_LATENCY_MS)
    parser.add_argument(
        "--nodes",
        default="1",
        help="gateway nodes on this host sharing the agent port, as `rel/yuzu_gw start --nodes`"
        " runs them; `auto`: one per CPU (default 1)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--keep-logs", type=Path, help="a new directory to keep every process's log in"
    )
    add_common_arguments(parser, NAME)
    args = parser.parse_args(argv)
    if args.agents <= 0:
        parser.error("--agents must be positive")
    if args.nodes == "auto":
        nodes = os.cpu_count() or 1
    elif args.nodes.isdigit() and int(args.nodes) > 0:
        nodes = int(args.nodes)
    else:
        parser.error("--nodes must be a positive number or auto")
    loadgens = args.loadgens or default_loadgens(args.agents)
    result = asyncio.run(
        run(args.agents, loadgens, args.latency_ms, args.quiet, keep=args.keep_logs, nodes=nodes)
    )
    report(result, rows(result), args.out, args.json)


if __name__ == "__main__":
    main()
