"""A loaded node's planned stop: `python -m tests.bench.planned_stop [--agents N] [--budget-ms MS]`.

Workload (issue 21, section 2; seed: "Planned stop", "Stop timeout coupling"): N grpcio agents in
load-generator processes (`tests.bench.agents_loadgen`) register, subscribe and send one
heartbeat each against a gateway started as a subprocess (`python -m gateway`) whose upstream is
the fake server (`gateway.devstack.fake_upstream`, in this process, so each call is recorded
with its request). The heartbeat buffer's interval is long, so the heartbeats wait for the
stop's own flush, and mem_reclaim reads the agent count every 100 ms, so a reclaim pass the stop's
drop could start would show. Then SIGTERM.

Measured: the seconds from SIGTERM to the process's exit and its exit status; the DISCONNECTED
notices the server accepted (once per session?) and when the last one arrived; whether the
heartbeat buffer's last flush arrived (every session's heartbeat in a BatchHeartbeat after
SIGTERM); and the gateway's own lines about the stop (a step late, a failed send, a reclaim
pass).

Targets: every session's DISCONNECTED accepted once, within `shutdown_flush_budget_ms`; the
heartbeats flushed; exit status 0; no step late.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from gateway.devstack.fake_upstream import FakeUpstream
from protos.yuzu.gateway.v1 import gateway_pb2
from tests.bench.agents import AGENTS_PER_LOADGEN, LoadGenerators, gateway_config, running_gateway
from tests.bench.common import Row, add_common_arguments, environment, report

NAME = "planned_stop"
DEFAULT_AGENTS = 5000
DEFAULT_BUDGET_MS = 20000
# The heartbeat buffer holds every heartbeat until the stop's flush (its interval is longer
# than the run: its most, 60 s), so the flush is the one that has to arrive.
HEARTBEAT_HOLD_MS = 60_000
# One heartbeat an agent: a window of one interval.
HEARTBEAT_WINDOW_S = 2.0
HEARTBEAT_INTERVAL_S = 2.0
JOIN_TIMEOUT_S = 180.0
# After the budget the tree still stops (listeners, /metrics): the stop's own margin.
EXIT_MARGIN_S = 20.0
DISCONNECTED = gateway_pb2.StreamStatusNotification.DISCONNECTED
CONNECTED = gateway_pb2.StreamStatusNotification.CONNECTED
NOTIFY = "NotifyStreamStatus"
# A mem_reclaim pass's notice: the bench reads the agent count often (RECLAIM_READ_MS), so a
# pass started by the stop's drop would show.
RECLAIM_PASS = "gateway memory reclaim: #{pass"
RECLAIM_READ_MS = 100
STOP_LINES = (
    "did not finish in time",
    "not retried",
    "not sent by the",
    "Planned stop",
    RECLAIM_PASS,
)


@dataclass
class StopResult:
    agents: int
    budget_ms: int
    subscribed: int = 0
    exit_status: int | None = None
    exit_s: float | None = None
    disconnected_accepted: int = 0
    disconnected_sessions: int = 0
    disconnected_repeated: int = 0
    disconnected_failed: int = 0
    first_disconnected_s: float | None = None
    last_disconnected_s: float | None = None
    heartbeats_buffered: int = 0
    heartbeats_flushed: int = 0
    lines: list[str] = field(default_factory=list)

    @property
    def met(self) -> bool:
        return (
            self.exit_status == 0
            and self.disconnected_sessions == self.subscribed == self.agents
            and self.disconnected_repeated == 0
            and self.last_disconnected_s is not None
            and self.last_disconnected_s <= self.budget_ms / 1000
            and self.heartbeats_flushed == self.heartbeats_buffered
            and not any("did not finish" in line for line in self.lines)
        )


def _config(path: Path, agents: int, fake_port: int, budget_ms: int) -> tuple[int, int]:
    """The benchmark gateway's config; returns its health and agent ports."""
    ports = gateway_config(path, agents, fake_port)
    text = path.read_text()
    text = text.replace(
        "{shutdown_flush_budget_ms, 2000}", f"{{shutdown_flush_budget_ms, {budget_ms}}}"
    )
    text = text.replace(
        "{heartbeat_batch_interval_ms, 100}",
        f"{{heartbeat_batch_interval_ms, {HEARTBEAT_HOLD_MS}}}",
    )
    reclaim = f"{{mem_reclaim, #{{interval_ms => {RECLAIM_READ_MS}}}}}"
    text = text.replace("{shutdown_flush_budget_ms,", f"{reclaim}, {{shutdown_flush_budget_ms,", 1)
    path.write_text(text)
    return ports["health"], ports["agent"]


