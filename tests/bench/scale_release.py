"""The release under `tests.bench.scale`: N nodes started by the release supervisor as an operator
starts them (`python -m gateway.release supervise --nodes N`, what `rel/yuzu_gw start --nodes N`
runs), in a temporary run directory, sharing the agent and management ports (SO_REUSEPORT) and
seeded as one cluster (docs/multinode.md, docs/cluster.md); or, as the benchmark's control, not
clustered: no seed list and a seed name that cannot resolve, so each node serves alone.

The configuration is `sys_config/test.config` with fixed loopback ports: the agent and management
listeners (shared), and runs of N consecutive free ports for health, metrics and the cluster
transport (the supervisor offsets each by the node's index). The seed list names every node's
cluster port, so a single node is seeded with itself and the configuration differs only in N.
Unclustered, the seed list stays empty, `cluster_seed_dns_name` is `UNRESOLVABLE` (the test
configuration's `localhost` would resolve to 127.0.0.1, where the nodes' transports listen) and
`cluster_port` stays 0, a free port each: the nodes of a host find each other from a configured
port (docs/multinode.md), so with none each serves alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.console.client import one_shot
from gateway.console.paths import RunFiles
from gateway.release import runfile
from tests.bench.agents import (
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    TEST_CONFIG,
    VM_ARGS,
    http_get,
    metric_sum,
    process_cpu_s,
)
from tests.bench.common import REPO_ROOT

HOST = "127.0.0.1"
# The node's shipped heartbeat flush interval (1 s, as tests.bench.heartbeats runs it).
FLUSH_INTERVAL_MS = 1000
# A probe gets one interval: at 200 ms a busy host missed it every few seconds and the link
# dropped mid-broadcast; 1 s still forms the cluster within seconds of boot.
REDIAL_INTERVAL_MS = 1000
POLL_S = 0.2
MGMT_STATUS = 'status("listener_mgmt")["connections"]'
# `.invalid` never resolves (RFC 6761): the resolver answers NXDOMAIN at once, every round.
UNRESOLVABLE = "yuzu-bench-no-such-name.invalid"


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> int:
    """The first of `count` consecutive free loopback ports (per-node ports are offsets)."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - count)
        if all(_bindable(base + k) for k in range(count)):
            return base
    raise RuntimeError("no run of free ports")


def release_config(
    path: Path, nodes: int, agents: int, fake_port: int, *, clustered: bool = True
) -> dict[str, int]:
    """Write the configuration; returns the base ports (`agent`, `mgmt` shared)."""
    ports = {
        "agent": free_ports(1),
        "mgmt": free_ports(1),
        "health": free_ports(nodes),
        "metrics": free_ports(nodes),
        "cluster": free_ports(nodes),
    }
    seeds = ", ".join(f'<<"{HOST}:{ports["cluster"] + k}">>' for k in range(nodes))
    discovery = (
        ("{cluster_seed_nodes, []}", f"{{cluster_seed_nodes, [{seeds}]}}")
        if clustered
        else (
            '{cluster_seed_dns_name, <<"localhost">>}',
            f'{{cluster_seed_dns_name, <<"{UNRESOLVABLE}">>}}',
        )
    )
    upstream = (
        "{upstream_client, #{channels => [{default_channel,"
        f' [{{http, "{HOST}", {fake_port}, []}}], #{{}}}}]}}}}'
    )
    text = TEST_CONFIG.read_text()
    for old, new in (
        ("{health_port, 0}", f"{{health_port, {ports['health']}}}"),
        ("{prometheus_port, 0}", f"{{prometheus_port, {ports['metrics']}}}"),
        ("{cluster_port, 0}", f"{{cluster_port, {ports['cluster'] if clustered else 0}}}"),
        discovery,
        (
            "{cluster_redial_interval_ms, 5000}",
            f"{{cluster_redial_interval_ms, {REDIAL_INTERVAL_MS}}}",
        ),
        ("max_connections => 1000", f"max_connections => {max(1000, agents + 100)}"),
        ("{allow_no_upstream, true}", upstream),
    ):
        if old not in text:
            raise RuntimeError(f"sys_config/test.config has no {old}")
        text = text.replace(old, new)
    # The first listener is the agent one, the second the management one.
    for port in (ports["agent"], ports["mgmt"]):
        text = text.replace(
            "listen => #{port => 0, ip => {127,0,0,1}}",
            f"listen => #{{port => {port}, ip => {{127,0,0,1}}}}",
            1,
        )
    path.write_text(text)
    return ports


@dataclass
class Node:
    index: int
    name: str
    short_name: str
    pid: int
    metrics_port: int
    health_port: int


