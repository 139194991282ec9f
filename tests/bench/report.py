"""Every benchmark of the project in one table: `python -m tests.bench.report [--quick]
[--only NAME,...]`.

Runs each benchmark of `tests/bench/` as a subprocess (`python -m tests.bench.<name> --json
--out <tmp>`, with small sizes under `--quick`), reads its JSON, and writes one table with each
figure beside the specification's measured figure for the same workload (the seed's figures
are indexed in /work/shared/design/SPEC_INDEX.md section 9, as F01..F56) and whether its target
is met: `bench-results/report.json`, `bench-results/report.md`, and the Markdown on stdout. A
benchmark that fails to run (exit status, timeout, no JSON) is a row saying so, never a crash.
Like every benchmark, the report exits 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.common import REPO_ROOT, RESULTS_DIR, environment, write_json

NAME = "report"
DEFAULT_TIMEOUT_S = 1800.0
QUICK_TIMEOUT_S = 300.0
STDERR_TAIL = 400  # characters of a failed benchmark's stderr kept in its row


@dataclass(frozen=True)
class Figure:
    """One row: a value of the benchmark's JSON (a dotted path), the seed's figure for the same
    workload, the target, and the `targets_met` key that says whether it is met."""

    label: str
    key: str
    spec: str = "none (no seed figure)"
    target: str = ""
    met: str | None = None
    unit: str = ""
    digits: int = 2


@dataclass(frozen=True)
class Bench:
    name: str
    workload: str
    figures: tuple[Figure, ...]
    quick: tuple[str, ...] = ()  # the arguments of a --quick run (a full run: the defaults)
    quiet: bool = True  # the benchmark takes --quiet


BENCHES: tuple[Bench, ...] = (
    Bench(
        "runtime",
        "runtime: spawn + exchange, idle actor memory",
        (
            Figure(
                "speedup vs thespian simpleSystemBase",
                "speedup_vs_simple_base",
                target=">= 10",
                met="speedup_vs_simple_base",
                unit="x",
                digits=1,
            ),
            Figure(
                "bytes per idle actor",
                "bytes_per_idle_actor",
                target="<= 1536",
                met="bytes_per_idle_actor",
                unit=" B",
                digits=0,
            ),
            Figure(
                "time per message, largest / smallest N",
                "per_msg_ratio_100k_vs_10k",
                target="<= 1.5",
                met="per_msg_ratio",
            ),
        ),
        quick=("--n", "2000,10000", "--simple-n", "5000", "--repeat", "1"),
    ),
    Bench(
        "permits",
        "permit burst: 600 Registers, 48 permits, 50 ms server",
        (
            Figure(
                "burst elapsed (median)",
                "elapsed_s",
                spec="F01: 0.67 s",
                target="<= 1.1 x calls/permits x latency",
                met="elapsed_within_1_1x_bound",
                unit=" s",
                digits=3,
            ),
            Figure(
                "refused", "refused", spec="F01: 0 refused", target="0", met="refused", digits=0
            ),
            Figure(
                "peak in flight",
                "peak_in_flight",
                spec="F01: <= 48 in flight",
                target="= permits",
                met="peak_in_flight",
                digits=0,
            ),
        ),
        quick=("--calls", "96", "--repeat", "1", "--no-reference"),
    ),
    Bench(
        "agents",
        "cold wave and memory per agent",
        (
            Figure(
                "notifications dropped",
                "notifications_dropped",
                spec="F14: 0 dropped, 1,000 sim agents",
                target="0",
                met="notifications_dropped",
                digits=0,
            ),
            Figure(
                "seconds until all subscribed",
                "seconds_to_all_subscribed",
                spec="F29: 1,000 registered in about 1.9 s (Erlang rig)",
                target="all N",
                met="all_subscribed",
                unit=" s",
            ),
            Figure(
                "CPU per agent, gateway / bare grpclib",
                "cpu_per_agent_ratio",
                target="<= 1.3",
                met="cpu_per_agent_ratio",
            ),
            Figure("memory per held agent", "kb_per_agent", unit=" KB", digits=1),
            Figure(
                "memory per agent, gateway / bare grpclib",
                "memory_per_agent_ratio",
                target="<= 1.25",
                met="memory_per_agent_ratio",
            ),
            Figure(
                "longest loop stall while heartbeating",
                "max_loop_stall_ms",
                target="<= 50 ms",
                met="max_loop_stall_ms",
                unit=" ms",
                digits=0,
            ),
        ),
        quick=("--agents", "100", "--heartbeat-window-s", "2", "--heartbeat-interval-s", "2"),
    ),
    Bench(
        "storm",
        "10,000-agent cold wave, admission, SIGKILL reconnect storm",
        (
            Figure(
                "connects that timed out",
                "connect_timeouts",
                target="0",
                met="connect_timeouts",
                digits=0,
            ),
            Figure(
                "seconds until all subscribed and announced",
                "all_joined_s",
                spec="seed 003: 5,000 of 5,000 back within 39 s",
                target="< 60 s",
                met="all_joined_s",
                unit=" s",
            ),
            Figure(
                "all joined / node CPU",
                "cpu_bound_ratio",
                target="<= 1.2",
                met="cpu_bound_ratio",
            ),
            Figure("notifications dropped", "dropped", target="0", met="dropped", digits=0),
            Figure(
                "longest loop stall of the wave",
                "max_stall_ms",
                target="< heartbeat deadline",
                met="max_stall_ms",
                unit=" ms",
                digits=0,
            ),
            Figure(
                "SIGKILL to all back",
                "reconnect_storm_s",
                target="all N",
                met="reconnect_all_back",
                unit=" s",
            ),
        ),
        quick=("--agents", "200"),
    ),
    Bench(
        "heartbeats",
        "heartbeat ingest",
        (
            Figure("heartbeats admitted per second", "heartbeats_per_s", unit="/s", digits=0),
            Figure(
                "rate, gateway / bare grpclib",
                "ratio_vs_bare",
                target=">= 0.8",
                met="ratio_vs_bare",
            ),
            Figure("CPU per heartbeat", "cpu_us_per_heartbeat", unit=" us", digits=0),
            Figure(
                "upstream bytes per heartbeat",
                "upstream_bytes_per_heartbeat",
                spec="F34: 21 one-heartbeat flushes in 10 min, 1 agent (not comparable)",
                unit=" B",
                digits=1,
            ),
        ),
        quick=("--agents", "20", "--warmup-s", "1", "--window-s", "2"),
    ),
    Bench(
        "replay",
        "full registration replay, 50 ms server",
        (
            Figure(
                "replay elapsed",
                "elapsed_s",
                spec="F03: 5,000 agents in 10.7 s at 50 ms (4.5 s at 20 ms)",
                target="<= 1.05 x bound",
                met="elapsed_within_1_05x_bound",
                unit=" s",
            ),
            Figure(
                "sessions replayed",
                "replayed",
                target="all",
                met="replayed_all",
                digits=0,
            ),
        ),
        quick=("--sessions", "200"),
    ),
    Bench(
        "fanout",
        "SendCommand fan-out latency",
        (
            Figure(
                "single-target p50",
                "single_p50_ms",
                spec="F23: p50 about 29 ms (mTLS, 30 agents, concurrency 4)",
                unit=" ms",
            ),
            Figure(
                "single-target p99, gateway / bare relay",
                "single_p99_ratio_vs_bare",
                target="<= 1.5",
                met="single_p99_ratio_vs_bare",
            ),
            Figure("broadcast to all", "broadcast_s", unit=" s", digits=3),
            Figure(
                "broadcast, gateway / bare relay",
                "broadcast_ratio_vs_bare",
                target="<= 1.5",
                met="broadcast_ratio_vs_bare",
            ),
        ),
        quick=("--agents", "100", "--rate", "50", "--duration-s", "2"),
    ),
    Bench(
        "owner_kill",
        "owner-kill recovery",
        (
            Figure(
                "recovery of the killed owners",
                "recovery_ms",
                spec="F11: 500 of 5,000 killed, recovered within 147 ms (50 of 500: 22 ms)",
                target="<= 1.3 x bare",
                met="within_1_3x_bare",
                unit=" ms",
                digits=0,
            ),
            Figure(
                "reconnects",
                "reconnects",
                spec="F11: no reconnects",
                target="0",
                met="no_reconnects",
                digits=0,
            ),
        ),
        quick=("--agents", "200", "--kill", "20"),
    ),
    Bench(
        "scrape",
        "/metrics scrape with many open sockets",
        (
            Figure(
                "scrape median, gateway / library",
                "ratio",
                target="< 0.1, same families and open-fd count",
                met="",
            ),
        ),
        quick=("--fds", "200", "--scrapes", "5"),
        quiet=False,
    ),
    Bench(
        "scale",
        "multi-node scaling (cost, 2 nodes vs 1)",
        (
            Figure(
                "CPU per heartbeat, 2 nodes / 1",
                "cpu_per_heartbeat_ratio_2_vs_1",
                spec="none (seed: one node per core, no figure)",
                target="<= 1.15",
                met="cpu_per_heartbeat_ratio_2_vs_1",
            ),
            Figure(
                "CPU per broadcast answer, 2 nodes / 1",
                "cpu_per_answer_ratio_2_vs_1",
                target="<= 1.15",
                met="cpu_per_answer_ratio_2_vs_1",
            ),
            Figure(
                "command round trip p50, cross-node / local",
                "cross_node_rtt_ratio",
                target="<= 1.5",
                met="cross_node_rtt_ratio",
            ),
            # The control (docs/dev/benchmarks.md, "The control"): 2 / 1 = host x cluster.
            Figure(
                "CPU per heartbeat, 2 unclustered / 1 (the host)", "cpu_per_heartbeat_ratio_2u_vs_1"
            ),
            Figure(
                "CPU per heartbeat, 2 / 2 unclustered (the cluster)",
                "cpu_per_heartbeat_ratio_2_vs_2u",
            ),
            Figure("CPU per answer, 2 unclustered / 1 (the host)", "cpu_per_answer_ratio_2u_vs_1"),
            Figure(
                "CPU per answer, 2 / 2 unclustered (the cluster)", "cpu_per_answer_ratio_2_vs_2u"
            ),
        ),
        quick=(
            "--agents",
            "40",
            "--warmup-s",
            "1",
            "--window-s",
            "2",
            "--commands",
            "20",
            "--broadcasts",
            "3",
        ),
    ),
)
BY_NAME = {bench.name: bench for bench in BENCHES}


# -- running one benchmark -----------------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    seconds: float
    result: dict[str, Any] | None = None
    error: str | None = None
    command: list[str] = field(default_factory=list)


def command(bench: Bench, out: Path, *, quick: bool) -> list[str]:
    args = [sys.executable, "-m", f"tests.bench.{bench.name}", "--json", "--out", str(out)]
    if bench.quiet:
        args.append("--quiet")
    return args + list(bench.quick if quick else ())


def run_one(bench: Bench, workdir: Path, *, quick: bool, timeout_s: float) -> Outcome:
    out = workdir / f"{bench.name}.json"
    argv = command(bench, out, quick=quick)
    print(f"report: running {' '.join(argv[1:])}", file=sys.stderr, flush=True)
    started = time.monotonic()
    outcome = Outcome(bench.name, 0.0, command=argv[1:])
    try:
        done = subprocess.run(
            argv,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        outcome.error = f"timed out after {timeout_s:g} s"
    else:
        if done.returncode != 0:
            outcome.error = f"exited {done.returncode}: {done.stderr[-STDERR_TAIL:].strip()}"
        else:
            try:
                outcome.result = json.loads(out.read_text())
            except (OSError, ValueError) as exc:
                outcome.error = f"no JSON result: {exc}"
    outcome.seconds = time.monotonic() - started
    return outcome


# -- the table ------------------------------------------------------------------------------------


def lookup(result: dict[str, Any], key: str) -> Any:
    value: Any = result
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def fmt(value: Any, figure: Figure) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return f"{value:,.{figure.digits}f}{figure.unit}"
    return str(value)


def met(result: dict[str, Any], figure: Figure) -> bool | None:
    """Whether the figure's target is met; None when it has none. `met=""` reads a benchmark
    whose `targets_met` is one boolean."""
    if figure.met is None:
        return None
    targets = result.get("targets_met")
    if isinstance(targets, bool):
        return targets
    if isinstance(targets, dict) and isinstance(targets.get(figure.met), bool):
        return bool(targets[figure.met])
    return None


def rows(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    table = []
    for outcome in outcomes:
        bench = BY_NAME[outcome.name]
        if outcome.result is None:
            table.append(
                {
                    "benchmark": bench.name,
                    "workload": bench.workload,
                    "figure": "did not run",
                    "measured": f"failed: {outcome.error}",
                    "specification": "",
                    "target": "",
                    "met": None,
                }
            )
            continue
        for figure in bench.figures:
            value = lookup(outcome.result, figure.key)
            table.append(
                {
                    "benchmark": bench.name,
                    "workload": bench.workload,
                    "figure": figure.label,
                    "key": figure.key,
                    "value": value,
                    "measured": fmt(value, figure),
                    "specification": figure.spec,
                    "target": figure.target,
                    "met": met(outcome.result, figure),
                }
            )
    return table


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(table: Sequence[dict[str, Any]], *, quick: bool) -> str:
    verdict = {True: "met", False: "**missed**", None: ""}
    lines = [
        "# Benchmark report" + (" (--quick: small sizes, not comparable)" if quick else ""),
        "",
        "| workload | benchmark | figure | measured | specification (seed) | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in table:
        cells = (
            row["workload"],
            row["benchmark"],
            row["figure"],
            row["measured"],
            row["specification"],
            row["target"],
            verdict[row["met"]],
        )
        lines.append("| " + " | ".join(_cell(str(cell)) for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def build(outcomes: Sequence[Outcome], *, quick: bool) -> tuple[dict[str, Any], str]:
    table = rows(outcomes)
    report = {
        "benchmark": NAME,
        "quick": quick,
        "rows": table,
        "runs": {
            o.name: {
                "command": o.command,
                "seconds": round(o.seconds, 1),
                "error": o.error,
                "result": o.result,
            }
            for o in outcomes
        },
        "targets_met": {
            f"{row['benchmark']}.{row.get('key', 'run')}": row["met"]
            for row in table
            if row["met"] is not None
        },
        "failed": [o.name for o in outcomes if o.result is None],
        "environment": environment(),
    }
    return report, markdown(table, quick=quick)


def names(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(BY_NAME))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown benchmark {', '.join(unknown) or '(none)'}; known: {', '.join(BY_NAME)}"
        )
    return chosen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.report", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes for every benchmark")
    parser.add_argument(
        "--only", type=names, help=f"a subset, comma-separated: {','.join(BY_NAME)}"
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        help=f"per benchmark (default {DEFAULT_TIMEOUT_S:g}, {QUICK_TIMEOUT_S:g} with --quick)",
    )
    parser.add_argument(
        "--out-dir", type=Path, default=RESULTS_DIR, help="where report.json and report.md go"
    )
    args = parser.parse_args(argv)
    timeout_s = args.timeout_s or (QUICK_TIMEOUT_S if args.quick else DEFAULT_TIMEOUT_S)
    chosen = [BY_NAME[name] for name in args.only] if args.only else list(BENCHES)
    with tempfile.TemporaryDirectory(prefix="yuzu-report-") as workdir:
        outcomes = [
            run_one(bench, Path(workdir), quick=args.quick, timeout_s=timeout_s) for bench in chosen
        ]
    report, text = build(outcomes, quick=args.quick)
    write_json(report, args.out_dir / f"{NAME}.json")
    (args.out_dir / f"{NAME}.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"results written to {args.out_dir / NAME}.json and .md")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
