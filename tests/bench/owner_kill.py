"""Benchmark of owner-crash recovery: `python -m tests.bench.owner_kill [--agents N] [--kill K]
[--repeat R] [--json]`.

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
- One round: from the kills to the moment every killed session's CONNECTED has been answered by
  the server and a command sent through the router (`RouteCommand` to the K agent ids) has
  reached every one of their streams (the recovery). Right after it, on the same node, the same
  3 x K calls made bare through the same channel and the same slots (10 notifications in
  flight, the replay permits for ProxyRegister; per session DISCONNECTED, ProxyRegister,
  CONNECTED in order, as a recovery makes them): the bare calls. One kill on a shared host is
  one noisy sample, so R rounds (default 5) run one after the other, recovery then bare, each
  pair seeing the same host.
- Each round kills K owners never killed before (every `N // K`-th session from offset r, so
  R x K must not exceed N): every round starts from the same state (first owners, `live` rows,
  no restart history), where killing the recovered owners again would measure restarts of
  restarts and, at the 4th round, hit the one-owner crash-loop limit (3 restarts in 60 s). A
  round starts only once the notices are drained and agent_sup's restart window has room for K
  more restarts (2000 in 10 s by default): R x K kills in a few seconds would otherwise be the
  fleet-wide crash the intensity escalates.
- Reported: the median over the rounds of the recovery (`recovery_ms`) and of the bare calls
  (`bare_calls_ms`), and the median of the per-round ratios (`recovery_ratio_vs_bare`, with its
  min and max): a ratio pairs a recovery with the bare calls made right after it, so a load
  spike that slows both cancels within the pair, where a ratio of medians could divide a quiet
  round's recovery by a loaded round's bare calls. So `recovery_ratio_vs_bare` need not equal
  `recovery_ms / bare_calls_ms`. `recovered` is the fewest recovered in any round (it equals
  `killed` only when every owner of every round recovered); `reconnects` is summed over the
  rounds. Each round's figures are under `rounds`.

Targets: every owner recovered, no reconnects, recovery within 1.3 x the bare calls (median).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from actors.agents.api import AGENT_SUP_NAME, OWNERS_TABLE, OwnerRow, StreamHandle
from actors.core.notify_store import MAX_INFLIGHT
from actors.router.api import ROUTER_NAME, RouteCommand
from actors.upstream.api import (
    NOTIFY_STREAM_STATUS,
    PROXY_REGISTER,
    SESSION_ID_METADATA,
    upstream_channel,
)
from gateway.node.node import Node
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2
from supervisors.gc_policy import NODE_GC_THRESHOLD
from supervisors.runtime import LoopSystemBase
from supervisors.supervisor import Supervisor
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
    notices_drained,
)
from tests.bench.replay import wait_for as replay_wait_for

NAME = "owner_kill"

DEFAULT_AGENTS = 5000
DEFAULT_KILLED = 500
DEFAULT_REPEAT = 5
TARGET_RATIO = 1.3
RPC_TIMEOUT_S = 5.0
_CONNECTED = gateway_pb2.StreamStatusNotification.CONNECTED
_DISCONNECTED = gateway_pb2.StreamStatusNotification.DISCONNECTED
COMMAND_ID = "bench-after-kill"
# How often the end of a recovery is looked for. It is seen by two polls in a row (every
# session live again, then the command on every stream), so at the replay benchmark's 20 ms a
# recovery of about a second could read up to 40 ms long; a poll costs the loop next to
# nothing (it looks only at what it has not seen yet).
POLL_S = 0.005


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


async def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """tests/bench/replay.py's wait, polling every POLL_S."""
    await replay_wait_for(predicate, timeout, what, POLL_S)


def rows(runtime: LoopSystemBase) -> dict[str, OwnerRow]:
    table = runtime.table(OWNERS_TABLE)
    assert table is not None
    return {k: v for k, v in table.items() if isinstance(v, OwnerRow)}


def handle_of(row: OwnerRow) -> StreamHandle:
    assert row.args is not None
    return row.args.stream


def took_command(handle: StreamHandle, command_id: str, got: set[int]) -> None:
    """Drain what the owner wrote to one agent's stream; note the round's bench command."""
    while (item := handle.take_nowait()) is not None:
        if isinstance(item, agent_pb2.CommandRequest) and item.command_id == command_id:
            got.add(id(handle))


