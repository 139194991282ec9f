"""The cluster (issue 9 sections 2 and 3; docs/cluster.md): nodes in one test process, each on
its own loopback cluster port, find each other from a seed list that names every node (itself
included), and the management plane of any node reaches every node's agents."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from actors.cluster.api import CLUSTER_NAME, connected_links, directory_of
from actors.registry.api import held_agent_ids
from actors.upstream.api import upstream_channel
from gateway.cluster.transport import PeerLink
from gateway.config.cluster_seeds import PeerAddr
from gateway.devstack.fake_upstream import FakeUpstream
from gateway.node.node import Node
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2 as mgmt
from supervisors.api import terminate_child
from tests.integration.test_agent_plane import Agent, Metrics, agents, run, until
from tests.integration.test_management_plane import (
    answers,
    collect,
    command,
    connect,
    operator,
    reply,
)
from tests.support.node import TEST_CONFIG, running_node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Code = grpc.StatusCode
S = agent_pb2.CommandResponse.Status
FORM_S = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def peers(node: Node) -> int:
    assert node.runtime is not None
    return len(connected_links(node.runtime))


@contextlib.asynccontextmanager
async def cluster(
    tmp_path: Path,
    count: int,
    cookies: Sequence[str] | None = None,
    seeds_of: Callable[[int, list[int]], list[str]] | None = None,
) -> AsyncIterator[list[Node]]:
    """`count` nodes sharing one fake server, seeded with every node's cluster address (or
    node n with `seeds_of(n, ports)`), and (with one cookie for all) connected to each other
    before the test starts."""
    ports = [free_port() for _ in range(count)]
    shared = secrets.token_hex(32)
    async with FakeUpstream() as fake, contextlib.AsyncExitStack() as stack:
        upstream = (
            "{upstream_client, #{channels => [{default_channel,"
            f' [{{http, "127.0.0.1", {fake.port}, []}}], #{{}}}}]}}}}'
        )
        nodes: list[Node] = []
        for n, port in enumerate(ports):
            named = seeds_of(n, ports) if seeds_of else [f"127.0.0.1:{p}" for p in ports]
            seeds = ", ".join(f'<<"{seed}">>' for seed in named)
            text = TEST_CONFIG.read_text().replace("{allow_no_upstream, true}", upstream)
            text = text.replace("{cluster_seed_nodes, []}", f"{{cluster_seed_nodes, [{seeds}]}}")
            text = text.replace(
                "{cluster_redial_interval_ms, 5000}", "{cluster_redial_interval_ms, 100}"
            ).replace("{cluster_port, 0}", f"{{cluster_port, {port}}}")
            run_dir = tmp_path / f"node{n}"
            run_dir.mkdir()
            config = run_dir / "cluster.config"
            config.write_text(text)
            cookie = cookies[n] if cookies else shared
            node = await stack.enter_async_context(
                running_node(run_dir, YUZU_GW_CONFIG=str(config), YUZU_GW_COOKIE=cookie)
            )
            nodes.append(node)
        for node in nodes:
            assert node.runtime is not None
            channel = upstream_channel(node.runtime)
            await until(
                lambda c=channel: c is not None and c.live_connections() == 1,  # type: ignore[attr-defined]
                "the upstream connection",
            )
        if cookies is None:
            await until(
                lambda: all(peers(node) == count - 1 for node in nodes), "the cluster", FORM_S
            )
        for node in nodes:
            _MEMBERS[id(node)] = nodes
        try:
            yield nodes
        finally:
            for node in nodes:
                _MEMBERS.pop(id(node), None)


# Each node of a running `cluster` -> all its nodes (for `hold`).
_MEMBERS: dict[int, list[Node]] = {}


def knows(node: Node, agent_id: str) -> bool:
    """Whether `node`'s agent directory places `agent_id` on a peer."""
    assert node.runtime is not None
    directory = directory_of(node.runtime)
    return directory is not None and bool(directory.candidates(agent_id))


