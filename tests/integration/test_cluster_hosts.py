"""Hosts with different node counts form a full mesh (docs/cluster.md, "Hosts with different
node counts"; issue 22).

Three "hosts" on their own loopback addresses, each node its own `python -m gateway`, the same
configured ports on every address: X runs one node, Y three (node k of 3 on cluster port
+ k - 1, as `--nodes 3` starts them), both with the seed list `X, Y` (hosts, no ports). X dials
Y's first node only by its own count, learns from its challenge answer that Y runs three and
links to the other two; Y's nodes, which would dial three ports of X, learn that X runs one and
dial only it. (Before adverts X linked to Y's first node only, silently.) Z runs one node with
the seed list `Z, Y:<port>`, Y's first node by name: it is linked to that node alone, says that
Y's other two are not dialled, and counts them in `yuzu_gw_cluster_undialled_nodes`.

The challenge answer itself is checked on the real transport: a node that advertises nothing
(an older gateway) is linked as before, a forged advert is refused.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import empty_pb2

from gateway.cluster.auth import server_proof
from gateway.cluster.hosts import HostAdvert
from gateway.cluster.transport import (
    HOST_KEY,
    HOST_PROOF_KEY,
    NODE_KEY,
    NONCE_KEY,
    PROOF_KEY,
    ClusterServer,
    ClusterService,
    PeerLink,
)
from gateway.config.cluster_seeds import PeerAddr
from gateway.console.client import one_shot
from gateway.devstack.fake_upstream import FakeUpstream
from tests.integration import test_multinode as multinode
from tests.integration.test_cluster_processes import Ports, ProcNode, kill_all, proc_env, stop_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

X, Y, Z = "127.0.0.10", "127.0.0.11", "127.0.0.12"
Y_NODES = 3
FORM_S = 30.0
COOKIE = secrets.token_hex(32)
CALL_S = 5.0


def nodes_of(
    tmp_path: Path, ports: Ports, upstream: int, cookie: str
) -> tuple[ProcNode, list[ProcNode], ProcNode]:
    """X's node, Y's three, Z's node; each in a run directory of its own."""

    def node(addr: str, index: int, seeds: Sequence[str], **extra: str) -> ProcNode:
        home = tmp_path / f"{addr}-{index}"
        home.mkdir()
        # Y's config is written for its first node; boot offsets node k's ports by k - 1.
        at = index if addr != Y else 1
        env = proc_env(home, addr, at, ports, upstream=upstream, seeds=seeds, cookie=cookie)
        return ProcNode(addr, index, home / addr, dict(env, **extra), ports)

    hosts = [X, Y]
    x = node(X, 0, hosts)
    y = [
        node(
            Y,
            k,
            hosts,
            YUZU_GW_NODE_INDEX=str(k),
            YUZU_GW_NODE_COUNT=str(Y_NODES),
            YUZU_GW_REUSEPORT="1",
        )
        for k in range(1, Y_NODES + 1)
    ]
    z = node(Z, Y_NODES + 1, [Z, f"{Y}:{ports.cluster}"])
    return x, y, z


async def series(node: ProcNode, name: str) -> float | None:
    metrics = await node.metrics()
    return None if metrics is None else metrics.value(name)


async def settled(node: ProcNode, connected: int, resolved: int, undialled: int) -> None:
    async def there() -> bool:
        return [
            await series(node, "yuzu_gw_cluster_peers_connected"),
            await series(node, "yuzu_gw_cluster_peers_resolved"),
            await series(node, "yuzu_gw_cluster_undialled_nodes"),
        ] == [connected, resolved, undialled]

    await multinode.until(there, f"{node.addr} node {node.index}'s links", FORM_S)


