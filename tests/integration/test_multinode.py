"""Several nodes on one host: `rel/yuzu_gw start --nodes N` end to end (docs/multinode.md).

The release runs as an operator runs it, against a grpcio fake server in the test's loop;
grpcio agents dial the one shared agent port and the kernel spreads their connections over
the nodes (SO_REUSEPORT). Each test has its own run directory, configuration (free ports) and
cookie, and kills the release's process group in a `finally`, so a failing test leaves
nothing running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import grpc
import grpc.aio
import pytest

from gateway.console.paths import alive
from gateway.devstack.fake_upstream import FakeUpstream
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2 as mgmt_pb2
from tests.integration.test_management_plane import operator
from tests.support.node import http_get

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "rel" / "yuzu_gw"
SERVICE = "/yuzu.agent.v1.AgentService/"
COMMAND_TIMEOUT_S = 90
DEADLINE_S = 20.0
HOST = "127.0.0.1"
# A node's config file with the placeholders `NodeConfig` fills; doubled braces are literal.
CONFIG = """\
[{{yuzu_gw, [
    {{health_port, {health}}},
    {{prometheus_port, {metrics}}},
    {{heartbeat_batch_interval_ms, 100}},
    {{telemetry_gauge_interval_ms, 1000}},
    {{shutdown_flush_budget_ms, 2000}},
    {{cluster_seed_nodes, [{seed_terms}]}},
    {{cluster_seed_dns_name, <<"{dns_name}">>}},
    {{cluster_redial_interval_ms, {redial_ms}}},
    {{cluster_port, {cluster}}},
    {{upstream_client, #{{channels => [{{default_channel,
        [{{http, "127.0.0.1", {upstream}, []}}], #{{}}}}]}}}},
    {{grpc_listeners, [
        #{{name => agent,
          service_protos => [agent_pb],
          services => #{{'yuzu.agent.v1.AgentService' => yuzu_gw_agent_service}},
          listen => #{{port => {agent}, ip => {{{ip}}}}}}},
        #{{name => mgmt,
          service_protos => [management_pb],
          services => #{{'yuzu.server.v1.ManagementService' => yuzu_gw_mgmt_service}},
          listen => #{{port => {mgmt}, ip => {{{ip}}}}}}}
    ]}}
]}}].
"""
# The shipped cluster_redial_interval_ms.
REDIAL_MS = 5000


@attrs.frozen(kw_only=True)
class NodeConfig:
    """A node's config file: its listeners on `host`, its peers `seeds` (none: the seed name,
    `dns_name`), its cluster port (0: a free one)."""

    health: int
    metrics: int
    upstream: int
    agent: int
    mgmt: int
    host: str = HOST
    seeds: Sequence[str] = ()
    cluster: int = 0
    redial_ms: int = REDIAL_MS
    dns_name: str = "localhost"

    def text(self) -> str:
        terms = ", ".join(f'<<"{seed}">>' for seed in self.seeds)
        return CONFIG.format(**attrs.asdict(self), ip=self.host.replace(".", ","), seed_terms=terms)


# -- ports ---------------------------------------------------------------------------------


def bindable(port: int, host: str = HOST) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, hosts: Sequence[str] = (HOST,)) -> int:
    """The first of `count` consecutive ports free on every one of `hosts` (loopback
    addresses; per-node ports are offsets)."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - count)
        if all(bindable(base + k, host) for host in hosts for k in range(count)):
            return base
    raise RuntimeError("no run of free ports")


def refused(port: int, host: str = HOST) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((host, port)) != 0


# -- the release ---------------------------------------------------------------------------


@attrs.define
class Release:
    run_dir: Path
    env: dict[str, str]
    nodes: int
    agent_port: int
    mgmt_port: int
    health_port: int
    metrics_port: int

    async def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The script, in a thread: the fake server in this loop must keep serving."""
        return await asyncio.to_thread(
            subprocess.run,
            [str(SCRIPT), *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.run_dir.parent,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )

    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = json.loads((self.run_dir / "nodes.json").read_text())
        return record

    def name(self, index: int) -> str:
        return f"yuzu_gw-{index}@127.0.0.1"

    def ports(self) -> list[int]:
        own = [p + k for p in (self.health_port, self.metrics_port) for k in range(self.nodes)]
        return [self.agent_port, self.mgmt_port, *own]

    async def gauge(self, index: int, name: str) -> int:
        """Node `index`'s unlabelled gauge `name`, from its /metrics."""
        status, body = await http_get(self.metrics_port + index - 1, "/metrics")
        assert status == 200
        match = re.search(rf"^{name} (\S+)$", body.decode(), re.MULTILINE)
        assert match is not None
        return int(float(match.group(1)))

    async def agents_current(self, index: int) -> int:
        return await self.gauge(index, "yuzu_gw_agents_current")

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError, ValueError):
            record = self.record()
            return [record["supervisor_pid"], *(n["pid"] for n in record["nodes"] if n["pid"])]
        return []

    def kill_leftovers(self) -> None:
        for pid in self.pids():
            # `start` runs the supervisor under setsid: its process group holds every node.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def release(
    tmp_path: Path, nodes: int, **cluster: Any
) -> AsyncIterator[tuple[Release, FakeUpstream]]:
    """`cluster`: NodeConfig's cluster fields (`cluster`, `dns_name`, `seeds`, `redial_ms`)."""
    async with FakeUpstream() as fake:
        health, metrics = free_ports(nodes), free_ports(nodes)
        agent, mgmt = free_ports(1), free_ports(1)
        config = tmp_path / "multinode.config"
        config.write_text(
            NodeConfig(
                health=health,
                metrics=metrics,
                upstream=fake.port,
                agent=agent,
                mgmt=mgmt,
                **cluster,
            ).text()
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("YUZU_GW_")}
        env.update(
            YUZU_GW_CONFIG=str(config),
            YUZU_GW_COOKIE=secrets.token_hex(32),
            YUZU_GW_PYTHON=sys.executable,
            YUZU_GW_RUN_DIR="run",
            YUZU_GW_START_WAIT_S="60",
            YUZU_GW_STOP_TIMEOUT_S="30",
        )
        rel = Release(tmp_path / "run", env, nodes, agent, mgmt, health, metrics)
        try:
            yield rel, fake
        finally:
            rel.kill_leftovers()