async def hold(node: Node, agent: Agent, agent_id: str) -> grpc.aio.StreamStreamCall:
    """The agent's stream on `node`, once every other node of its cluster knows it is there
    (a join reaches the peers within a directory scan and a hop; docs/cluster.md)."""
    stream = await connect(node, agent, agent_id)
    others = [n for n in _MEMBERS.get(id(node), []) if n is not node]
    await until(lambda: all(knows(n, agent_id) for n in others), f"{agent_id} in the directory")
    return stream


def test_commands_reach_an_agent_whichever_node_holds_it(tmp_path: Path) -> None:
    async def body() -> None:
        async with (
            cluster(tmp_path, 2) as [a, b],
            agents(a) as [agent_a],
            agents(b) as [agent_b],
            operator(a) as op_a,
            operator(b) as op_b,
        ):
            stream_a = await hold(a, agent_a, "agent-a")
            stream_b = await hold(b, agent_b, "agent-b")
            for op, stream, agent_id, cid in (
                (op_a, stream_b, "agent-b", "c1"),
                (op_b, stream_a, "agent-a", "c2"),
            ):
                call = op.send(command(cid), (agent_id,), 30)
                # The command crosses untouched: parameters, payload and dispatch_tag.
                assert await asyncio.wait_for(stream.read(), 5) == command(cid)
                await reply(stream, cid, S.RUNNING)
                # Frames stream back as they come, not at the end.
                running = await asyncio.wait_for(call.read(), 5)
                assert answers([running]) == [(agent_id, S.RUNNING, f"s{S.RUNNING}")]
                await reply(stream, cid, S.SUCCESS)
                responses, code = await collect(call)
                assert code is Code.OK
                assert answers(responses) == [(agent_id, S.SUCCESS, f"s{S.SUCCESS}")]
            # not_connected only when no node holds the agent; a mixed request gets both.
            call = op_a.send(command("c3"), ("ghost", "agent-b"), 30)
            assert await asyncio.wait_for(stream_b.read(), 5) == command("c3")
            await reply(stream_b, "c3", S.SUCCESS)
            responses, code = await collect(call)
            assert code is Code.OK
            assert sorted(answers(responses)) == [
                ("agent-b", S.SUCCESS, f"s{S.SUCCESS}"),
                ("ghost", S.FAILURE, "not_connected"),
            ]

            # ListAgents and GetAgent cover the cluster, from either node.
            for op in (op_a, op_b):
                page = await op.unary(
                    "ListAgents", mgmt.ListAgentsRequest(limit=1), mgmt.ListAgentsResponse
                )
                assert ([s.agent_id for s in page.agents], page.next_cursor) == (
                    ["agent-a"],
                    "agent-a",
                )
                rest = await op.unary(
                    "ListAgents",
                    mgmt.ListAgentsRequest(cursor="agent-a", limit=5),
                    mgmt.ListAgentsResponse,
                )
                assert ([s.agent_id for s in rest.agents], rest.next_cursor) == (["agent-b"], "")
            got = await op_a.unary(
                "GetAgent", mgmt.GetAgentRequest(agent_id="agent-b"), mgmt.GetAgentResponse
            )
            assert got.summary.agent_id == "agent-b" and got.summary.online
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await op_a.unary(
                    "GetAgent", mgmt.GetAgentRequest(agent_id="ghost"), mgmt.GetAgentResponse
                )
            assert missing.value.code() is Code.NOT_FOUND

            metrics = await Metrics.read(a)
            # The seed list names both nodes; a node is not its own peer.
            assert metrics.value("yuzu_gw_cluster_peers_resolved") == 1
            assert metrics.value("yuzu_gw_cluster_peers_connected") == 1

    run(body)


