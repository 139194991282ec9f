"""Mutual TLS on the cluster links (docs/cluster.md "Transport security"): the real
transport (gateway/cluster/transport.py) on loopback with the contexts of
gateway/config/cluster_tls.py. A peer with a leaf of the install CA links up; a peer whose
leaf is of another CA, or who presents none, fails the handshake and never reaches the cookie
check (the server counts no refusal); a plaintext dial to the TLS port gets nothing; the right
CA with a wrong cookie is still refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf import empty_pb2
from grpclib.exceptions import StreamTerminatedError

from actors.cluster.api import connected_links
from gateway.cluster.transport import ClusterServer, ClusterService, PeerLink
from gateway.config.cluster_seeds import PeerAddr
from gateway.config.cluster_tls import ClusterTls, LinkContexts, link_contexts
from gateway.config.refusal import BootRefused
from gateway.node.node import Node
from tests.integration.test_agent_plane import until
from tests.support.certs import CertAuthority
from tests.support.node import TEST_CONFIG, running_node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

COOKIE = secrets.token_hex(32)
CALL_S = 5.0
# What a refused handshake looks like to the dialler: its own verification failing, or (TLS 1.3,
# where the client's certificate is judged after the client finished) the connection dropped.
HANDSHAKE_REFUSED = (ssl.SSLError, OSError, StreamTerminatedError)


def node_tls(ca: CertAuthority, ca_path: Path, directory: Path, stem: str) -> LinkContexts:
    """The contexts of a node whose leaf `ca` issued and which trusts `ca_path`."""
    leaf = ca.issue(stem, ips=["127.0.0.1"]).write(directory, stem)
    contexts = link_contexts(ClusterTls(str(leaf.cert_path), str(leaf.key_path), str(ca_path)))
    assert contexts is not None
    return contexts


@contextlib.asynccontextmanager
async def dialled(tls: ssl.SSLContext) -> AsyncIterator[tuple[PeerAddr, list[int]]]:
    """A node's cluster server over TLS (Challenge and Ping need no plane), and its refusals."""
    refused = [0]

    def on_refused() -> None:
        refused[0] += 1

    service = ClusterService(COOKIE, "yuzu_gw@dialled", None, on_refused)  # type: ignore[arg-type]
    server = ClusterServer(service, tls)
    await server.serve("127.0.0.1", 0)
    try:
        yield PeerAddr("127.0.0.1", server.bound_port(0)), refused
    finally:
        server.leave()
        await server.wait_closed()


def test_only_a_leaf_of_the_install_ca_links_up(tmp_path: Path) -> None:
    asyncio.run(_links(tmp_path))