def test_a_one_node_host_and_a_three_node_host_form_a_full_mesh(tmp_path: Path) -> None:
    if not all(multinode.bindable(0, addr) for addr in (X, Y, Z)):
        pytest.skip("the loopback addresses 127.0.0.10-12 cannot be bound here (not Linux)")

    async def body() -> None:
        every = (X, Y, Z)
        ports = Ports(
            agent=multinode.free_ports(1, every),
            mgmt=multinode.free_ports(1, every),
            cluster=multinode.free_ports(Y_NODES, every),
            health=multinode.free_ports(Y_NODES + 2),
            metrics=multinode.free_ports(Y_NODES + 2),
        )
        async with FakeUpstream() as fake:
            x, y, z = nodes_of(tmp_path, ports, fake.port, secrets.token_hex(32))
            nodes = [x, *y, z]
            try:
                await asyncio.gather(*(n.start() for n in nodes))
                # X: Y's three nodes. Y's: their two siblings and X's one node, not the two
                # ports X would have run at Y's count.
                await settled(x, connected=Y_NODES, resolved=Y_NODES, undialled=0)
                for node in y:
                    await settled(node, connected=Y_NODES, resolved=Y_NODES, undialled=0)
                # Z: the one node of Y its seed list names, and Y's two others counted.
                await settled(z, connected=1, resolved=1, undialled=Y_NODES - 1)
                first = ports.cluster
                gap = (
                    f"Cluster host {Y} advertises nodes on cluster ports"
                    f" {first}..{first + Y_NODES - 1}; this node does not dial"
                    f" {first + 1}..{first + Y_NODES - 1}"
                )
                assert z.log().count(gap) == 1, z.log()[-3000:]
                # The console's status of the cluster actor names them too.
                status = 'status("cluster")["undialled_nodes"]'
                console = z.run_dir / "yuzu_gw.console"
                reply = await one_shot(console, z.env["YUZU_GW_COOKIE"], "eval", status)
                assert reply["result"] == repr({Y: f"{first + 1}..{first + Y_NODES - 1}"})
                for node in (x, *y):
                    assert "advertises nodes" not in node.log()
                    assert "does not advertise" not in node.log()
                await stop_all(nodes)
            finally:
                await kill_all(nodes)

    asyncio.run(asyncio.wait_for(body(), 80))


class _ForgedAdvert(ClusterService):
    """A dialled node with the cookie whose host advert's proof does not match it."""

    async def _challenge(self, stream: Any) -> None:
        await stream.recv_message()
        client_nonce = stream.metadata[NONCE_KEY]
        nonce = self._nonces.issue()
        await stream.send_initial_metadata(
            metadata={
                NONCE_KEY: nonce,
                PROOF_KEY: server_proof(COOKIE, client_nonce, nonce, "yuzu_gw@forged"),
                NODE_KEY: "yuzu_gw@forged",
                HOST_KEY: HostAdvert(9100, 200).encode(),
                HOST_PROOF_KEY: "0" * 64,
            }
        )
        await stream.send_message(empty_pb2.Empty())


async def _challenge(service: ClusterService) -> tuple[str, HostAdvert | None]:
    server = ClusterServer(service)
    await server.start("127.0.0.1", 0)
    try:
        link = PeerLink(PeerAddr("127.0.0.1", server.bound_port(0)), COOKIE, "yuzu_gw@dialler")
        try:
            outcome = await link.challenge(CALL_S)
        finally:
            link.close()
        return outcome, link.peer_host
    finally:
        server.leave()
        await server.wait_closed()


def test_the_challenge_answer_carries_the_hosts_ports_proven() -> None:
    def service(advert: HostAdvert | None) -> ClusterService:
        made = ClusterService(COOKIE, "yuzu_gw@dialled", None, lambda: None)  # type: ignore[arg-type]
        made.advert = advert
        return made

    async def body() -> None:
        assert await _challenge(service(HostAdvert(9100, 3))) == ("up", HostAdvert(9100, 3))
        # An older gateway says nothing of its host: linked as before, nothing learned.
        assert await _challenge(service(None)) == ("up", None)
        forged = _ForgedAdvert(COOKIE, "yuzu_gw@forged", None, lambda: None)  # type: ignore[arg-type]
        assert await _challenge(forged) == ("refused", None)

    asyncio.run(asyncio.wait_for(body(), 30))
