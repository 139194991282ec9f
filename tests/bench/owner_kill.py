"""Benchmark of owner-crash recovery: `python -m tests.bench.owner_kill [--agents N] [--kill K]
[--json]`.

Workload (issue 7, section 5; seed: "When an agent's owner process crashes"): a gateway node
holding N sessions (default 5,000) has K of their owners (default 500) killed at once
(`runtime.kill`: no terminate, as an operator's kill). Each restarted owner sends the
predecessor's DISCONNECTED, waits for it to settle, registers the session again, presents it
(ProxyRegister with the session id) and announces CONNECTED with the same stream home id.

- The fake server runs in a SUBPROCESS (`python -m gateway.devstack.fake_upstream`, a mocked server
  that answers at once unless `--latency-ms` is given), as tests/bench/replay.py starts it.
- The gateway is a real node in this process; the sessions are held as tests/bench/replay.py
  holds them (the registry's Reserve, Commit, TakePending, then an owner under agent_sup with a
  `StreamHandle`), without sockets: the agent's side of a stream is its handle. An agent
  reconnects when its stream ends, so `reconnects` counts the handles that were ended.
- Measured: from the kills to the moment every killed session's CONNECTED has been answered by
  the server and a command sent through the router (`RouteCommand` to the K agent ids) has
  reached every one of their streams (`recovery_ms`). Then, in the same run, the same 3 x K
  calls made bare through the same channel and the same slots (10 notifications in flight, the
  replay permits for ProxyRegister; per session DISCONNECTED, ProxyRegister, CONNECTED in
  order, as a recovery makes them): `bare_calls_ms`. Target: every owner recovered, no
  reconnects, recovery within 1.3 x the bare calls.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from actors.agent_messages import StreamHandle
from actors.core.notify_store import MAX_INFLIGHT
from actors.owner_table import OWNERS_TABLE, OwnerRow
from actors.router import ROUTER_NAME
from actors.router_messages import RouteCommand
from gateway.upstream.channel_actor import upstream_channel
from gateway.upstream.methods import NOTIFY_STREAM_STATUS, PROXY_REGISTER, SESSION_ID_METADATA
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2
from supervisors.gc_policy import NODE_GC_THRESHOLD
from supervisors.runtime import LoopSystemBase
from tests.bench.common import (
    Row,
    add_common_arguments,
    environment,
    process_cpu_s,
    report,
    run_on_uvloop,
)
from tests.bench.permits import fake_server
from tests.bench.replay import (
    HOLD_BATCH,
    REPLAY_PERMITS,
    gateway,
    hold,
    upstream_status,
    wait_for,
)

NAME = "owner_kill"

DEFAULT_AGENTS = 5000
DEFAULT_KILLED = 500
TARGET_RATIO = 1.3
RPC_TIMEOUT_S = 5.0
_CONNECTED = gateway_pb2.StreamStatusNotification.CONNECTED
_DISCONNECTED = gateway_pb2.StreamStatusNotification.DISCONNECTED
COMMAND_ID = "bench-after-kill"


class Sink:
    """The router's sink of the command sent after the kills (answers are not awaited)."""

    def put(self, response: Any, kind: str, final: bool) -> None:
        pass

    def finish(self, outcome: str) -> None:
        pass


