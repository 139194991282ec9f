"""A broadcast across a cluster of N nodes (default 4), in frames and forwarded targets:
`python -m tests.bench.scale_broadcast [--nodes 4] [--agents 400] [--broadcasts 20] [--json]`.

N nodes under the release supervisor (`tests.bench.scale_release`, seeded as one cluster, the
agent and management ports shared), the load generators of `tests.bench.fanout` (each agent
answers every command at once; the kernel spreads them over the nodes), and an operator on a
management connection the kernel gave node 1 (`tests.bench.scale.operators`). After the
directory has every agent (`yuzu_gw_cluster_directory_agents` on node 1 = the agents of the
others), `--broadcasts` broadcasts one after the other; read around them, summed over the
nodes: `yuzu_gw_cluster_forwards_total` (forwarded-command frames) and
`yuzu_gw_cluster_forwarded_targets_total` (agent ids in them).

The figures per broadcast are counts, not timings, so they do not depend on the host's load:
with the agent directory, one frame to each other node naming only its agents (N - 1 frames,
the other nodes' agents once each). "Before" is the design the directory replaced, by
arithmetic (it had no counter): a `HeldAgents` call to each of the N - 1 peers, then one frame
to each of them naming every agent not on node 1, so (N - 1) x those ids. The broadcast's p50
duration and the nodes' CPU per answer are printed as context.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gateway.devstack.fake_upstream import FakeUpstream
from tests.bench.common import Row, add_common_arguments, environment, report
from tests.bench.fanout import AGENTS_PER_LOADGEN, load_generators
from tests.bench.scale import Holders, broadcast, operators, progress, settled
from tests.bench.scale_release import release

NAME = "scale_broadcast"
DEFAULT_NODES = 4
DEFAULT_AGENTS = 400
DEFAULT_BROADCASTS = 20
DEFAULT_LOADGENS = 2
WARMUP_BROADCASTS = 2
FORWARDS = "yuzu_gw_cluster_forwards_total"
TARGETS = "yuzu_gw_cluster_forwarded_targets_total"
DIRECTORY = "yuzu_gw_cluster_directory_agents"
SETTLE_S = 60.0


async def run(
    nodes: int, agents: int, broadcasts: int, loadgens: int, quiet: bool
) -> dict[str, Any]:
    holders = Holders()
    with tempfile.TemporaryDirectory(prefix="yuzu-bench-") as tmp:
        workdir = Path(tmp)
        async with (
            FakeUpstream(on_call=holders.on_call) as fake,
            release(workdir, nodes, agents, fake.port, clustered=True) as rel,
        ):
            count = max(loadgens, math.ceil(agents / AGENTS_PER_LOADGEN))
            async with load_generators(workdir, rel.agent_port, agents, count) as (held, _):
                deadline = time.monotonic() + SETTLE_S
                while await rel.metric_total("yuzu_gw_agents_current") < held:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the nodes did not hold every subscribed agent")
                    await asyncio.sleep(0.2)
                await settled(rel, agents)
                first = rel.nodes[0]
                per_node = dict(sorted(Counter(holders.by_agent.values()).items()))
                remote = held - int(await rel.metric(first, "yuzu_gw_agents_current"))
                while await rel.metric(first, DIRECTORY) < remote:
                    if time.monotonic() > deadline:
                        raise RuntimeError("node 1's directory did not get every agent")
                    await asyncio.sleep(0.2)
                progress(f"{nodes} nodes: {held} agents held {per_node}", quiet)
                async with operators(rel, rel.nodes[:1]) as sends:
                    for n in range(WARMUP_BROADCASTS):
                        await broadcast(sends, f"w{n}")
                    frames0, ids0 = (
                        await rel.metric_total(FORWARDS),
                        await rel.metric_total(TARGETS),
                    )
                    cpu0, seconds, answers = rel.cpu_s(), [], 0
                    for b in range(broadcasts):
                        ok, took = await broadcast(sends, f"b{b}")
                        answers += ok
                        seconds.append(took)
                    cpu = rel.cpu_s() - cpu0
                    frames = await rel.metric_total(FORWARDS) - frames0
                    ids = await rel.metric_total(TARGETS) - ids0
    return {
        "bench": NAME,
        "environment": environment(),
        "nodes": nodes,
        "agents": held,
        "agents_per_node": per_node,
        "remote_agents": remote,
        "broadcasts": broadcasts,
        "answers_per_broadcast": answers / broadcasts,
        "frames_per_broadcast": frames / broadcasts,
        "forwarded_ids_per_broadcast": ids / broadcasts,
        "before_frames_per_broadcast": 2 * (nodes - 1),
        "before_forwarded_ids_per_broadcast": (nodes - 1) * remote,
        "broadcast_p50_ms": statistics.median(seconds) * 1000,
        "cpu_us_per_answer": cpu / answers * 1e6 if answers else None,
    }


def rows(result: dict[str, Any]) -> list[Row]:
    nodes = result["nodes"]
    return [
        Row(
            "nodes; agents held (by node)",
            f"{nodes}; {result['agents']} {result['agents_per_node']}",
        ),
        Row("answers per broadcast", f"{result['answers_per_broadcast']:.0f}"),
        Row(
            "frames per broadcast, before / directory",
            f"{result['before_frames_per_broadcast']} (N-1 HeldAgents + N-1 forwards)"
            f" / {result['frames_per_broadcast']:.1f}",
            f"= {nodes - 1}",
            result["frames_per_broadcast"] == nodes - 1,
        ),
        Row(
            "forwarded agent ids per broadcast, before / directory",
            f"{result['before_forwarded_ids_per_broadcast']} / "
            f"{result['forwarded_ids_per_broadcast']:.0f}",
            f"= {result['remote_agents']} (each remote agent once)",
            result["forwarded_ids_per_broadcast"] == result["remote_agents"],
        ),
        Row("broadcast p50", f"{result['broadcast_p50_ms']:.1f} ms"),
        Row("gateway CPU per answer (all nodes)", f"{result['cpu_us_per_answer']:.0f} us"),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m tests.bench.{NAME}", description=__doc__)
    parser.add_argument("--nodes", type=int, default=DEFAULT_NODES)
    parser.add_argument("--agents", type=int, default=DEFAULT_AGENTS)
    parser.add_argument("--broadcasts", type=int, default=DEFAULT_BROADCASTS)
    parser.add_argument("--loadgens", type=int, default=DEFAULT_LOADGENS)
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_common_arguments(parser, NAME)
    args = parser.parse_args(argv)
    if min(args.agents, args.broadcasts, args.loadgens) <= 0 or args.nodes < 2:
        parser.error("--agents, --broadcasts, --loadgens must be positive, --nodes at least 2")
    result = asyncio.run(run(args.nodes, args.agents, args.broadcasts, args.loadgens, args.quiet))
    report(result, rows(result), args.out, args.json)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