class Agent:
    """One grpcio channel, so one connection to the shared agent port (of `host`)."""

    def __init__(self, port: int, agent_id: str, host: str = HOST) -> None:
        self.agent_id = agent_id
        self.channel = grpc.aio.insecure_channel(
            f"{host}:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self.session_id = ""
        self.stream: grpc.aio.StreamStreamCall | None = None

    def _unary(self, method: str, response: type[Any]) -> Any:
        return self.channel.unary_unary(
            SERVICE + method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,
        )

    async def connect(self) -> None:
        """Register and open the Subscribe stream: the agent is held by one node."""
        request = agent_pb2.RegisterRequest()
        request.info.agent_id = self.agent_id
        answer = await self._unary("Register", agent_pb2.RegisterResponse)(
            request, timeout=DEADLINE_S
        )
        assert answer.accepted
        self.session_id = answer.session_id
        self.stream = self.channel.stream_stream(
            SERVICE + "Subscribe",
            request_serializer=agent_pb2.CommandResponse.SerializeToString,
            response_deserializer=agent_pb2.CommandRequest.FromString,
        )(metadata=(("x-yuzu-session-id", self.session_id),))

    async def heartbeat(self) -> agent_pb2.HeartbeatResponse:
        call = self._unary("Heartbeat", agent_pb2.HeartbeatResponse)
        request = agent_pb2.HeartbeatRequest(session_id=self.session_id)
        return await call(request, timeout=DEADLINE_S)

    async def close(self) -> None:
        await self.channel.close()


@contextlib.asynccontextmanager
async def connected(rel: Release, count: int) -> AsyncIterator[list[Agent]]:
    made = [Agent(rel.agent_port, f"agent-{i}") for i in range(count)]
    try:
        for agent in made:
            await agent.connect()
        yield made
    finally:
        for agent in made:
            await agent.close()


async def holders(fake: FakeUpstream, agents: list[Agent]) -> dict[str, str]:
    """agent id -> the node that reported its stream CONNECTED (gateway_node)."""
    await fake.wait_for_calls("NotifyStreamStatus", count=len(agents), timeout=20.0)
    return {n.agent_id: n.gateway_node for n in fake.requests("NotifyStreamStatus")}


async def until(predicate: Any, what: str, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def started(rel: Release) -> None:
    done = await rel.run("start", "--nodes", str(rel.nodes))
    assert done.returncode == 0, done.stderr + done.stdout
    assert f"{rel.nodes} nodes started" in done.stdout
    record = rel.record()
    assert [n["name"] for n in record["nodes"]] == [rel.name(k) for k in range(1, rel.nodes + 1)]
    assert [(n["health_port"], n["prometheus_port"]) for n in record["nodes"]] == [
        (rel.health_port + k, rel.metrics_port + k) for k in range(rel.nodes)
    ]


async def check_spread_and_admission(
    rel: Release, fake: FakeUpstream, agents: list[Agent]
) -> dict[str, str]:
    """Every agent is held by one node, more than one node holds agents, each node's
    /metrics counts its own, and every heartbeat is admitted by the node holding it."""
    held_by = await holders(fake, agents)
    names = {rel.name(k) for k in range(1, rel.nodes + 1)}
    assert set(held_by) == {a.agent_id for a in agents}
    assert set(held_by.values()) <= names
    assert len(set(held_by.values())) > 1, f"the kernel put every agent on one node: {held_by}"
    per_node = Counter(held_by.values())
    counts = [await rel.agents_current(k) for k in range(1, rel.nodes + 1)]
    assert counts == [per_node[rel.name(k)] for k in range(1, rel.nodes + 1)]
    assert sum(counts) == len(agents)

    for agent in agents:
        # Admission reads node-local state: only the node holding the session admits it.
        assert (await agent.heartbeat()).acknowledged
    by_session = {a.session_id: a.agent_id for a in agents}

    def batched() -> set[str]:
        return {hb.session_id for r in fake.requests("BatchHeartbeat") for hb in r.heartbeats}

    await fake.wait_for(lambda: set(by_session) <= batched(), timeout=20.0)
    for request in fake.requests("BatchHeartbeat"):
        for hb in request.heartbeats:
            if hb.session_id in by_session:
                # Upstream from the node that holds the agent, under that node's name.
                assert request.gateway_node == held_by[by_session[hb.session_id]]
    return held_by


async def stopped(rel: Release) -> None:
    pids = rel.pids()
    done = await rel.run("stop")
    assert done.returncode == 0, done.stderr + done.stdout
    assert f"{rel.nodes} nodes stopped" in done.stdout
    assert not any(alive(pid) for pid in pids)
    assert not (rel.run_dir / "nodes.json").exists()
    assert not list(rel.run_dir.glob("*.pid")) and not list(rel.run_dir.glob("*.console"))
    assert all(refused(port) for port in rel.ports())


# -- the tests -----------------------------------------------------------------------------


def test_two_nodes_share_the_agent_port_and_a_killed_node_is_restarted(tmp_path: Path) -> None:
    async def body() -> None:
        async with release(tmp_path, 2) as (rel, fake):
            await started(rel)
            for k in (1, 2):
                ping = await rel.run("ping", "--node", str(k))
                assert (ping.returncode, ping.stdout) == (0, "pong\n"), ping.stderr
                name = await rel.run("eval", "--node", str(k), "node.name")
                assert name.stdout == f"'{rel.name(k)}'\n", name.stderr
            # Without --node: node 1, as with one node.
            default = await rel.run("eval", "node.name")
            assert default.stdout == f"'{rel.name(1)}'\n"
            beyond = await rel.run("ping", "--node", "3")
            assert beyond.returncode == 2 and "1..2" in beyond.stderr
            status = await rel.run("status")
            assert status.returncode == 0, status.stdout
            assert status.stdout.count("is running") == 2

            async with connected(rel, 16) as agents:
                held_by = await check_spread_and_admission(rel, fake, agents)

                # kill -9 node 2: the supervisor restarts it, node 1 keeps serving.
                victim = rel.record()["nodes"][1]
                supervisor = rel.record()["supervisor_pid"]
                os.kill(victim["pid"], signal.SIGKILL)

                async def restarted() -> bool:
                    node = rel.record()["nodes"][1]
                    if node["pid"] == victim["pid"] or node["state"] != "running":
                        return False
                    ping = await rel.run("ping", "--node", "2")
                    return ping.returncode == 0

                await until(restarted, "node 2 restarted")
                assert rel.record()["nodes"][1]["restarts"] == 1
                assert rel.record()["supervisor_pid"] == supervisor and alive(supervisor)
                survivors = [a for a in agents if held_by[a.agent_id] == rel.name(1)]
                for agent in survivors:
                    assert agent.stream is not None and not agent.stream.done()
                    assert (await agent.heartbeat()).acknowledged
                assert await rel.agents_current(1) == len(survivors)
                # The restarted node starts empty: its agents went with the killed process.
                assert await rel.agents_current(2) == 0
                log = (rel.run_dir / "release.log").read_text()
                assert "killed by SIGKILL; restarting it" in log
                assert rel.env["YUZU_GW_COOKIE"] not in log

            await stopped(rel)

    asyncio.run(asyncio.wait_for(body(), 200))


def test_three_nodes_spread_agents_and_stop_together(tmp_path: Path) -> None:
    async def body() -> None:
        async with release(tmp_path, 3) as (rel, fake):
            await started(rel)
            again = await rel.run("start", "--nodes", "3")
            assert again.returncode == 1 and "already running" in again.stderr
            single = await rel.run("start")
            assert single.returncode == 1 and "multi-node release is running" in single.stderr
            for k in (1, 2, 3):
                ping = await rel.run("ping", "--node", str(k))
                assert (ping.returncode, ping.stdout) == (0, "pong\n"), ping.stderr
            async with connected(rel, 24) as agents:
                await check_spread_and_admission(rel, fake, agents)
            await stopped(rel)
            # Nothing is left to stop, and the record is gone: only node 1 exists again.
            after = await rel.run("stop")
            assert after.returncode == 1
            ping = await rel.run("ping", "--node", "2")
            assert ping.returncode == 1 and "only node 1" in ping.stderr

    asyncio.run(asyncio.wait_for(body(), 200))


def test_the_nodes_of_a_host_form_one_cluster_with_no_seed_that_resolves(tmp_path: Path) -> None:
    """No seed list and a seed name that resolves nothing, as on a host where nobody configured
    the cluster: the nodes still link to each other (the release told each its host's node
    count), so an operator on the shared management port reaches every node's agents."""

    async def body() -> None:
        cluster = free_ports(2)
        nowhere = "yuzu-gw-test-no-such-name.invalid"
        async with release(tmp_path, 2, cluster=cluster, dns_name=nowhere) as (rel, fake):
            await started(rel)
            assert [n["cluster_port"] for n in rel.record()["nodes"]] == [cluster, cluster + 1]

            async def linked() -> bool:
                peers = [await rel.gauge(k, "yuzu_gw_cluster_peers_connected") for k in (1, 2)]
                return peers == [1, 1]

            await until(linked, "each node linked to the other")
            async with connected(rel, 12) as agents:
                await check_spread_and_admission(rel, fake, agents)
                ids = sorted(a.agent_id for a in agents)
                # Each fresh connection lands on either node: every one lists every agent.
                for _ in range(4):
                    async with operator(f"{HOST}:{rel.mgmt_port}") as op:
                        page = await op.unary(
                            "ListAgents",
                            mgmt_pb2.ListAgentsRequest(limit=100),
                            mgmt_pb2.ListAgentsResponse,
                        )
                    assert [s.agent_id for s in page.agents] == ids
            await stopped(rel)

    asyncio.run(asyncio.wait_for(body(), 200))


def test_foreground_runs_the_nodes_and_sigterm_stops_them_all(tmp_path: Path) -> None:
    async def body() -> None:
        async with release(tmp_path, 2) as (rel, _fake):
            output = tmp_path / "foreground.log"
            with output.open("wb") as sink:
                proc = await asyncio.create_subprocess_exec(
                    str(SCRIPT),
                    "foreground",
                    "--nodes",
                    "2",
                    env=rel.env,
                    cwd=rel.run_dir.parent,
                    stdout=sink,
                    stderr=sink,
                    # Its own process group, which the fixture kills if the test fails.
                    start_new_session=True,
                )
            try:

                async def both_answer() -> bool:
                    pings = [await rel.run("ping", "--node", str(k)) for k in (1, 2)]
                    return all(p.returncode == 0 for p in pings)

                await until(both_answer, "both nodes")
                # exec: the script's process is the supervisor, which SIGTERM reaches.
                assert rel.record()["supervisor_pid"] == proc.pid
                node_pids = [n["pid"] for n in rel.record()["nodes"]]
                proc.send_signal(signal.SIGTERM)
                await asyncio.wait_for(proc.wait(), 60)
                logged = output.read_text()
                assert proc.returncode == 0, logged[-2000:]
                assert not any(alive(pid) for pid in node_pids)
                # Both nodes' logs went to the supervisor's own output.
                assert logged.count("planned stop requested") == 2
                assert all(refused(port) for port in rel.ports())
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()

    asyncio.run(asyncio.wait_for(body(), 200))
