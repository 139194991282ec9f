"""One soak run: boot the stack, let the fleet join, play the schedule, wait out its quiet tail,
let the fleet settle, check the invariants, stop the node(s) as systemd would (SIGTERM) and check
again.

The result is a JSON-able dict: the seed, the sizes, what ran (faults and commands), the figures
and `invariants`, every count of tests/soak/invariants.py (each must be 0), with `passed`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.devstack.fake_upstream import SESSION_METADATA_KEY as SESSION_KEY
from tests.bench.common import environment
from tests.soak import invariants as inv
from tests.soak import schedule as sched
from tests.soak.faults import PARAM_CANARY, Faults
from tests.soak.stack import EVENT, NOTIFY, Stack

# How long the fleet may take to join (10,000 agents took 88 s on a loaded host), and to settle
# after the quiet tail: the stock backoff's longest step, 256 s, and a little.
JOIN_S = 300.0
SETTLE_S = 300.0
POLL_S = 2.0
# The node's count of held notices replaced by a newer one of the same session.
COALESCED = "yuzu_gw_upstream_notify_coalesced_total"
OWNER_RESTARTS = "yuzu_gw_agent_owner_restarts_total"
REGISTER = "ProxyRegister"
# A SendCommand racing a router kill may be answered UNAVAILABLE this long after it.
ROUTER_RESTART_S = 5.0

HEAP_TYPES = 30
HEAP = """
import collections, gc
_heap = collections.Counter(type(o).__name__ for o in gc.get_objects()).most_common()
"""

SNAPSHOT = """
from actors.agents.api import OWNERS_TABLE
from actors.registry.api import AGENTS_TABLE, CONNECTIONS_TABLE, PENDING_TABLE, SESSIONS_INDEX
from supervisors import introspection

def _rows(name):
    table = runtime.table(name)
    return {} if table is None else dict(table.items())

_usage = list(_rows(CONNECTIONS_TABLE).values())
_snapshot = {
    "indexed": sorted(set(_rows(AGENTS_TABLE)) | set(_rows(SESSIONS_INDEX))),
    "owner_rows": {str(r.owner): r.session_id for r in _rows(OWNERS_TABLE).values()},
    "owner_actors": [
        str(a.address) for a in introspection.actors(runtime) if a.cls == "AgentOwner"
    ],
    "registry": {
        "pending": len(_rows(PENDING_TABLE)),
        "reservations": sum(u.reservations for u in _usage),
        "connection_pending": sum(u.pending for u in _usage),
        "subscribing": sum(u.subscribing for u in _usage),
    },
}
"""


async def _until(predicate: Callable[[], Any], timeout: float) -> bool:
    """Poll the async `predicate` until it is true or `timeout` passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


def _history(stack: Stack, abandoned: frozenset[str]) -> tuple[dict[str, list[str]], int]:
    """The notices per session, without those a killed node left CONNECTED (no DISCONNECTED
    can come for them: `peer_kill_counts` holds them instead)."""
    history, repeats = inv.notice_history(stack.notices())
    return {s: e for s, e in history.items() if s not in abandoned}, repeats


async def _settled(
    stack: Stack, abandoned: frozenset[str]
) -> tuple[bool, dict[str, dict[str, Any]]]:
    """Wait until every agent is subscribed and the notices agree with what the agents hold."""
    last: dict[str, dict[str, Any]] = {}

    async def quiet() -> bool:
        nonlocal last
        last = await stack.reports()
        held = inv.current_sessions(last)
        if len(held) < stack.agents:
            return False
        counts = inv.notice_counts(_history(stack, abandoned)[0], held.values())
        # A session's first notice is final: waiting cannot change that count.
        counts.pop("notice_starts_disconnected")
        return not any(counts.values())

    ok = await _until(quiet, SETTLE_S)
    return ok, last


async def _heap(stack: Stack) -> dict[str, Any]:
    """The first node's objects the collector tracks: how many, and the most common types."""
    census = await stack.node.eval_json("_heap", HEAP)
    return {"objects": sum(n for _, n in census), "top": census[:HEAP_TYPES]}


async def _snapshot(stack: Stack) -> dict[str, Any]:
    """Every node's tables, merged: owner addresses named by node (they repeat across nodes),
    the registry's counts summed."""
    merged: dict[str, Any] = {
        "indexed": [],
        "owner_rows": {},
        "owner_actors": [],
        "registry": dict.fromkeys(
            ("pending", "reservations", "connection_pending", "subscribing"), 0
        ),
    }
    for node in stack.nodes:
        one = await node.eval_json("_snapshot", SNAPSHOT)
        merged["indexed"] += one["indexed"]
        merged["owner_rows"].update({f"{node.name}/{a}": s for a, s in one["owner_rows"].items()})
        merged["owner_actors"] += [f"{node.name}/{a}" for a in one["owner_actors"]]
        for key, count in one["registry"].items():
            merged["registry"][key] += count
    return merged


