"""The cluster across OS processes (issue 9, docs/cluster.md): each node is its own
`python -m gateway` on its own loopback address, as nodes of distinct hosts are (Linux routes
all of 127.0.0.0/8 to lo, so 127.0.0.2, 127.0.0.3, ... need no setup). Every node listens for
agents, operators and peers on its address only, all on the same port numbers, and every
node has the same seed list naming all five addresses without a port (so `cluster_port`).

Two clusters' worth: alpha (three nodes) and beta (two) share that seed list but not a
cookie, so each forms with its own members only. Alpha boots with the shipped
sys_config/vm.args (`-name yuzu_gw@${YUZU_GW_ADVERTISE_ADDR}`, no edit) and the variable set,
as each host's environment would (every address here is on lo, so auto-detection could not
tell the "hosts" apart); beta names its nodes in its own vm.args.
grpcio agents dial each node; the operators are grpcio clients on each node's management
port; the nodes share one fake server in the test's loop. A node is killed with SIGKILL
while a broadcast waits on its agents. Every process is killed in a `finally` (each has its
own session), and a passing run ends with every port refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import grpc
import pytest

from gateway.config.advertise import ADVERTISE_VAR, Step
from gateway.devstack.fake_upstream import FakeUpstream
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2 as mgmt
from tests.integration import test_multinode as multinode
from tests.integration.test_agent_plane import Metrics
from tests.integration.test_management_plane import answers, collect, command, operator, reply
from tests.integration.test_multinode import Agent, NodeConfig
from tests.support.node import ROOT, http_get

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

Code = grpc.StatusCode
S = agent_pb2.CommandResponse.Status
ALPHA = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
BETA = ("127.0.0.5", "127.0.0.6")
AGENTS_PER_NODE = 2
# Rounds this often, so links form (and a dead peer is noticed) within a second or so.
REDIAL_MS = 200
FORM_S = 30.0
READ_S = 10.0
# The killed node's targets must settle well inside the command's own timeout: no hang.
COMMAND_TIMEOUT_S = 60
SETTLE_S = 10.0
STOP_S = 20.0

NAMED = "-name yuzu_gw@{addr}\n-setcookie ${{YUZU_GW_COOKIE}}\n"
SHIPPED_VM_ARGS = ROOT / "sys_config" / "vm.args"


@attrs.frozen
class Ports:
    """The same agent, management and cluster port on every address; health and metrics are
    bound on every interface, so node k takes the k-th port after each base given here."""

    agent: int
    mgmt: int
    cluster: int
    health: int
    metrics: int


def proc_env(
    tmp_path: Path,
    addr: str,
    index: int,
    ports: Ports,
    *,
    upstream: int,
    seeds: Sequence[str],
    cookie: str,
) -> dict[str, str]:
    """Node `index` on `addr`: its run directory and config written, its vm.args naming it, and
    the environment it boots with (nothing of the test's own YUZU_GW_* leaks in)."""
    run_dir = tmp_path / addr
    run_dir.mkdir()
    config = run_dir / "node.config"
    config.write_text(
        NodeConfig(
            health=ports.health + index,
            metrics=ports.metrics + index,
            upstream=upstream,
            agent=ports.agent,
            mgmt=ports.mgmt,
            host=addr,
            seeds=seeds,
            cluster=ports.cluster,
            redial_ms=REDIAL_MS,
        ).text()
    )
    vm_args = run_dir / "vm.args"
    vm_args.write_text(NAMED.format(addr=addr))
    base = {k: v for k, v in os.environ.items() if not k.startswith("YUZU_GW_")}
    return dict(
        base,
        YUZU_GW_CONFIG=str(config),
        YUZU_GW_VM_ARGS=str(vm_args),
        YUZU_GW_COOKIE=cookie,
        YUZU_GW_RUN_DIR=str(run_dir),
    )


@attrs.define
class ProcNode:
    addr: str
    index: int
    run_dir: Path
    env: dict[str, str]
    ports: Ports
    proc: asyncio.subprocess.Process | None = None

    @property
    def name(self) -> str:
        return f"yuzu_gw@{self.addr}"

    @property
    def mgmt(self) -> str:
        return f"{self.addr}:{self.ports.mgmt}"

    @property
    def own_ports(self) -> list[tuple[str, int]]:
        on_addr = [self.ports.agent, self.ports.mgmt, self.ports.cluster]
        shared = [self.ports.health + self.index, self.ports.metrics + self.index]
        return [(self.addr, p) for p in on_addr] + [("127.0.0.1", p) for p in shared]

    async def start(self) -> None:
        with (self.run_dir / "node.log").open("wb") as sink:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gateway",
                env=self.env,
                cwd=ROOT,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
                # Its own process group: the `finally` kills it whatever the test did.
                start_new_session=True,
            )

    def log(self) -> str:
        return (self.run_dir / "node.log").read_text(errors="replace")

    async def metrics(self) -> Metrics | None:
        """/metrics now, or None while the node is not serving it."""
        assert self.proc is not None
        if self.proc.returncode is not None:
            raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.log()}")
        try:
            status, body = await http_get(self.ports.metrics + self.index, "/metrics")
        except (OSError, TimeoutError):
            return None
        return Metrics(body.decode()) if status == 200 else None

    async def peers(self) -> int | None:
        metrics = await self.metrics()
        return None if metrics is None else int(metrics.value("yuzu_gw_cluster_peers_connected"))

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def two_clusters(
    tmp_path: Path,
) -> AsyncIterator[tuple[list[ProcNode], list[ProcNode], FakeUpstream]]:
    """Alpha and beta running, each formed with its own members."""
    every = ALPHA + BETA
    if not all(multinode.bindable(0, addr) for addr in every):
        pytest.skip("the loopback addresses 127.0.0.2-6 cannot be bound here (not Linux)")
    ports = Ports(
        agent=multinode.free_ports(1, every),
        mgmt=multinode.free_ports(1, every),
        cluster=multinode.free_ports(1, every),
        health=multinode.free_ports(len(every)),
        metrics=multinode.free_ports(len(every)),
    )
    nodes: list[ProcNode] = []
    async with FakeUpstream() as fake:
        try:
            for members in (ALPHA, BETA):
                cookie = secrets.token_hex(32)
                for addr in members:
                    index = len(nodes)
                    env = proc_env(
                        tmp_path, addr, index, ports, upstream=fake.port, seeds=every, cookie=cookie
                    )
                    if members is ALPHA:
                        env.update(YUZU_GW_VM_ARGS=str(SHIPPED_VM_ARGS), **{ADVERTISE_VAR: addr})
                    nodes.append(ProcNode(addr, index, tmp_path / addr, env, ports))
            await asyncio.gather(*(node.start() for node in nodes))
            alpha, beta = nodes[: len(ALPHA)], nodes[len(ALPHA) :]
            for members in (alpha, beta):
                for node in members:

                    async def formed(node: ProcNode = node, size: int = len(members)) -> bool:
                        return await node.peers() == size - 1

                    await multinode.until(formed, f"{node.name} in its cluster", FORM_S)
            yield alpha, beta, fake
        finally:
            await kill_all(nodes)