class ConnectedProbe:
    """Wraps the channel's `unary`: when each watched session's CONNECTED was answered."""

    def __init__(self, watched: set[str]) -> None:
        self.watched = watched
        self.answered: dict[str, float] = {}

    def wrap(self, unary: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
        async def measured(method: str, *args: Any, **kwargs: Any) -> Any:
            result = await unary(method, *args, **kwargs)
            if method == NOTIFY_STREAM_STATUS:
                request = args[0]
                if request.event == _CONNECTED and request.session_id in self.watched:
                    self.answered.setdefault(request.session_id, time.perf_counter())
            return result

        return measured


def rows(runtime: LoopSystemBase) -> dict[str, OwnerRow]:
    table = runtime.table(OWNERS_TABLE)
    assert table is not None
    return {k: v for k, v in table.items() if isinstance(v, OwnerRow)}


def handle_of(row: OwnerRow) -> StreamHandle:
    assert row.args is not None
    return row.args.stream


def took_command(handle: StreamHandle, got: set[int]) -> None:
    """Drain what the owner wrote to one agent's stream; note the bench command."""
    while (item := handle.take_nowait()) is not None:
        if isinstance(item, agent_pb2.CommandRequest) and item.command_id == COMMAND_ID:
            got.add(id(handle))


async def bare_calls(runtime: LoopSystemBase, killed: list[OwnerRow]) -> float:
    """The recovery's 3 x K calls without the gateway around them; seconds."""
    channel = upstream_channel(runtime)
    assert channel is not None
    notify_slots = asyncio.Semaphore(MAX_INFLIGHT)
    register_slots = asyncio.Semaphore(REPLAY_PERMITS)

    def note(row: OwnerRow, event: int) -> gateway_pb2.StreamStatusNotification:
        return gateway_pb2.StreamStatusNotification(
            agent_id=row.agent_id,
            session_id=row.session_id,
            event=event,  # type: ignore[arg-type]
            stream_home_id=row.stream_home_id,
            gateway_node="bench",
        )

    async def notify(row: OwnerRow, event: int) -> None:
        async with notify_slots:
            await channel.unary(
                NOTIFY_STREAM_STATUS,
                note(row, event),
                gateway_pb2.StreamStatusAck,
                timeout=RPC_TIMEOUT_S,
                metadata=None,
            )

    async def one(row: OwnerRow) -> None:
        await notify(row, _DISCONNECTED)
        async with register_slots:
            await channel.unary(
                PROXY_REGISTER,
                row.register,
                agent_pb2.RegisterResponse,
                timeout=RPC_TIMEOUT_S,
                metadata={SESSION_ID_METADATA: row.session_id},
            )
        await notify(row, _CONNECTED)

    start = time.perf_counter()
    await asyncio.gather(*(one(row) for row in killed))
    return time.perf_counter() - start


async def run_benchmark(
    agents: int = DEFAULT_AGENTS,
    killed_n: int = DEFAULT_KILLED,
    latency_ms: float = 0.0,
    *,
    quiet: bool = False,
) -> dict[str, Any]:
    def progress(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="yuzu-bench-owner-kill-") as tmp:
        async with fake_server(latency_ms) as (port, server_pid), gateway(Path(tmp), port) as node:
            runtime = node.runtime
            assert runtime is not None
            progress(f"holding {agents} sessions")
            for start in range(0, agents, HOLD_BATCH):
                batch = range(start, min(start + HOLD_BATCH, agents))
                await asyncio.gather(*(hold(runtime, i) for i in batch))
            await wait_for(lambda: len(rows(runtime)) == agents, 60.0, "every owner's row")
            await wait_for(
                lambda: (
                    upstream_status(runtime)["notify_pending"] == 0
                    and upstream_status(runtime)["notify_inflight"] == 0
                ),
                60.0,
                "the first CONNECTED notices",
            )
            held = rows(runtime)
            step = max(1, agents // killed_n)
            victims = sorted(held.values(), key=lambda r: r.session_id)[::step][:killed_n]
            watched = {r.session_id for r in victims}
            handles = {r.session_id: handle_of(r) for r in held.values()}
            channel = upstream_channel(runtime)
            assert channel is not None
            probe = ConnectedProbe(watched)
            unary = channel.unary
            channel.unary = probe.wrap(unary)  # type: ignore[method-assign]
            router = runtime.whereis(ROUTER_NAME)
            assert router is not None
            gc.collect()
            progress(f"killing {len(victims)} owners at once")
            started = time.perf_counter()
            cpu, server_cpu = time.process_time(), process_cpu_s(server_pid)
            for row in victims:
                runtime.kill(row.owner)

            table = runtime.table(OWNERS_TABLE)
            assert table is not None
            waiting = list(victims)

            def recovered() -> bool:
                # Only the sessions not seen live again yet: the poll must not load the loop
                # it measures.
                while waiting:
                    row = table.get(waiting[-1].session_id)
                    if row is None or row.owner == waiting[-1].owner or row.state != "live":
                        return False
                    waiting.pop()
                return True

            limit = 60.0 + killed_n * 0.1
            await wait_for(recovered, limit, "every killed owner's session to be live again")
            command = agent_pb2.CommandRequest(command_id=COMMAND_ID, plugin="os", action="x")
            agent_ids = tuple(r.agent_id for r in victims)
            runtime.tell(router, RouteCommand(command, agent_ids, 60, Sink()))
            got: set[int] = set()

            def commands_reached() -> bool:
                for session_id in watched:
                    took_command(handles[session_id], got)
                return len(got) == len(watched)

            await wait_for(commands_reached, limit, "the command to reach every agent")
            reached_at = time.perf_counter()
            await wait_for(lambda: len(probe.answered) == len(watched), limit, "CONNECTED")
            recovery_s = max(reached_at, *probe.answered.values()) - started
            cpu = time.process_time() - cpu
            server_cpu = process_cpu_s(server_pid) - server_cpu
            channel.unary = unary  # type: ignore[method-assign]
            ended = sum(1 for h in handles.values() if h.ended)
            restarts = node.ctx.registry.get_sample_value(
                "yuzu_gw_agent_owner_restarts_total", {"outcome": "recovered"}
            )
            progress(f"{len(victims) * 3} bare calls through the same channel and slots")
            gc.collect()
            bare_cpu, bare_server_cpu = time.process_time(), process_cpu_s(server_pid)
            bare_s = await bare_calls(runtime, victims)
            bare_cpu = time.process_time() - bare_cpu
            bare_server_cpu = process_cpu_s(server_pid) - bare_server_cpu
    result: dict[str, Any] = {
        "benchmark": NAME,
        "agents": agents,
        "killed": len(victims),
        "recovered": int(restarts or 0),
        "recovery_ms": round(recovery_s * 1000, 1),
        "bare_calls": len(victims) * 3,
        "bare_calls_ms": round(bare_s * 1000, 1),
        "recovery_ratio_vs_bare": round(recovery_s / bare_s, 3),
        "reconnects": ended,
        # CPU of each process over the recovery (to the last CONNECTED answered, polling
        # included) and over the bare calls: on a shared host these move less than elapsed.
        "gateway_cpu_s": round(cpu, 3),
        "bare_gateway_cpu_s": round(bare_cpu, 3),
        "server_cpu_s": round(server_cpu, 3),
        "bare_server_cpu_s": round(bare_server_cpu, 3),
        "load_average_1m": os.getloadavg()[0],
        "latency_ms": latency_ms,
        "targets_met": {
            "all_recovered": int(restarts or 0) == len(victims),
            "no_reconnects": ended == 0,
            "within_1_3x_bare": recovery_s <= TARGET_RATIO * bare_s,
        },
        "environment": environment(),
        "loop": type(asyncio.get_running_loop()).__module__,
    }
    return result


def table_rows(result: dict[str, Any]) -> list[Row]:
    met = result["targets_met"]
    return [
        Row("held sessions", str(result["agents"])),
        Row("owners killed at once", str(result["killed"])),
        Row("recovered", str(result["recovered"]), str(result["killed"]), met["all_recovered"]),
        Row("agents reconnecting", str(result["reconnects"]), "0", met["no_reconnects"]),
        Row("kill to all CONNECTED and a command reached", f"{result['recovery_ms']:.1f} ms"),
        Row(f"the same {result['bare_calls']} calls bare", f"{result['bare_calls_ms']:.1f} ms"),
        Row(
            "recovery / bare",
            f"{result['recovery_ratio_vs_bare']:.3f}",
            f"<= {TARGET_RATIO}",
            met["within_1_3x_bare"],
        ),
        Row(
            "gateway CPU, recovery / bare",
            f"{result['gateway_cpu_s']:.2f} / {result['bare_gateway_cpu_s']:.2f} s",
        ),
        Row(
            "fake server CPU, recovery / bare",
            f"{result['server_cpu_s']:.2f} / {result['bare_server_cpu_s']:.2f} s",
        ),
        Row("host load average (1 min)", f"{result['load_average_1m']:.2f}"),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.owner_kill",
        description="Kill K of N agent owners at once; time until every one is CONNECTED again "
        "and a command reaches it, against the same calls made bare.",
    )
    parser.add_argument("--agents", type=int, default=DEFAULT_AGENTS, help="default 5000")
    parser.add_argument("--kill", type=int, default=DEFAULT_KILLED, help="default 500")
    parser.add_argument(
        "--latency-ms", type=float, default=0.0, help="the fake's ProxyRegister latency (0)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_common_arguments(parser, NAME)
    args = parser.parse_args(argv)
    previous = gc.get_threshold()
    gc.set_threshold(*NODE_GC_THRESHOLD)
    try:
        result = run_on_uvloop(
            run_benchmark(args.agents, args.kill, args.latency_ms, quiet=args.quiet)
        )
    finally:
        gc.set_threshold(*previous)
    report(result, table_rows(result), args.out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