async def _links(tmp_path: Path) -> None:
    install, other = CertAuthority("Yuzu install"), CertAuthority("Someone else")
    install_ca, _ = install.write(tmp_path / "install")
    other_ca, _ = other.write(tmp_path / "other")
    server_tls = node_tls(install, install_ca, tmp_path, "dialled")
    async with dialled(server_tls.server) as (addr, refused):
        good = PeerLink(
            addr, COOKIE, "yuzu_gw@good", node_tls(install, install_ca, tmp_path, "a").client
        )
        try:
            assert await good.challenge(CALL_S) == "up"
            await good.unary("Ping", empty_pb2.Empty(), empty_pb2.Empty, CALL_S)
        finally:
            good.close()

        # A leaf of another CA that trusts the install CA: the server refuses its certificate.
        foreign = node_tls(other, install_ca, tmp_path, "foreign").client
        # A leaf of the install CA that trusts another CA: it refuses the server's certificate.
        distrustful = node_tls(install, other_ca, tmp_path, "distrustful").client
        # No certificate at all, the CA trusted.
        bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        bare.check_hostname = False
        bare.load_verify_locations(cafile=str(install_ca))
        bare.set_alpn_protocols(["h2"])
        # An agent's kind of leaf, of the install CA: clientAuth only, so not a gateway's.
        agent = install.issue("agent", server_auth=False).write(tmp_path, "agent")
        agent_like = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        agent_like.check_hostname = False
        agent_like.load_cert_chain(str(agent.cert_path), str(agent.key_path))
        agent_like.load_verify_locations(cafile=str(install_ca))
        agent_like.set_alpn_protocols(["h2"])
        for context in (foreign, distrustful, bare, agent_like):
            link = PeerLink(addr, COOKIE, "yuzu_gw@refused", context)
            try:
                with pytest.raises(HANDSHAKE_REFUSED):
                    await link.challenge(CALL_S)
            finally:
                link.close()

        # Plaintext HTTP/2 to the TLS port: the handshake never completes, no call is made.
        plain = PeerLink(addr, COOKIE, "yuzu_gw@plain")
        try:
            with pytest.raises((*HANDSHAKE_REFUSED, asyncio.TimeoutError)):
                await plain.challenge(CALL_S)
        finally:
            plain.close()

        # None of them reached the cookie check (a refusal is counted only there).
        assert refused[0] == 0
        # The cookie stays the second check: the right CA with a wrong cookie is refused.
        forger = PeerLink(
            addr, "w" * 64, "yuzu_gw@forger", node_tls(install, install_ca, tmp_path, "c").client
        )
        try:
            assert await forger.challenge(CALL_S) == "refused"
        finally:
            forger.close()
        # A node dialling its own address (its seed list names it) sees itself over TLS too.
        me = PeerLink(addr, COOKIE, "yuzu_gw@dialled", server_tls.client)
        try:
            assert await me.challenge(CALL_S) == "self"
        finally:
            me.close()
        # The good peer, again, after all that.
        again = PeerLink(
            addr, COOKIE, "yuzu_gw@good", node_tls(install, install_ca, tmp_path, "b").client
        )
        try:
            assert await again.challenge(CALL_S) == "up"
        finally:
            again.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tls_config(tmp_path: Path, name: str, port: int, seeds: list[int], files: ClusterTls) -> Path:
    """The test config with the cluster keys of a node of a loopback cluster over TLS."""
    named = ", ".join(f'<<"127.0.0.1:{p}">>' for p in seeds)
    text = (
        TEST_CONFIG.read_text()
        .replace("{cluster_seed_nodes, []}", f"{{cluster_seed_nodes, [{named}]}}")
        .replace("{cluster_redial_interval_ms, 5000}", "{cluster_redial_interval_ms, 100}")
        .replace(
            "{cluster_port, 0}",
            f'{{cluster_port, {port}}}, {{cluster_tls_certfile, "{files.certfile}"}},'
            f' {{cluster_tls_keyfile, "{files.keyfile}"}},'
            f' {{cluster_tls_cacertfile, "{files.cacertfile}"}}',
        )
    )
    path = tmp_path / f"{name}.config"
    path.write_text(text)
    return path


def test_two_nodes_link_over_tls_and_an_unusable_ca_refuses_boot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    asyncio.run(_nodes(tmp_path, caplog))


async def _nodes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    install = CertAuthority("Yuzu install")
    ca_path, _ = install.write(tmp_path / "install")
    ports = [free_port(), free_port()]
    cookie = secrets.token_hex(32)
    async with contextlib.AsyncExitStack() as stack:
        nodes: list[Node] = []
        for n, port in enumerate(ports):
            leaf = install.issue(f"node{n}", ips=["127.0.0.1"]).write(tmp_path, f"node{n}")
            files = ClusterTls(str(leaf.cert_path), str(leaf.key_path), str(ca_path))
            config = tls_config(tmp_path, f"node{n}", port, ports, files)
            run_dir = tmp_path / f"node{n}"
            run_dir.mkdir()
            env = {"YUZU_GW_CONFIG": str(config), "YUZU_GW_COOKIE": cookie}
            nodes.append(await stack.enter_async_context(running_node(run_dir, **env)))
        await until(lambda: all(_peers(node) == 1 for node in nodes), "the TLS links", 15.0)
    assert not [r for r in caplog.records if "Cluster links are plaintext" in r.getMessage()]

    # A CA file that is not PEM: the cluster child cannot start, so neither can the node.
    bad_ca = tmp_path / "bad-ca.pem"
    bad_ca.write_text("not a certificate\n")
    leaf = install.issue("node2").write(tmp_path, "node2")
    files = ClusterTls(str(leaf.cert_path), str(leaf.key_path), str(bad_ca))
    config = tls_config(tmp_path, "node2", 0, [], files)
    run_dir = tmp_path / "node2"
    run_dir.mkdir()
    with pytest.raises(BootRefused) as refused:
        async with running_node(run_dir, YUZU_GW_CONFIG=str(config)):
            pass
    assert refused.value.term == "start_failed"
    lines = [
        r.getMessage() for r in caplog.records if "Cluster transport cannot start" in r.getMessage()
    ]
    assert len(lines) == 1 and "{cluster_tls_unusable,cacertfile}" in lines[0]
    assert str(bad_ca) in lines[0] and str(leaf.key_path) not in lines[0]


def _peers(node: Node) -> int:
    assert node.runtime is not None
    return len(connected_links(node.runtime))
