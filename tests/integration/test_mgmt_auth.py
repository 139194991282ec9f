"""Management peer authorisation on the wire: a real TLS listener built the way gateway_sup
builds it (the certificate watcher, then the listener with the peer gate), grpcio clients
presenting certificates generated here, one for every reason.

The ManagementService handler here is a stand-in that answers ListAgents and counts its calls,
so each assertion says both what the client saw (OK or UNAUTHENTICATED) and whether the handler
ran; the counters are read from the node's registry."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpclib.const import Cardinality, Handler
from prometheus_client import CollectorRegistry

from gateway.config.context import NodeContext
from gateway.config.keys import SCHEMA
from gateway.config.resolve import resolve_section
from gateway.config.terms import parse_term
from gateway.config.vm_args import CookieSource, NodeArgs
from gateway.listeners.tree import listener_child_specs
from gateway.mgmt.auth.gate import REFUSED_MESSAGE
from gateway.mgmt.auth.tree import mgmt_auth_tree
from protos.yuzu.server.v1 import management_pb2
from supervisors.supervisor import Supervisor, SupFlags, SupSpec
from tests.support.actors import Harness, run
from tests.support.certs import CertAuthority, Leaf, server_identity, spki_sha256_hex
from tests.support.node import running_node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

LIST_AGENTS = "/yuzu.server.v1.ManagementService/ListAgents"
MODULE = "test_mgmt_service"
REFRESH_MS = 100


class StandInMgmt:
    """Routes ListAgents only; counts the calls that reached it."""

    def __init__(self) -> None:
        self.calls = 0

    async def list_agents(self, stream: Any) -> None:
        self.calls += 1
        await stream.recv_message()
        await stream.send_message(management_pb2.ListAgentsResponse())

    def __mapping__(self) -> dict[str, Handler]:
        return {
            LIST_AGENTS: Handler(
                self.list_agents,
                Cardinality.UNARY_UNARY,
                management_pb2.ListAgentsRequest,
                management_pb2.ListAgentsResponse,
            )
        }


class _Root(Supervisor):
    def supervisor_spec(self, args: Any) -> SupSpec:
        return SupSpec(SupFlags("one_for_one", 3, 5.0), args)


class Pki:
    """The install CA, the gateway's listener leaf, and leaves for every kind of peer."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = CertAuthority("Yuzu Install CA")
        self.ca_path, _ = self.ca.write(directory)
        self.listener = self.ca.issue(
            "yuzu-gateway", dns=["localhost"], ips=["127.0.0.1"], client_auth=False
        ).write(directory, "gateway")
        self.identity = server_identity(self.ca)
        self.server = self.leaf("server", uris=[self.identity], serial=0x0A1B2C)

    def leaf(self, stem: str, **kw: Any) -> Leaf:
        return self.ca.issue(f"yuzu-{stem}", **kw).write(self.dir, stem)