def test_a_broadcast_and_a_watch_cover_three_nodes(tmp_path: Path) -> None:
    async def body() -> None:
        async with (
            cluster(tmp_path, 3) as nodes,
            contextlib.AsyncExitStack() as stack,
        ):
            a = nodes[0]
            op = await stack.enter_async_context(operator(a))
            watch = op.watch()
            # The watch reaches the peers: wait until each has its watcher, then connect.
            for node in nodes[1:]:
                assert node.runtime is not None
                runtime = node.runtime
                await until(lambda r=runtime: len(r.table("agent_watchers") or ()) == 1, "watch")
            streams = {}
            for n, node in enumerate(nodes):
                [agent] = await stack.enter_async_context(agents(node))
                streams[f"agent-{n}"] = await hold(node, agent, f"agent-{n}")
            seen = set()
            while len(seen) < 3:
                event = await asyncio.wait_for(watch.read(), 5)
                if event.WhichOneof("event") == "connected":
                    seen.add(event.agent_id)
            assert seen == set(streams)
            watch.cancel()

            call = op.send(command("b1"), ())
            for stream in streams.values():
                assert await asyncio.wait_for(stream.read(), 5) == command("b1")
                await reply(stream, "b1", S.SUCCESS)
            responses, code = await collect(call)
            assert code is Code.OK
            assert sorted(answers(responses)) == [
                (agent_id, S.SUCCESS, f"s{S.SUCCESS}") for agent_id in sorted(streams)
            ]

    run(body)


def test_a_node_that_leaves_mid_broadcast_yields_agent_disconnected(tmp_path: Path) -> None:
    async def body() -> None:
        async with (
            cluster(tmp_path, 3) as [a, b, c],
            agents(b) as [agent_b],
            agents(c) as [agent_c],
            operator(a) as op,
        ):
            stream_b = await hold(b, agent_b, "agent-b")
            stream_c = await hold(c, agent_c, "agent-c")
            call = op.send(command("k1"), (), 60)
            for stream in (stream_b, stream_c):
                assert await asyncio.wait_for(stream.read(), 5) == command("k1")
            await reply(stream_b, "k1", S.SUCCESS)
            # c leaves the cluster with the command in flight (its transport closes).
            assert c.runtime is not None and c.root is not None
            await terminate_child(c.runtime, c.root, CLUSTER_NAME)
            async with asyncio.timeout(10):  # never the 60 s timeout: no hang
                responses, code = await collect(call)
            assert code is Code.OK
            assert sorted(answers(responses)) == [
                ("agent-b", S.SUCCESS, f"s{S.SUCCESS}"),
                ("agent-c", S.FAILURE, "agent_disconnected"),
            ]
            await until(lambda: peers(a) == 1, "a to drop c", FORM_S)
            # c's agent is known to be on a node a cannot reach: the retryable `unavailable`,
            # never `not_connected`.
            responses, _ = await collect(op.send(command("k2"), ("agent-c",), 30))
            assert answers(responses) == [("agent-c", S.FAILURE, "unavailable")]

    run(body)


def test_a_peer_with_another_cookie_is_refused(tmp_path: Path) -> None:
    async def body() -> None:
        cookies = [secrets.token_hex(32), secrets.token_hex(32)]
        async with cluster(tmp_path, 2, cookies) as [a, b], operator(a) as op:
            # Several rounds (100 ms each): every dial is refused, on both sides.
            await asyncio.sleep(0.5)
            assert (peers(a), peers(b)) == (0, 0)
            metrics = await Metrics.read(a)
            assert metrics.value("yuzu_gw_cluster_peers_resolved") == 1
            assert metrics.value("yuzu_gw_cluster_peers_connected") == 0
            assert metrics.value("yuzu_gw_cluster_auth_refused_total") >= 1
            before = (await Metrics.read(b)).value("yuzu_gw_cluster_auth_refused_total")
            # A call signed with the wrong cookie is refused before its request is read.
            port = b.ctx.bound["cluster"][1]
            link = PeerLink(PeerAddr("127.0.0.1", port), cookies[0], "intruder")
            try:
                assert await link.challenge(5) == "refused"
                link._server_nonce = "0" * 32  # forge a link past the challenge
                with pytest.raises(GRPCError) as refused:
                    await link.unary("Ping", empty_pb2.Empty(), empty_pb2.Empty, 5)
                assert refused.value.status is Status.UNAUTHENTICATED
            finally:
                link.close()
            after = (await Metrics.read(b)).value("yuzu_gw_cluster_auth_refused_total")
            assert after >= before + 1
            # Each node still serves alone (fail-open): a command is answered at once.
            responses, code = await collect(op.send(command("w1"), ("ghost",), 30))
            assert (answers(responses), code) == ([("ghost", S.FAILURE, "not_connected")], Code.OK)

    run(body)