@dataclass
class Release:
    """A running release: its nodes, shared ports, run directory and cookie."""

    nodes: list[Node]
    agent_port: int
    mgmt_port: int
    run_dir: Path
    cookie: str

    def cpu_s(self) -> float:
        """User + system CPU seconds of every node process, summed (/proc/<pid>/stat)."""
        return sum(process_cpu_s(node.pid) for node in self.nodes)

    async def metric(self, node: Node, name: str) -> float:
        _, body = await http_get(node.metrics_port, "/metrics")
        return metric_sum(body.decode(errors="replace"), name)

    async def metric_total(self, name: str) -> float:
        return sum([await self.metric(node, name) for node in self.nodes])

    async def eval(self, node: Node, source: str) -> Any:
        """Evaluate `source` on the node's remote console; the reply's value."""
        files = RunFiles(self.run_dir, node.short_name)
        return await one_shot(files.console, self.cookie, "eval", source)

    async def mgmt_connections(self, node: Node) -> int:
        """Connections the node's management listener holds now."""
        reply = await self.eval(node, MGMT_STATUS)
        if not reply.get("ok"):
            raise RuntimeError(f"the console of {node.name} refused {MGMT_STATUS}: {reply}")
        return int(reply["result"])


async def _ready(record: runfile.ReleaseRecord | None, nodes: int) -> bool:
    if record is None or len(record.nodes) != nodes:
        return False
    for node in record.nodes:
        if node.state != "running" or node.pid is None:
            return False
        try:
            status, _ = await http_get(node.health_port, "/readyz", 2.0)
        except (OSError, TimeoutError, IndexError, ValueError):
            return False
        if status != 200:
            return False
    return True


async def _stop(process: asyncio.subprocess.Process) -> None:
    """The planned stop of every node (SIGTERM to the supervisor), then the group's SIGKILL."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), 4 * STOP_TIMEOUT_S)
    # Started in its own session: its process group holds every node.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


async def _linked(rel: Release, peers: int, deadline: float, workdir: Path) -> None:
    for node in rel.nodes:
        while await rel.metric(node, "yuzu_gw_cluster_peers_connected") < peers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not form; see {workdir}")
            await asyncio.sleep(POLL_S)


async def _alone(rel: Release, workdir: Path) -> None:
    """A control that had clustered after all would measure the cluster: refuse it. The first
    discovery round starts at boot; after one more interval any peer would have been resolved."""
    await asyncio.sleep(REDIAL_INTERVAL_MS / 1000)
    for node in rel.nodes:
        for name in ("yuzu_gw_cluster_peers_resolved", "yuzu_gw_cluster_peers_connected"):
            if await rel.metric(node, name):
                raise RuntimeError(f"{node.name} found a peer ({name}); see {workdir}")


@contextlib.asynccontextmanager
async def release(
    workdir: Path, nodes: int, agents: int, fake_port: int, *, clustered: bool = True
) -> AsyncIterator[Release]:
    """N nodes under the release supervisor, each ready and, clustered, linked to every other;
    unclustered, each checked to have resolved and linked no peer."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "scale.config"
    ports = release_config(config, nodes, agents, fake_port, clustered=clustered)
    run_dir = workdir / "run"
    cookie = secrets.token_hex(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith("YUZU_GW_")}
    env.update(
        YUZU_GW_CONFIG=str(config),
        YUZU_GW_VM_ARGS=str(VM_ARGS),
        YUZU_GW_COOKIE=cookie,
        YUZU_GW_RUN_DIR=str(run_dir),
        YUZU_GW_PYTHON=sys.executable,
        YUZU_GW_HEARTBEAT_INTERVAL_MS=str(FLUSH_INTERVAL_MS),
        YUZU_GW_STOP_TIMEOUT_S=str(STOP_TIMEOUT_S),
    )
    with (workdir / "release.out").open("ab") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.release",
            "supervise",
            "--nodes",
            str(nodes),
            "--logs",
            "files",
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not await _ready(runfile.read(run_dir), nodes):
            if process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the release did not start; see {workdir}")
            await asyncio.sleep(POLL_S)
        record = runfile.read(run_dir)
        assert record is not None
        started = Release(
            [
                Node(n.index, n.name, n.short_name, n.pid or 0, n.prometheus_port, n.health_port)
                for n in record.nodes
            ],
            ports["agent"],
            ports["mgmt"],
            run_dir,
            cookie,
        )
        if clustered:
            await _linked(started, nodes - 1, deadline, workdir)
        else:
            await _alone(started, workdir)
        yield started
    finally:
        await _stop(process)