def sizes_error(agents: int, killed_n: int, repeat: int) -> str | None:
    """Why these sizes cannot run, or None: every round kills owners not killed before."""
    if not 0 < killed_n <= agents or repeat < 1:
        return "need 0 < kill <= agents and repeat >= 1"
    if repeat * killed_n > agents:
        return f"{repeat} rounds of {killed_n} fresh owners need {repeat * killed_n} agents"
    return None


def victims_of(session_ids: Sequence[str], killed_n: int, round_n: int) -> list[str]:
    """Round `round_n`'s sessions: every `len // killed_n`-th from offset `round_n`, so rounds
    below that stride never share one."""
    step = len(session_ids) // killed_n
    return list(session_ids[round_n::step][:killed_n])


def agent_sup_of(runtime: LoopSystemBase) -> Supervisor:
    address = runtime.whereis(AGENT_SUP_NAME)
    ref = None if address is None else runtime.ref(address)
    assert ref is not None and isinstance(ref.instance, Supervisor)
    return ref.instance


async def drained(runtime: LoopSystemBase) -> None:
    """No notification held or in flight: the previous round's traffic is over."""
    await notices_drained(runtime, "the notices to drain", POLL_S)


async def room_for_restarts(runtime: LoopSystemBase, killed_n: int) -> None:
    """Wait until agent_sup's shared restart intensity can take `killed_n` more restarts."""
    sup = agent_sup_of(runtime)
    intensity = sup.flags.intensity
    if killed_n > intensity:
        raise ValueError(f"killing {killed_n} owners at once exceeds agent_sup's intensity")
    await wait_for(
        lambda: sup.intensity.in_window(sup.now()) + killed_n <= intensity,
        sup.flags.period + 10.0,
        "room in agent_sup's restart window",
    )


def restarts_recovered(node: Node) -> int:
    value = node.ctx.registry.get_sample_value(
        "yuzu_gw_agent_owner_restarts_total", {"outcome": "recovered"}
    )
    return int(value or 0)


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