async def run_soak(
    agents: int,
    minutes: float,
    seed: int,
    *,
    nodes: int = 1,
    quiet: bool = False,
    keep: Path | None = None,
) -> dict[str, Any]:
    """One run; with `keep`, the nodes' logs, the notices, the snapshot, /metrics and the
    result are written to that directory (whatever the outcome)."""

    def progress(text: str) -> None:
        if not quiet:
            print(f"soak: {text}", file=sys.stderr, flush=True)

    plan = sched.build(seed, minutes * 60.0, agents, nodes)
    progress(f"seed {seed}: {len(plan.faults)} faults, {len(plan.commands)} commands")
    kept = Kept(keep)
    with tempfile.TemporaryDirectory(prefix="yuzu-soak-") as tmp:
        stack = Stack(Path(tmp), agents, seed, nodes)
        try:
            async with stack:
                result = await _run(stack, plan, kept, progress)
        finally:
            kept.stack(stack)
    kept.json("result.json", result)
    return result


async def _run(
    stack: Stack, plan: sched.Schedule, kept: Kept, progress: Callable[[str], None]
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    load_before = os.getloadavg()
    began = loop.time()
    joined = await _until(lambda: _all_subscribed(stack), JOIN_S)
    join_s = loop.time() - began
    progress(f"fleet joined: {joined} in {join_s:.1f} s")
    faults = Faults(stack, plan.seed)
    rss: list[int] = []
    heap: list[dict[str, Any]] = []
    tasks: list[asyncio.Task[None]] = []
    previous: asyncio.Task[None] | None = None
    # One fault at a time: a fault still running when the next is due (an upstream kill waiting
    # for the notifications to drain) shifts every later event by its overrun and the gap; the
    # events shifted past the quiet tail are not played.
    offset = 0.0
    skipped = cycles = 0
    start = loop.time()
    try:
        for event in plan.events:
            if event.at_s + offset > plan.duration_s - sched.TAIL_S:
                skipped += 1
                continue
            await asyncio.sleep(max(0.0, start + event.at_s + offset - loop.time()))
            _raise_failed(tasks)  # a fault that could not be carried out ends the run now
            if event.kind in (sched.COMMAND, sched.BROADCAST):
                tasks.append(loop.create_task(faults.command(event)))
                continue
            if previous is not None and not previous.done():
                waited = loop.time()
                await asyncio.wait([previous])
                await asyncio.sleep(sched.FAULT_GAP_S)
                offset += loop.time() - waited
            if event.cycle == 1 and not rss:
                rss.append(stack.node.rss())  # after the first cycle
                heap.append(await _heap(stack))
            cycles = max(cycles, event.cycle + 1)
            progress(f"t={event.at_s + offset:.0f}s {event.kind}")
            previous = loop.create_task(faults.fault(event))
            tasks.append(previous)
        await asyncio.gather(*tasks)
        # The quiet tail: the notices held through the last fault go out before the checks,
        # and the planned stop does not land in a recovery wave.
        await asyncio.sleep(max(0.0, start + plan.duration_s - loop.time()))
        abandoned = frozenset().union(*(k.left_connected for k in faults.peer_kills))
        settled, reports = await _settled(stack, abandoned)
        progress(f"settled: {settled}")
        kept.json("reports.json", reports)
        rss.append(stack.node.rss())
        heap.append(await _heap(stack))
        snapshot = await _snapshot(stack)
        exposition = "".join([await node.metrics() for node in stack.nodes])
    finally:
        for task in tasks:
            task.cancel()  # after a failed event: the others go with the stack
        await faults.close()
    kept.json("snapshot.json", snapshot)
    kept.text("metrics.txt", exposition)
    held = inv.current_sessions(reports)
    history, repeats = _history(stack, abandoned)
    coalesced = int(inv.metric_sum(exposition, COALESCED))
    counts: dict[str, int] = {
        "agents_not_subscribed": stack.agents - len(held),
        **inv.notice_counts(history, held.values(), coalesced),
        **inv.registry_counts(snapshot["indexed"], reports),
        **inv.owner_counts(snapshot["owner_actors"], snapshot["owner_rows"], held.values()),
        **inv.command_counts(faults.commands, faults.router_kills(), ROUTER_RESTART_S),
        **inv.gauge_counts(exposition, snapshot["registry"]),
        **inv.rss_counts(rss[0], rss[-1]),
        **faults.shedder_misses(),
    }
    if len(stack.nodes) > 1:
        counts.update(inv.peer_kill_counts(faults.peer_kills, reports))
    progress("planned stop")
    calls_before_stop = len(stack.fake.calls(NOTIFY))
    stopping = loop.time()
    exits = await stack.planned_stop()
    stop_s = loop.time() - stopping
    before = history
    history, repeats_after = _history(stack, abandoned)
    counts.update(inv.notice_counts_after_stop(history, before))
    counts["node_exit_status"] = next((status for status in exits if status), 0)
    counts.update(inv.canary_counts(stack.log_text(), (stack.token, PARAM_CANARY)))
    return {
        "benchmark": "soak",
        "seed": plan.seed,
        "agents": stack.agents,
        "nodes": len(stack.nodes),
        "minutes": plan.duration_s / 60.0,
        "join_s": round(join_s, 1),
        "faults": [
            {"kind": f.kind, "at_s": f.at_s, "took_s": round(f.done - f.started, 3), **f.detail}
            for f in faults.faults
        ],
        "events_not_played": skipped,
        "commands": len(faults.commands),
        "command_terminals": sum(sum(c.terminals.values()) for c in faults.commands),
        "sessions_seen": len(history) + len(abandoned),
        "reconnects": sum(len(r["sessions"]) - 1 for r in reports.values() if r["sessions"]),
        "notice_repeats": repeats_after,
        "notice_repeats_before_stop": repeats,
        "notices_coalesced_before_stop": coalesced,
        # What the killed owners came to (seed: "When an agent's owner process crashes").
        "owner_restarts": {
            outcome: int(inv.metric_sum(exposition, f'{OWNER_RESTARTS}{{outcome="{outcome}"}}'))
            for outcome in ("recovered", "disconnected_only", "gave_up")
        },
        "stop": _stop_figures(stack, calls_before_stop, stop_s),
        "rss_bytes": {"first_cycle": rss[0], "last": rss[-1]},
        # What the collector tracks, by type, where RSS was read: what a growth is made of.
        "heap": {"first_cycle": heap[0], "last": heap[-1]},
        # False: the run was too short for a second cycle, so RSS was not compared.
        "rss_compared": len(rss) > 1,
        "cycles": cycles,  # begun
        "invariants": counts,
        "passed": not any(counts.values()),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "environment": environment(),
    }


def _stop_figures(stack: Stack, calls_before: int, stop_s: float) -> dict[str, Any]:
    """The planned stop: how long SIGTERM took to end the node(s), and the DISCONNECTED
    notices the server acknowledged meanwhile, the last one how long after the first."""
    during = [
        c
        for c in stack.fake.calls(NOTIFY)[calls_before:]
        if c.code is not None and c.code.name == "OK" and c.request.event == EVENT.DISCONNECTED
    ]
    times = [c.answered_at or c.received_at for c in during]
    return {
        "exit_s": round(stop_s, 2),
        "disconnected_acknowledged": len(during),
        "disconnected_span_s": round(max(times) - min(times), 2) if times else 0.0,
    }


class Kept:
    """`--keep DIR`: what a run leaves behind to read after it, or nothing without a DIR."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)

    def text(self, name: str, text: str) -> None:
        if self.path is not None:
            (self.path / name).write_text(text)

    def json(self, name: str, value: Mapping[str, Any]) -> None:
        self.text(name, json.dumps(value, indent=1, default=str))

    def stack(self, stack: Stack) -> None:
        """Each node's log, and every notice and ProxyRegister the server received, in order, one
        JSON a line."""
        if self.path is None:
            return
        for node in stack.nodes:
            self.text(f"{node.name}.log", node.log_text())
        lines = [
            json.dumps(
                {
                    "received_at": call.received_at,
                    "answered_at": call.answered_at,
                    "agent_id": call.request.agent_id,
                    "session_id": call.request.session_id,
                    "event": EVENT.Name(call.request.event),
                    "gateway_node": call.request.gateway_node,
                    "code": None if call.code is None else call.code.name,
                    "acknowledged": call.response is not None and call.response.acknowledged,
                }
            )
            for call in stack.fake.calls(NOTIFY)
        ]
        self.text("notices.jsonl", "".join(f"{line}\n" for line in lines))
        registers = [
            json.dumps(
                {
                    "received_at": call.received_at,
                    "agent_id": call.request.info.agent_id,
                    "presented": str(call.metadata.get(SESSION_KEY, "")),
                    "code": None if call.code is None else call.code.name,
                    "session_id": "" if call.response is None else call.response.session_id,
                }
            )
            for call in stack.fake.calls(REGISTER)
        ]
        self.text("registers.jsonl", "".join(f"{line}\n" for line in registers))


def _raise_failed(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        if task.done() and task.exception() is not None:
            raise RuntimeError("a soak event failed") from task.exception()


async def _all_subscribed(stack: Stack) -> bool:
    return len(inv.current_sessions(await stack.reports())) == stack.agents