@contextlib.asynccontextmanager
async def agents_on(nodes: Sequence[ProcNode]) -> AsyncIterator[dict[str, list[Agent]]]:
    """AGENTS_PER_NODE agents held by each node: node name -> its agents."""
    held: dict[str, list[Agent]] = {}
    try:
        for node in nodes:
            held[node.name] = [
                Agent(node.ports.agent, f"agent-{node.addr}-{n}", node.addr)
                for n in range(AGENTS_PER_NODE)
            ]
            for agent in held[node.name]:
                await agent.connect()
        # Each node's agent directory places the agents of its cluster's other nodes (a join
        # reaches the peers a directory scan after the agent registered; docs/cluster.md).
        for node in nodes:
            cluster = ALPHA if node.addr in ALPHA else BETA
            others = AGENTS_PER_NODE * (len(cluster) - 1)

            async def placed(node: ProcNode = node, others: int = others) -> bool:
                metrics = await node.metrics()
                found = metrics.value("yuzu_gw_cluster_directory_agents") if metrics else None
                return found == others

            await multinode.until(placed, f"{node.name}'s agent directory", FORM_S)
        yield held
    finally:
        for made in held.values():
            for agent in made:
                await agent.close()


def stream_of(agent: Agent) -> grpc.aio.StreamStreamCall:
    assert agent.stream is not None
    return agent.stream


async def receives(agent: Agent, command_id: str) -> None:
    assert await asyncio.wait_for(stream_of(agent).read(), READ_S) == command(command_id)


async def answered(
    call: grpc.aio.UnaryStreamCall, agents: Sequence[Agent], command_id: str
) -> list[tuple[str, int, str]]:
    """Each agent gets the command and answers SUCCESS; the operator's whole stream."""
    for agent in agents:
        await receives(agent, command_id)
        await reply(stream_of(agent), command_id, S.SUCCESS)
    responses, code = await collect(call)
    assert code is Code.OK
    return sorted(answers(responses))


def successes(agents: Sequence[Agent]) -> list[tuple[str, int, str]]:
    return sorted((a.agent_id, S.SUCCESS, f"s{S.SUCCESS}") for a in agents)


async def check_discovery(alpha: list[ProcNode], beta: list[ProcNode]) -> None:
    """(i) Each node took its peers from the seed list, and refused the other cluster's."""
    for node in alpha + beta:
        metrics = await node.metrics()
        assert metrics is not None
        # The seed list names all five; a node is not its own peer.
        assert metrics.value("yuzu_gw_cluster_peers_resolved") == len(ALPHA + BETA) - 1
        assert metrics.value("yuzu_gw_cluster_auth_refused_total") >= 1
        assert f"Cluster transport listening on {node.addr}:{node.ports.cluster}" in node.log()
        assert node.env["YUZU_GW_COOKIE"] not in node.log()
    for node in alpha:
        assert f"Advertise address {node.addr}: {Step.EXPLICIT.value}" in node.log()