async def kill_round(
    node: Node,
    server_pid: int,
    victim_ids: list[str],
    handles: dict[str, StreamHandle],
    round_n: int,
) -> dict[str, Any]:
    """Kill the victims' owners at once, wait for their recovery, then make the same calls
    bare; the round's figures."""
    runtime = node.runtime
    assert runtime is not None
    held = rows(runtime)
    victims = [held[session_id] for session_id in victim_ids]
    watched = set(victim_ids)
    channel = upstream_channel(runtime)
    assert channel is not None
    probe = ConnectedProbe(watched)
    unary = channel.unary
    channel.unary = probe.wrap(unary)  # type: ignore[method-assign]
    router = runtime.whereis(ROUTER_NAME)
    assert router is not None
    table = runtime.table(OWNERS_TABLE)
    assert table is not None
    recovered_before = restarts_recovered(node)
    ended_before = sum(1 for h in handles.values() if h.ended)
    command_id = f"{COMMAND_ID}-{round_n}"
    gc.collect()
    started = time.perf_counter()
    cpu, server_cpu = time.process_time(), process_cpu_s(server_pid)
    for row in victims:
        runtime.kill(row.owner)
    waiting = list(victims)

    def recovered() -> bool:
        # Only the sessions not seen live again yet: the poll must not load the loop it
        # measures.
        while waiting:
            row = table.get(waiting[-1].session_id)
            if row is None or row.owner == waiting[-1].owner or row.state != "live":
                return False
            waiting.pop()
        return True

    limit = 60.0 + len(victims) * 0.1
    await wait_for(recovered, limit, "every killed owner's session to be live again")
    command = agent_pb2.CommandRequest(command_id=command_id, plugin="os", action="x")
    agent_ids = tuple(r.agent_id for r in victims)
    runtime.tell(router, RouteCommand(command, agent_ids, 60, Sink()))
    got: set[int] = set()

    unreached = list(victim_ids)

    def commands_reached() -> bool:
        while unreached:
            took_command(handles[unreached[-1]], command_id, got)
            if id(handles[unreached[-1]]) not in got:
                return False
            unreached.pop()
        return True

    await wait_for(commands_reached, limit, "the command to reach every agent")
    reached_at = time.perf_counter()
    await wait_for(lambda: len(probe.answered) == len(watched), limit, "CONNECTED")
    connected_at = max(probe.answered.values())
    recovery_s = max(reached_at, connected_at) - started
    cpu = time.process_time() - cpu
    server_cpu = process_cpu_s(server_pid) - server_cpu
    channel.unary = unary  # type: ignore[method-assign]
    ended = sum(1 for h in handles.values() if h.ended) - ended_before
    recovered_n = restarts_recovered(node) - recovered_before
    # Interleaved: the bare calls right after the recovery see the same host.
    gc.collect()
    bare_cpu, bare_server_cpu = time.process_time(), process_cpu_s(server_pid)
    bare_s = await bare_calls(runtime, victims)
    bare_cpu = time.process_time() - bare_cpu
    bare_server_cpu = process_cpu_s(server_pid) - bare_server_cpu
    return {
        "recovered": recovered_n,
        "reconnects": ended,
        "recovery_ms": round(recovery_s * 1000, 1),
        # Which came last: the last CONNECTED answered, or the command seen on every stream.
        "last_connected_ms": round((connected_at - started) * 1000, 1),
        "commands_reached_ms": round((reached_at - started) * 1000, 1),
        "bare_calls_ms": round(bare_s * 1000, 1),
        "recovery_ratio_vs_bare": round(recovery_s / bare_s, 3),
        # CPU of each process over the recovery (to the last CONNECTED answered, polling
        # included) and over the bare calls: on a shared host these move less than elapsed.
        "gateway_cpu_s": round(cpu, 3),
        "bare_gateway_cpu_s": round(bare_cpu, 3),
        "server_cpu_s": round(server_cpu, 3),
        "bare_server_cpu_s": round(bare_server_cpu, 3),
        # What the gateway spends on a recovery beyond the bare calls, per killed owner: the
        # figure to compare between code versions on a shared host.
        "extra_gateway_cpu_us_per_owner": round((cpu - bare_cpu) / len(victims) * 1e6, 1),
        "load_average_1m": os.getloadavg()[0],
    }


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def summarise(runs: list[dict[str, Any]], *, agents: int, killed_n: int) -> dict[str, Any]:
    """The result from the rounds' figures (the module doc says what each key means)."""
    ratios = [r["recovery_ratio_vs_bare"] for r in runs]
    ratio = statistics.median(ratios)
    recovered = min(r["recovered"] for r in runs)
    reconnects = sum(r["reconnects"] for r in runs)
    return {
        "agents": agents,
        "killed": killed_n,
        "repeat": len(runs),
        "recovered": recovered,
        "killed_total": killed_n * len(runs),
        "recovered_total": sum(r["recovered"] for r in runs),
        "recovery_ms": round(_median(runs, "recovery_ms"), 1),
        "bare_calls": killed_n * 3,
        "bare_calls_ms": round(_median(runs, "bare_calls_ms"), 1),
        "recovery_ratio_vs_bare": round(ratio, 3),
        "recovery_ratio_min": min(ratios),
        "recovery_ratio_max": max(ratios),
        "reconnects": reconnects,
        **{
            key: round(_median(runs, key), 3)
            for key in ("gateway_cpu_s", "bare_gateway_cpu_s", "server_cpu_s", "bare_server_cpu_s")
        },
        "extra_gateway_cpu_us_per_owner": round(_median(runs, "extra_gateway_cpu_us_per_owner"), 1),
        "load_average_1m": os.getloadavg()[0],
        "rounds": runs,
        "targets_met": {
            "all_recovered": recovered == killed_n,
            "no_reconnects": reconnects == 0,
            "within_1_3x_bare": ratio <= TARGET_RATIO,
        },
    }