class Gateway:
    def __init__(self, h: Harness, ctx: NodeContext, handler: StandInMgmt, pki: Pki) -> None:
        self.h, self.ctx, self.handler, self.pki = h, ctx, handler, pki
        self.port = ctx.bound["listener_mgmt"][1]

    def metric(self, metric: str, labels: dict[str, str] | None = None) -> float:
        value = self.ctx.registry.get_sample_value(metric, labels or {})
        return 0.0 if value is None else value

    def rejected(self, reason: str) -> float:
        return self.metric("yuzu_gw_mgmt_auth_rejected_total", {"reason": reason})

    def admitted(self, method: str) -> float:
        return self.metric("yuzu_gw_mgmt_auth_admitted_total", {"method": method})

    @contextlib.asynccontextmanager
    async def client(self, leaf: Leaf | None) -> AsyncIterator[grpc.aio.Channel]:
        creds = grpc.ssl_channel_credentials(
            root_certificates=self.pki.ca.cert_pem,
            private_key=leaf.key_pem if leaf is not None else None,
            certificate_chain=leaf.cert_pem if leaf is not None else None,
        )
        chan = grpc.aio.secure_channel(
            f"localhost:{self.port}", creds, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        try:
            yield chan
        finally:
            await chan.close()

    async def call(self, leaf: Leaf | None) -> grpc.StatusCode:
        """ListAgents with `leaf` as the client certificate: the status on the wire."""
        async with self.client(leaf) as chan:
            return await _status(chan)

    async def refused_as(self, leaf: Leaf | None, reason: str) -> None:
        before, calls = self.rejected(reason), self.handler.calls
        assert await self.call(leaf) is grpc.StatusCode.UNAUTHENTICATED
        assert self.rejected(reason) == before + 1, reason
        assert self.handler.calls == calls  # the handler never ran

    async def admitted_by(self, leaf: Leaf, method: str) -> None:
        before, calls = self.admitted(method), self.handler.calls
        assert await self.call(leaf) is grpc.StatusCode.OK
        assert self.admitted(method) == before + 1
        assert self.handler.calls == calls + 1


async def _status(chan: grpc.aio.Channel) -> grpc.StatusCode:
    stub = chan.unary_unary(
        LIST_AGENTS,
        request_serializer=management_pb2.ListAgentsRequest.SerializeToString,
        response_deserializer=management_pb2.ListAgentsResponse.FromString,
    )
    try:
        await stub(management_pb2.ListAgentsRequest(limit=1), timeout=5)
    except grpc.aio.AioRpcError as error:
        if error.code() is grpc.StatusCode.UNAUTHENTICATED:
            assert error.details() == REFUSED_MESSAGE  # the reason stays on the gateway
        return error.code()
    return grpc.StatusCode.OK


def start(
    h: Harness, pki: Pki, settings: str, *, cacertfile: Path | None = None, tls: str = ""
) -> Gateway:
    entry = (
        "#{name => mgmt, service_protos => [management_pb],"
        f" services => #{{'yuzu.server.v1.ManagementService' => {MODULE}}},"
        " listen => #{port => 0, ip => {127,0,0,1}},"
        f' tls => #{{certfile => "{pki.listener.cert_path}", keyfile => "{pki.listener.key_path}",'
        f' cacertfile => "{cacertfile or pki.ca_path}"{tls}}}}}'
    )
    term = parse_term(
        f"[{{allow_no_listeners, true}}, {{mgmt_pin_refresh_ms, {REFRESH_MS}}},"
        f" {{grpc_listeners, [{entry}]}}{', ' + settings if settings else ''}]."
    )
    config = resolve_section(SCHEMA, term, {})
    node = NodeArgs("gw@127.0.0.1", "test", "x" * 32, CookieSource.ENV, (), "vm.args")
    ctx = NodeContext(config, node, pki.dir, registry=CollectorRegistry())
    handler = StandInMgmt()
    auth = mgmt_auth_tree(ctx)
    listeners = listener_child_specs(ctx, {MODULE: handler}, peer_gate=auth.gate)
    h.create(_Root, (auth.watcher, *listeners))
    return Gateway(h, ctx, handler, pki)


def mgmt_test(body: Any) -> None:
    run(body, timeout=45.0)


async def wait_for(predicate: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(REFRESH_MS / 4000)


# -- pin mode --------------------------------------------------------------------------------------


def test_pin_mode_rotation_through_the_pin_file_and_last_known_good(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    pin_file = tmp_path / "pinned-server.pem"
    pin_file.write_bytes(pki.server.cert_pem)
    other = pki.leaf("other-server")  # serverAuth, from the install CA, another key
    agent = pki.leaf("agent", uris=[f"yuzu://{pki.ca.fingerprint_hex}/agent/1"], server_auth=False)

    async def body(h: Harness) -> None:
        gw = start(h, pki, f'{{mgmt_peer_pins, [{{cert_file, "{pin_file}"}}]}}')
        await gw.admitted_by(pki.server, "pin")
        await gw.refused_as(other, "pin_mismatch")
        await gw.refused_as(agent, "missing_server_auth_eku")
        assert gw.metric("yuzu_gw_mgmt_pin_rotated_timestamp_seconds") == 0
        # The server rotates its leaf (a new key) at the pinned path.
        rotated = pki.leaf("rotated-server", uris=[pki.identity])
        pin_file.write_bytes(rotated.cert_pem)
        began = time.time()

        async def new_key_admitted() -> bool:
            return await gw.call(rotated) is grpc.StatusCode.OK

        await wait_for(new_key_admitted, "the rotated key")
        assert gw.metric("yuzu_gw_mgmt_pin_rotated_timestamp_seconds") >= began - 1
        await gw.refused_as(pki.server, "pin_mismatch")  # the old key, from then on
        # Deleting the pin file does not revoke the key last read from it.
        pin_file.unlink()
        labels = {"role": "mgmt_peer_pin", "name": str(pin_file)}

        async def unreadable() -> bool:
            return gw.metric("yuzu_gw_cert_file_readable", labels) == 0

        await wait_for(unreadable, "the pin file read as unreadable")
        await gw.admitted_by(rotated, "pin")
        assert gw.metric("yuzu_gw_cert_expiry_timestamp_seconds", labels) == (
            rotated.cert.not_valid_after_utc.timestamp()
        )

    mgmt_test(body)


def test_a_pin_file_never_readable_fails_closed_until_it_appears(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    pin_file = tmp_path / "not-yet.pem"

    async def body(h: Harness) -> None:
        gw = start(h, pki, f'{{mgmt_peer_pins, [{{cert_file, "{pin_file}"}}]}}')
        await gw.refused_as(pki.server, "no_pins_resolved")
        assert gw.metric("yuzu_gw_mgmt_auth_pin_unresolved_total") >= 1
        pin_file.write_bytes(pki.server.cert_pem)

        async def admitted() -> bool:
            return await gw.call(pki.server) is grpc.StatusCode.OK

        await wait_for(admitted, "the pin file to be read")

    mgmt_test(body)


def test_a_literal_spki_pin_and_the_deny_list(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    renewed = pki.leaf("renewed", key=pki.server.key, serial=0x77)  # same key, new serial

    async def body(h: Harness) -> None:
        gw = start(
            h,
            pki,
            f'{{mgmt_peer_pins, [{{spki_sha256, "{spki_sha256_hex(pki.server.cert)}"}}]}},'
            ' {mgmt_peer_denied, [{serial, "0a1b2c"}]}',
        )
        await gw.refused_as(pki.server, "revoked")  # the withdrawn serial, its key still pinned
        await gw.admitted_by(renewed, "pin")  # the re-issue over the same key

    mgmt_test(body)


def test_a_connection_without_a_client_certificate_is_refused(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    pin = f'{{mgmt_peer_pins, [{{spki_sha256, "{spki_sha256_hex(pki.server.cert)}"}}]}}'

    async def body(h: Harness) -> None:
        # A certificate asked for but not required: the stream, not the handshake, refuses.
        gw = start(h, pki, pin, tls=", verify => verify_peer, fail_if_no_peer_cert => false")
        await gw.refused_as(None, "bad_peer_cert")
        await gw.admitted_by(pki.server, "pin")

    mgmt_test(body)


# -- identity modes -------------------------------------------------------------------------------


def test_identity_mode_matches_the_uri_san_byte_for_byte(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    other_install = server_identity(CertAuthority("Another install"))
    no_uri = pki.leaf("no-uri")
    wrong = pki.leaf("wrong", uris=[other_install])
    lower = pki.leaf(
        "lower", uris=[pki.identity.replace(pki.ca.fingerprint_hex, pki.ca.fingerprint_hex.lower())]
    )
    agent_uri = pki.leaf("agent-uri", uris=[f"yuzu://{pki.ca.fingerprint_hex}/agent/server"])
    renewed = pki.leaf("renewed", uris=[pki.identity])  # a new key that keeps the identity
    revoked = pki.leaf("revoked", uris=[pki.identity], serial=0xDEAD)

    async def body(h: Harness) -> None:
        # No explicit identity: derived from the single-certificate cacertfile.
        gw = start(
            h, pki, '{mgmt_peer_auth_mode, identity}, {mgmt_peer_denied, [{serial, "DEAD"}]}'
        )
        await gw.admitted_by(pki.server, "identity")
        await gw.admitted_by(renewed, "identity")  # no pin: a renewal needs nothing
        await gw.refused_as(no_uri, "no_uri_san")
        for leaf in (wrong, lower, agent_uri):
            await gw.refused_as(leaf, "identity_mismatch")
        await gw.refused_as(revoked, "revoked")

    mgmt_test(body)


def test_identity_or_pin_with_an_unresolved_identity(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(pki.ca.cert_pem + CertAuthority("Next root").cert_pem)
    pin_file = tmp_path / "pinned.pem"
    pin_file.write_bytes(pki.server.cert_pem)
    unpinned = pki.leaf("unpinned", uris=[pki.identity])
    stranger = pki.leaf("stranger")

    async def body(h: Harness) -> None:
        # A CA bundle: nothing is derived, so only the pin can admit.
        gw = start(
            h,
            pki,
            "{mgmt_peer_auth_mode, identity_or_pin},"
            f' {{mgmt_peer_pins, [{{cert_file, "{pin_file}"}}]}}',
            cacertfile=bundle,
        )
        await gw.admitted_by(pki.server, "pin")
        # The identity cannot admit and the pin does not: a configuration defect, said so.
        await gw.refused_as(unpinned, "identity_unresolved")
        await gw.refused_as(stranger, "identity_unresolved")

    mgmt_test(body)


def test_identity_or_pin_reports_the_pins_reason_through_the_transition(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    old_leaf = pki.leaf("old-server")  # before the identity was minted: pinned, no URI
    stranger = pki.leaf("stranger")

    async def body(h: Harness) -> None:
        gw = start(
            h,
            pki,
            "{mgmt_peer_auth_mode, identity_or_pin},"
            f' {{mgmt_peer_pins, [{{spki_sha256, "{spki_sha256_hex(old_leaf.cert)}"}}]}}',
        )
        await gw.admitted_by(pki.server, "identity")
        await gw.admitted_by(old_leaf, "pin")
        await gw.refused_as(stranger, "pin_mismatch")  # not no_uri_san
        assert gw.rejected("no_uri_san") == 0

    mgmt_test(body)


# -- a whole node -------------------------------------------------------------------------------


def test_a_node_guards_its_management_listener(tmp_path: Path) -> None:
    """gateway_sup's wiring: the watcher before the listeners, the gate on the mgmt routes."""
    pki = Pki(tmp_path)
    agent = pki.leaf("agent", server_auth=False)
    config = tmp_path / "mgmt-tls.config"
    config.write_text(
        "[{yuzu_gw, [{health_port, 0}, {prometheus_port, 0}, {allow_no_upstream, true},"
        f' {{mgmt_peer_pins, [{{cert_file, "{pki.server.cert_path}"}}]}},'
        " {grpc_listeners, ["
        "#{name => agent, service_protos => [agent_pb],"
        " services => #{'yuzu.agent.v1.AgentService' => yuzu_gw_agent_service},"
        " listen => #{port => 0, ip => {127,0,0,1}}, limits => #{max_connections => 100}},"
        " #{name => mgmt, service_protos => [management_pb],"
        " services => #{'yuzu.server.v1.ManagementService' => yuzu_gw_mgmt_service},"
        " listen => #{port => 0, ip => {127,0,0,1}},"
        f' tls => #{{certfile => "{pki.listener.cert_path}",'
        f' keyfile => "{pki.listener.key_path}", cacertfile => "{pki.ca_path}"}}}}]}}'
        "]}]."
    )

    async def main() -> None:
        async with running_node(tmp_path, YUZU_GW_CONFIG=str(config)) as node:
            registry = node.ctx.registry
            port = node.ctx.bound["listener_mgmt"][1]
            for leaf, refused in ((pki.server, False), (agent, True)):
                creds = grpc.ssl_channel_credentials(
                    root_certificates=pki.ca.cert_pem,
                    private_key=leaf.key_pem,
                    certificate_chain=leaf.cert_pem,
                )
                async with grpc.aio.secure_channel(f"localhost:{port}", creds) as chan:
                    code = await _status(chan)
                assert (code is grpc.StatusCode.UNAUTHENTICATED) is refused
            assert (
                registry.get_sample_value("yuzu_gw_mgmt_auth_admitted_total", {"method": "pin"})
                == 1
            )
            assert (
                registry.get_sample_value(
                    "yuzu_gw_mgmt_auth_rejected_total", {"reason": "missing_server_auth_eku"}
                )
                == 1
            )

    asyncio.run(asyncio.wait_for(main(), 30))
