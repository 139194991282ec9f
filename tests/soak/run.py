"""One soak run: boot the stack, let the fleet join, play the schedule, let the fleet settle,
check the invariants, stop the node as systemd would (SIGTERM) and check again.

The result is a JSON-able dict: the seed, the sizes, what ran (faults and commands), the figures
and `invariants`, every count of tests/soak/invariants.py (each must be 0), with `passed`.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from protos.yuzu.gateway.v1 import gateway_pb2
from tests.bench.common import environment
from tests.soak import invariants as inv
from tests.soak import schedule as sched
from tests.soak.faults import PARAM_CANARY, Faults
from tests.soak.stack import Stack

NOTIFY = "NotifyStreamStatus"
_EVENT = gateway_pb2.StreamStatusNotification.Event
# How long the fleet may take to join, and to settle after the last fault. The stock backoff
# doubles to 256 s, so a settle covers the steps an agent may have reached in a short run.
JOIN_S = 120.0
SETTLE_S = 150.0
POLL_S = 2.0
# A SendCommand racing a router kill may be answered UNAVAILABLE this long after it.
ROUTER_RESTART_S = 5.0

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


def notices(stack: Stack) -> list[tuple[str, str]]:
    """The fake's acknowledged stream-status notices, in the order received."""
    out = []
    for call in stack.fake.calls(NOTIFY):
        if call.code is not None and call.code.name == "OK" and call.response.acknowledged:
            out.append((call.request.session_id, _EVENT.Name(call.request.event)))
    return out


async def _until(predicate: Any, timeout: float) -> bool:
    """Poll the async `predicate` until it is true or `timeout` passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


async def _settled(stack: Stack) -> tuple[bool, dict[str, dict[str, Any]]]:
    """Wait until every agent is subscribed and the notices agree with what the agents hold."""
    last: dict[str, dict[str, Any]] = {}

    async def quiet() -> bool:
        nonlocal last
        last = await stack.reports()
        held = inv.current_sessions(last)
        if len(held) < stack.agents:
            return False
        history, _ = inv.notice_history(notices(stack))
        return not any(inv.notice_counts(history, held.values(), stopped=False).values())

    ok = await _until(quiet, SETTLE_S)
    return ok, last


async def run_soak(
    agents: int, minutes: float, seed: int, *, quiet: bool = False
) -> dict[str, Any]:
    def progress(text: str) -> None:
        if not quiet:
            print(f"soak: {text}", file=sys.stderr, flush=True)

    plan = sched.build(seed, minutes * 60.0, agents)
    progress(f"seed {seed}: {len(plan.faults)} faults, {len(plan.commands)} commands")
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="yuzu-soak-") as tmp:
        async with Stack(Path(tmp), agents, seed) as stack:
            joined = await _until(lambda: _all_subscribed(stack), JOIN_S)
            progress(f"fleet joined: {joined}")
            faults = Faults(stack, seed)
            rss: list[int] = []
            tasks: list[asyncio.Task[None]] = []
            start = loop.time()
            try:
                for event in plan.events:
                    await asyncio.sleep(max(0.0, start + event.at_s - loop.time()))
                    if event.kind in (sched.COMMAND, sched.BROADCAST):
                        tasks.append(loop.create_task(faults.command(event)))
                        continue
                    if event.cycle == 1 and not rss:
                        rss.append(stack.node_rss())  # after the first cycle
                    progress(f"t={event.at_s:.0f}s {event.kind}")
                    tasks.append(loop.create_task(faults.fault(event)))
                await asyncio.gather(*tasks)
                settled, reports = await _settled(stack)
                progress(f"settled: {settled}")
                rss.append(stack.node_rss())
                snapshot = await stack.eval_json("_snapshot", SNAPSHOT)
                exposition = await stack.metrics()
            finally:
                await faults.close()
            held = inv.current_sessions(reports)
            history, repeats = inv.notice_history(notices(stack))
            counts: dict[str, int] = {
                "agents_not_subscribed": agents - len(held),
                **inv.notice_counts(history, held.values(), stopped=False),
                **inv.registry_counts(snapshot["indexed"], reports),
                **inv.owner_counts(snapshot["owner_actors"], snapshot["owner_rows"], held.values()),
                **inv.command_counts(faults.commands, faults.router_kills(), ROUTER_RESTART_S),
                **inv.gauge_counts(exposition, snapshot["registry"]),
                **inv.rss_counts(rss[0], rss[-1]),
                **faults.shedder_misses(),
            }
            progress("planned stop")
            exit_status = await stack.planned_stop()
            history, repeats_after = inv.notice_history(notices(stack))
            counts.update(inv.notice_counts(history, (), stopped=True))
            counts["node_exit_status"] = exit_status
            counts.update(inv.canary_counts(stack.log_text(), (stack.token, PARAM_CANARY)))
            return {
                "benchmark": "soak",
                "seed": seed,
                "agents": agents,
                "minutes": minutes,
                "faults": [
                    {
                        "kind": f.kind,
                        "at_s": f.at_s,
                        "took_s": round(f.done - f.started, 3),
                        **f.detail,
                    }
                    for f in faults.faults
                ],
                "commands": len(faults.commands),
                "command_terminals": sum(sum(c.terminals.values()) for c in faults.commands),
                "sessions_seen": len(history),
                "reconnects": sum(
                    len(r["sessions"]) - 1 for r in reports.values() if r["sessions"]
                ),
                "notice_repeats": repeats_after,
                "notice_repeats_before_stop": repeats,
                "rss_bytes": {"first_cycle": rss[0], "last": rss[-1]},
                # False: the run was too short for a second cycle, so RSS was not compared.
                "rss_compared": len(rss) > 1,
                "cycles": 1 + max((f.cycle for f in plan.faults), default=0),
                "invariants": counts,
                "passed": not any(counts.values()),
                "environment": environment(),
            }


async def _all_subscribed(stack: Stack) -> bool:
    return len(inv.current_sessions(await stack.reports())) == stack.agents