async def run_benchmark(
    agents: int = DEFAULT_AGENTS,
    killed_n: int = DEFAULT_KILLED,
    latency_ms: float = 0.0,
    repeat: int = DEFAULT_REPEAT,
    *,
    quiet: bool = False,
) -> dict[str, Any]:
    def progress(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)

    error = sizes_error(agents, killed_n, repeat)
    if error is not None:
        raise ValueError(error)
    with tempfile.TemporaryDirectory(prefix="yuzu-bench-owner-kill-") as tmp:
        async with fake_server(latency_ms) as (port, server_pid), gateway(Path(tmp), port) as node:
            runtime = node.runtime
            assert runtime is not None
            progress(f"holding {agents} sessions")
            for start in range(0, agents, HOLD_BATCH):
                batch = range(start, min(start + HOLD_BATCH, agents))
                await asyncio.gather(*(hold(runtime, i) for i in batch))
            await wait_for(lambda: len(rows(runtime)) == agents, 60.0, "every owner's row")
            held = rows(runtime)
            session_ids = sorted(held)
            handles = {session_id: handle_of(row) for session_id, row in held.items()}
            runs = []
            for n in range(repeat):
                await drained(runtime)
                await room_for_restarts(runtime, killed_n)
                victim_ids = victims_of(session_ids, killed_n, n)
                progress(f"round {n + 1}/{repeat}: killing {len(victim_ids)} owners at once")
                run = await kill_round(node, server_pid, victim_ids, handles, n)
                runs.append(run)
                progress(f"round {n + 1}/{repeat}: {run}")
    return {
        "benchmark": NAME,
        **summarise(runs, agents=agents, killed_n=killed_n),
        "latency_ms": latency_ms,
        "environment": environment(),
        "loop": type(asyncio.get_running_loop()).__module__,
    }


def table_rows(result: dict[str, Any]) -> list[Row]:
    met = result["targets_met"]
    repeat = result["repeat"]
    return [
        Row("held sessions", str(result["agents"])),
        Row("owners killed at once, rounds", f"{result['killed']}, {repeat}"),
        Row(
            "recovered (fewest in a round)",
            str(result["recovered"]),
            str(result["killed"]),
            met["all_recovered"],
        ),
        Row(
            "agents reconnecting (all rounds)",
            str(result["reconnects"]),
            "0",
            met["no_reconnects"],
        ),
        Row(
            f"kill to all CONNECTED and a command reached (median of {repeat})",
            f"{result['recovery_ms']:.1f} ms",
        ),
        Row(
            f"the same {result['bare_calls']} calls bare (median)",
            f"{result['bare_calls_ms']:.1f} ms",
        ),
        Row(
            "recovery / bare (median of the rounds' ratios)",
            f"{result['recovery_ratio_vs_bare']:.3f}",
            f"<= {TARGET_RATIO}",
            met["within_1_3x_bare"],
        ),
        Row(
            "recovery / bare min / max",
            f"{result['recovery_ratio_min']:.3f} / {result['recovery_ratio_max']:.3f}",
        ),
        Row(
            "gateway CPU, recovery / bare (median)",
            f"{result['gateway_cpu_s']:.2f} / {result['bare_gateway_cpu_s']:.2f} s",
        ),
        Row(
            "gateway CPU above the bare calls, per owner (median)",
            f"{result['extra_gateway_cpu_us_per_owner']:.0f} us",
        ),
        Row(
            "fake server CPU, recovery / bare (median)",
            f"{result['server_cpu_s']:.2f} / {result['bare_server_cpu_s']:.2f} s",
        ),
        Row("host load average (1 min)", f"{result['load_average_1m']:.2f}"),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.owner_kill",
        description="Kill K of N agent owners at once, R times; time until every one is "
        "CONNECTED again and a command reaches it, against the same calls made bare.",
    )
    parser.add_argument("--agents", type=int, default=DEFAULT_AGENTS, help="default 5000")
    parser.add_argument("--kill", type=int, default=DEFAULT_KILLED, help="default 500")
    parser.add_argument(
        "--repeat",
        type=int,
        default=DEFAULT_REPEAT,
        help="rounds, each on owners not killed before (default 5; repeat x kill <= agents)",
    )
    parser.add_argument(
        "--latency-ms", type=float, default=0.0, help="the fake's ProxyRegister latency (0)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_common_arguments(parser, NAME)
    args = parser.parse_args(argv)
    error = sizes_error(args.agents, args.kill, args.repeat)
    if error is not None:
        parser.error(error)
    previous = gc.get_threshold()
    gc.set_threshold(*NODE_GC_THRESHOLD)
    try:
        result = run_on_uvloop(
            run_benchmark(args.agents, args.kill, args.latency_ms, args.repeat, quiet=args.quiet)
        )
    finally:
        gc.set_threshold(*previous)
    report(result, table_rows(result), args.out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