def test_dns_discovery_that_finds_only_this_node_serves_alone(tmp_path: Path) -> None:
    async def body() -> None:
        port = free_port()
        text = (
            TEST_CONFIG.read_text()
            .replace("{cluster_redial_interval_ms, 5000}", "{cluster_redial_interval_ms, 100}")
            .replace("{cluster_port, 0}", f"{{cluster_port, {port}}}")
        )
        config = tmp_path / "dns.config"
        config.write_text(text)
        # test.config's seed name is localhost: its A record is this node's own address.
        async with running_node(tmp_path, YUZU_GW_CONFIG=str(config)) as node:
            await until(lambda: "cluster" in node.ctx.bound, "the cluster transport")
            # On the node name's host only, never every interface.
            assert node.ctx.bound["cluster"] == ("127.0.0.1", port)
            await asyncio.sleep(0.3)  # a few rounds: it dialled itself and knows it
            metrics = await Metrics.read(node)
            assert metrics.value("yuzu_gw_cluster_peers_resolved") == 0
            assert metrics.value("yuzu_gw_cluster_peers_connected") == 0
            assert peers(node) == 0

    run(body)


def test_a_cluster_port_taken_at_boot_leaves_the_node_serving_and_is_bound_once_free(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Fail-open (seed: "Gateway Clustering"): a transport that cannot listen is a reason to
    serve alone, never an agent-facing outage; the node tries again every round."""
    caplog.set_level(logging.WARNING, logger="yuzu_gw.cluster")

    async def body() -> None:
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with FakeUpstream() as fake:
            upstream = (
                "{upstream_client, #{channels => [{default_channel,"
                f' [{{http, "127.0.0.1", {fake.port}, []}}], #{{}}}}]}}}}'
            )
            text = (
                TEST_CONFIG.read_text()
                .replace("{allow_no_upstream, true}", upstream)
                .replace("{cluster_redial_interval_ms, 5000}", "{cluster_redial_interval_ms, 100}")
                .replace("{cluster_port, 0}", f"{{cluster_port, {port}}}")
            )
            config = tmp_path / "taken.config"
            config.write_text(text)
            try:
                async with running_node(tmp_path, YUZU_GW_CONFIG=str(config)) as node:
                    await asyncio.sleep(0.3)  # a few rounds, each trying the port again
                    assert "cluster" not in node.ctx.bound
                    # The node serves meanwhile: an agent registers and subscribes.
                    async with agents(node, 1) as [agent]:
                        stream = await hold(node, agent, "agent-alone")
                        assert node.runtime is not None
                        assert held_agent_ids(node.runtime) == ["agent-alone"]
                        stream.cancel()
                    lines = [r.getMessage() for r in caplog.records if "cannot" in r.getMessage()]
                    # Rate-limited: not a line a round (a round is 100 ms here).
                    assert 1 <= len(lines) <= 3, lines
                    assert lines[0] == (
                        f"Cluster transport cannot listen on 127.0.0.1:{port} (OSError);"
                        " serving alone, trying again every round"
                    )
                    taken.close()
                    await until(lambda: "cluster" in node.ctx.bound, "the port bound once free")
                    assert node.ctx.bound["cluster"] == ("127.0.0.1", port)
            finally:
                taken.close()

    run(body)