async def check_commands(
    alpha: list[ProcNode], beta: list[ProcNode], held: dict[str, list[Agent]]
) -> None:
    """(ii) From each node's management port a command reaches every agent of its cluster and
    none of the other's; a broadcast is answered by all of its cluster."""
    alpha_agents = [a for node in alpha for a in held[node.name]]
    beta_agents = [a for node in beta for a in held[node.name]]
    stranger = beta_agents[0].agent_id
    ids = tuple(a.agent_id for a in alpha_agents)
    for node in alpha:
        async with operator(node.mgmt) as op:
            cid = f"to-all-from-{node.addr}"
            got = await answered(op.send(command(cid), (*ids, stranger), 30), alpha_agents, cid)
            assert got == sorted([*successes(alpha_agents), (stranger, S.FAILURE, "not_connected")])
            page = await op.unary(
                "ListAgents", mgmt.ListAgentsRequest(limit=100), mgmt.ListAgentsResponse
            )
            assert [s.agent_id for s in page.agents] == sorted(ids)
    for members, agents, cid in ((alpha, alpha_agents, "bc-alpha"), (beta, beta_agents, "bc-beta")):
        async with operator(members[-1].mgmt) as op:
            assert await answered(op.send(command(cid), ()), agents, cid) == successes(agents)


async def check_kill_mid_broadcast(alpha: list[ProcNode], held: dict[str, list[Agent]]) -> None:
    """(iii) SIGKILL of a node whose agents have not answered yet: the others' answers, then
    `agent_disconnected` for its agents, never a hang."""
    origin, survivor, victim = alpha
    answering = held[origin.name] + held[survivor.name]
    waiting = held[victim.name]
    async with operator(origin.mgmt) as op:
        call = op.send(command("kill"), (), COMMAND_TIMEOUT_S)
        for agent in answering + waiting:
            await receives(agent, "kill")
        for agent in answering:
            await reply(stream_of(agent), "kill", S.SUCCESS)
        for agent in waiting:
            await reply(stream_of(agent), "kill", S.RUNNING)
        # The broadcast is in flight: every frame so far has reached the operator.
        early: list[Any] = []
        while len(early) < len(answering) + len(waiting):
            early.append(await asyncio.wait_for(call.read(), READ_S))
        victim.kill()
        async with asyncio.timeout(SETTLE_S):
            rest, code = await collect(call)
        assert code is Code.OK
        running = [(a.agent_id, S.RUNNING, f"s{S.RUNNING}") for a in waiting]
        disconnected = [(a.agent_id, S.FAILURE, "agent_disconnected") for a in waiting]
        assert sorted(answers(early)) == sorted(successes(answering) + running)
        assert sorted(answers(rest)) == sorted(disconnected)
    assert victim.proc is not None
    assert await asyncio.wait_for(victim.proc.wait(), READ_S) == -signal.SIGKILL

    async def dropped() -> bool:
        return [await node.peers() for node in (origin, survivor)] == [1, 1]

    await multinode.until(dropped, "the survivors to drop the killed node", FORM_S)


async def kill_all(nodes: Sequence[ProcNode]) -> None:
    """SIGKILL every node still running and reap it (a test's cleanup, whatever happened)."""
    for node in nodes:
        node.kill()
    for node in nodes:
        if node.proc is not None:
            await node.proc.wait()


async def stop_all(nodes: Sequence[ProcNode]) -> None:
    """The planned stop of every node still running, then every port is free."""
    running = [n for n in nodes if n.proc is not None and n.proc.returncode is None]
    for node in running:
        assert node.proc is not None
        node.proc.send_signal(signal.SIGTERM)
    for node in running:
        assert node.proc is not None
        assert await asyncio.wait_for(node.proc.wait(), STOP_S) == 0, node.log()[-2000:]
    assert all(multinode.refused(port, host) for node in nodes for host, port in node.own_ports)


def test_two_clusters_on_distinct_addresses_and_a_node_killed_mid_broadcast(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with two_clusters(tmp_path) as (alpha, beta, fake):
            await check_discovery(alpha, beta)
            async with agents_on(alpha + beta) as held:
                every = [a for made in held.values() for a in made]
                # Each agent is held by the node whose address it dialled.
                assert await multinode.holders(fake, every) == {
                    a.agent_id: name for name, made in held.items() for a in made
                }
                await check_commands(alpha, beta, held)
                await check_kill_mid_broadcast(alpha, held)
            await stop_all(alpha + beta)

    asyncio.run(asyncio.wait_for(body(), 80))
