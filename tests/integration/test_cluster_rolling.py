"""A rolling planned stop of a three-node cluster under load (issue 22; docs/cluster.md, "What an
operator sees"): three `python -m gateway` processes on their own loopback addresses, one
cookie; each node in turn is stopped (SIGTERM: the planned stop) while an operator on another
node sends a stream of commands, each to every agent by id or as a broadcast; the stopped node's
agents then register on the third node, as they would through a balancer, and the node starts
again. Every answer must be the truth: an agent that ran a command is never reported failed,
and an agent of a node that is not stopping answers SUCCESS to every command.

Each agent answers SUCCESS as soon as a command reaches it and records that it ran it, so a
FAILURE or TIMEOUT for a command the agent ran is a lie of the cluster's. Before the agent
directory, the stopping node refused the routes forwarded to it for the other nodes' agents
with `agent_disconnected`, and that refusal was taken as their answer. So that the stopping
node's router is in its stop for long enough to be asked, a `hold-` command its agents answer
RUNNING only is in flight on it when the stop begins (the router then waits up to its 3 s
grace, refusing, seed "Planned stop" step 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import grpc
import pytest

from gateway.devstack.fake_upstream import FakeUpstream
from gateway.mgmt.command import NODE_UNREACHABLE
from protos.yuzu.agent.v1 import agent_pb2
from tests.integration import test_multinode as multinode
from tests.integration.test_cluster_processes import Ports, ProcNode, kill_all, proc_env
from tests.integration.test_management_plane import collect, command, operator
from tests.integration.test_multinode import Agent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(110)]

S = agent_pb2.CommandResponse.Status
ADDRS = ("127.0.0.7", "127.0.0.8", "127.0.0.9")
AGENTS_PER_NODE = 2
FORM_S = 30.0
STOP_S = 30.0
COMMAND_TIMEOUT_S = 10
# A command the agents answer RUNNING only: it keeps a stopping router in its grace.
HOLD = "hold-"


class Responder:
    """One agent id: whichever node holds it, it answers every command SUCCESS at once and
    records that it ran it."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.ran: set[str] = set()
        self.agent: Agent | None = None
        self.task: asyncio.Task[None] | None = None

    async def attach(self, node: ProcNode) -> None:
        await self.detach()
        self.agent = Agent(node.ports.agent, self.agent_id, node.addr)
        await self.agent.connect()
        self.task = asyncio.create_task(self._serve(self.agent))

    async def _serve(self, agent: Agent) -> None:
        stream = agent.stream
        assert stream is not None
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            while (request := await stream.read()) is not grpc.aio.EOF:
                held = request.command_id.startswith(HOLD)
                if not held:
                    self.ran.add(request.command_id)
                await stream.write(
                    agent_pb2.CommandResponse(
                        command_id=request.command_id,
                        status=S.RUNNING if held else S.SUCCESS,
                        output="ran",
                    )
                )

    async def detach(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.agent is not None:
            await self.agent.close()
        self.agent = self.task = None


@attrs.define
class Sent:
    command_id: str
    broadcast: bool
    answers: dict[str, tuple[int, str]]
    lines: list[str]  # the node_unreachable lines' nodes


@contextlib.asynccontextmanager
async def three_nodes(tmp_path: Path) -> AsyncIterator[list[ProcNode]]:
    if not all(multinode.bindable(0, addr) for addr in ADDRS):
        pytest.skip("the loopback addresses 127.0.0.7-9 cannot be bound here (not Linux)")
    ports = Ports(
        agent=multinode.free_ports(1, ADDRS),
        mgmt=multinode.free_ports(1, ADDRS),
        cluster=multinode.free_ports(1, ADDRS),
        health=multinode.free_ports(len(ADDRS)),
        metrics=multinode.free_ports(len(ADDRS)),
    )
    cookie = secrets.token_hex(32)
    nodes: list[ProcNode] = []
    async with FakeUpstream() as fake:
        try:
            for index, addr in enumerate(ADDRS):
                env = proc_env(
                    tmp_path, addr, index, ports, upstream=fake.port, seeds=ADDRS, cookie=cookie
                )
                nodes.append(ProcNode(addr, index, tmp_path / addr, env, ports))
            await asyncio.gather(*(node.start() for node in nodes))
            await formed(nodes)
            yield nodes
        finally:
            await kill_all(nodes)


async def formed(nodes: list[ProcNode]) -> None:
    for node in nodes:

        async def linked(node: ProcNode = node) -> bool:
            return await node.peers() == len(nodes) - 1

        await multinode.until(linked, f"{node.name} in the cluster", FORM_S)


async def knows(node: ProcNode, count: int) -> None:
    """Until `node`'s directory places `count` agents on its peers."""

    async def placed() -> bool:
        metrics = await node.metrics()
        return metrics is not None and metrics.value("yuzu_gw_cluster_directory_agents") == count

    await multinode.until(placed, f"{node.name}'s directory of {count} agents", FORM_S)


async def send_until(
    origin: ProcNode, ids: tuple[str, ...], prefix: str, stop: asyncio.Event
) -> list[Sent]:
    """Commands one after another from `origin`, alternately to every agent by id and as a
    broadcast, until `stop`."""
    sent: list[Sent] = []
    async with operator(origin.mgmt) as op:
        n = 0
        while not stop.is_set():
            n += 1
            cid = f"{prefix}-{n}"
            broadcast = n % 2 == 0
            responses, code = await collect(
                op.send(command(cid), () if broadcast else ids, COMMAND_TIMEOUT_S)
            )
            assert code is grpc.StatusCode.OK
            answers, lines = {}, []
            for r in responses:
                if not r.agent_id:
                    assert r.response.error.code == NODE_UNREACHABLE
                    lines.append(r.response.error.metadata["node"])
                elif r.response.status != S.RUNNING:
                    assert r.agent_id not in answers, "two terminal answers"
                    answers[r.agent_id] = (r.response.status, r.response.output)
            sent.append(Sent(cid, broadcast, answers, lines))
    return sent


def check_truth(sent: list[Sent], responders: list[Responder], steady: set[str]) -> None:
    """No agent that ran a command is reported failed (or missing); every `steady` agent (on a
    node not stopping) answers SUCCESS to every command."""
    by_id = {r.agent_id: r for r in responders}
    for one in sent:
        for agent_id, (status, output) in one.answers.items():
            ran = one.command_id in by_id[agent_id].ran
            assert (status == S.SUCCESS) == ran, (one.command_id, agent_id, status, output)
        for responder in responders:
            if one.command_id in responder.ran:
                assert one.answers.get(responder.agent_id, (None,))[0] == S.SUCCESS
        for agent_id in steady:
            assert one.answers.get(agent_id) == (S.SUCCESS, "ran"), (one.command_id, agent_id)


def test_a_rolling_planned_stop_reports_every_command_truthfully(tmp_path: Path) -> None:
    async def body() -> None:
        async with three_nodes(tmp_path) as nodes:
            responders = {
                node.addr: [Responder(f"agent-{node.addr}-{n}") for n in range(AGENTS_PER_NODE)]
                for node in nodes
            }
            home = {r.agent_id: node for node in nodes for r in responders[node.addr]}
            every = [r for made in responders.values() for r in made]
            try:
                for r in every:
                    await r.attach(home[r.agent_id])
                for node in nodes:
                    others = sum(1 for r in every if home[r.agent_id] is not node)
                    await knows(node, others)
                ids = tuple(r.agent_id for r in every)
                for k, stopping in enumerate(nodes):
                    origin, refuge = nodes[(k + 1) % 3], nodes[(k + 2) % 3]
                    moving = [r for r in every if home[r.agent_id] is stopping]
                    steady = {r.agent_id for r in every if home[r.agent_id] is not stopping}
                    stop = asyncio.Event()
                    load = asyncio.create_task(send_until(origin, ids, f"r{k}", stop))
                    async with operator(stopping.mgmt) as holder:
                        hold = holder.send(
                            command(f"{HOLD}{k}"), tuple(r.agent_id for r in moving), 60
                        )
                        for _ in moving:
                            running = await asyncio.wait_for(hold.read(), 10)
                            assert running.response.status == S.RUNNING
                        await asyncio.sleep(0.5)
                        assert stopping.proc is not None
                        stopping.proc.send_signal(signal.SIGTERM)
                        assert await asyncio.wait_for(stopping.proc.wait(), STOP_S) == 0
                        hold.cancel()
                    # Its agents register on the third node, as through a balancer.
                    for r in moving:
                        await r.attach(refuge)
                        home[r.agent_id] = refuge
                    await knows(origin, sum(1 for r in every if home[r.agent_id] is not origin))
                    await asyncio.sleep(0.5)
                    stop.set()
                    sent = await load
                    assert len(sent) >= 4
                    check_truth(sent, every, steady)
                    # The moved agents are reached on their new node by the end.
                    assert all(sent[-1].answers[r.agent_id][0] == S.SUCCESS for r in moving)
                    await stopping.start()
                    await formed(nodes)
            finally:
                for r in every:
                    await r.detach()

    asyncio.run(asyncio.wait_for(body(), 105))