async def measure(workdir: Path, agents: int, budget_ms: int) -> StopResult:
    result = StopResult(agents, budget_ms)
    async with FakeUpstream() as fake:
        config = workdir / "planned_stop.config"
        health, agent_port = _config(config, agents, fake.port, budget_ms)
        async with running_gateway(workdir, config, health) as node:
            generators = math.ceil(agents / AGENTS_PER_LOADGEN)
            async with LoadGenerators.started(workdir, agent_port, agents, generators) as load:
                load.go()
                result.subscribed = (await load.joined(JOIN_TIMEOUT_S)).subscribed
                await fake.wait_for_calls(
                    NOTIFY,
                    result.subscribed,
                    timeout=JOIN_TIMEOUT_S,
                    where=lambda c: c.request.event == CONNECTED,
                    answered=True,
                )
                result.heartbeats_buffered, _ = await load.heartbeats(
                    HEARTBEAT_WINDOW_S, HEARTBEAT_INTERVAL_S
                )
                fake.clear()
                started = time.monotonic()
                node.send_signal(signal.SIGTERM)
                bound = budget_ms / 1000 + EXIT_MARGIN_S
                result.exit_status = await asyncio.wait_for(node.wait(), bound)
                result.exit_s = time.monotonic() - started
        _count(result, fake, started)
    log = (workdir / "gateway.log").read_text(errors="replace").splitlines()
    result.lines = [line for line in log if any(key in line for key in STOP_LINES)][:40]
    return result


def _count(result: StopResult, fake: FakeUpstream, started: float) -> None:
    accepted = [
        c
        for c in fake.calls(NOTIFY)
        if c.request.event == DISCONNECTED and c.code is grpc.StatusCode.OK
    ]
    per_session = Counter(c.request.session_id for c in accepted)
    result.disconnected_accepted = len(accepted)
    result.disconnected_sessions = len(per_session)
    result.disconnected_repeated = sum(n - 1 for n in per_session.values())
    result.disconnected_failed = sum(
        1
        for c in fake.calls(NOTIFY)
        if c.request.event == DISCONNECTED and c.code is not grpc.StatusCode.OK
    )
    if accepted:
        result.first_disconnected_s = min(c.received_at for c in accepted) - started
        result.last_disconnected_s = max(c.received_at for c in accepted) - started
    flushed = {
        beat.session_id
        for c in fake.calls("BatchHeartbeat")
        if c.code is grpc.StatusCode.OK
        for beat in c.request.heartbeats
    }
    result.heartbeats_flushed = len(flushed)


def rows(result: StopResult) -> list[Row]:
    budget_s = result.budget_ms / 1000
    last = result.last_disconnected_s
    return [
        Row("exit_status", str(result.exit_status), "0", result.exit_status == 0),
        Row("exit_s", f"{result.exit_s:.2f}" if result.exit_s is not None else "-"),
        Row(
            "disconnected_sessions",
            f"{result.disconnected_sessions} / {result.agents}",
            "all, once each",
            result.disconnected_sessions == result.agents and result.disconnected_repeated == 0,
        ),
        Row(
            "last_disconnected_s",
            f"{last:.2f}" if last is not None else "-",
            f"<= {budget_s:g}",
            last is not None and last <= budget_s,
        ),
        Row(
            "heartbeats_flushed",
            f"{result.heartbeats_flushed} / {result.heartbeats_buffered}",
            "all",
            result.heartbeats_flushed == result.heartbeats_buffered,
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=DEFAULT_AGENTS)
    parser.add_argument("--budget-ms", type=int, default=DEFAULT_BUDGET_MS)
    parser.add_argument("--keep", type=Path, help="run in this new directory and keep its logs")
    add_common_arguments(parser, NAME)
    args = parser.parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True)
        result = asyncio.run(measure(args.keep, args.agents, args.budget_ms))
    else:
        with tempfile.TemporaryDirectory(prefix="planned-stop-") as tmp:
            result = asyncio.run(measure(Path(tmp), args.agents, args.budget_ms))
    summary = {**asdict(result), "environment": environment(), "targets_met": result.met}
    report(summary, rows(result), args.out, args.json)


if __name__ == "__main__":
    main()
