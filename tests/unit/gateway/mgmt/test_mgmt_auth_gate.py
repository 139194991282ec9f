"""The per-stream gate (gateway/mgmt/auth/gate.py) and the metric families (metrics.py), without
a socket: a connection whose handshake "presented" a certificate, and the route guard."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from cryptography.hazmat.primitives.serialization import Encoding
from grpclib.const import Cardinality, Handler
from prometheus_client import CollectorRegistry

from gateway.config.certs import spki_sha256
from gateway.config.listener_spec import parse_listeners
from gateway.config.mgmt_auth_settings import Mode
from gateway.config.terms import parse_term
from gateway.listeners.connection import ConnectionInfo
from gateway.listeners.server import Routes
from gateway.mgmt.auth import gate as gate_module
from gateway.mgmt.auth.decide import Admitted, Policy, Rejected
from gateway.mgmt.auth.gate import PeerGate, PinBoard
from gateway.mgmt.auth.metrics import mgmt_auth_metrics
from gateway.mgmt.auth.reasons import Method, Reason
from tests.support.certs import CertAuthority, server_identity

CA = CertAuthority()
SERVER = CA.issue("yuzu-server", uris=[server_identity(CA)])
AGENT = CA.issue("agent-1", server_auth=False)


class _SslObject:
    def __init__(self, der: bytes | None) -> None:
        self.der = der

    def getpeercert(self, binary_form: bool) -> bytes | None:
        assert binary_form
        return self.der


class _Transport:
    def __init__(self, der: bytes | None, tls: bool = True) -> None:
        self.ssl = _SslObject(der) if tls else None

    def get_extra_info(self, name: str) -> Any:
        return self.ssl if name == "ssl_object" else None


_KEYS = iter(range(10_000, 20_000))


def connection(der: bytes | None) -> ConnectionInfo:
    conn = ConnectionInfo(next(_KEYS), "mgmt", "127.0.0.1", 5000)
    conn.attach(_Transport(der))
    return conn


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def make_gate(mode: Mode = Mode.PIN) -> tuple[PeerGate, CollectorRegistry]:
    registry = CollectorRegistry()
    policy = Policy(mode, server_identity(CA), pins_configured=1)
    board = PinBoard(frozenset({spki_sha256(SERVER.cert)}))
    return PeerGate(policy, board, mgmt_auth_metrics(registry), clock=lambda: 0.0), registry


def test_every_series_exists_at_zero_from_the_start() -> None:
    registry = CollectorRegistry()
    mgmt_auth_metrics(registry)
    for reason in Reason:
        assert sample(registry, "yuzu_gw_mgmt_auth_rejected_total", reason=reason.value) == 0
    for method in Method:
        assert sample(registry, "yuzu_gw_mgmt_auth_admitted_total", method=method.value) == 0
    assert sample(registry, "yuzu_gw_mgmt_pin_rotated_timestamp_seconds") == 0
    assert sample(registry, "yuzu_gw_mgmt_auth_pin_unresolved_total") == 0
    assert mgmt_auth_metrics(registry) is mgmt_auth_metrics(registry)  # one per registry


def test_the_certificate_is_decoded_once_per_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[bytes | None] = []
    real = gate_module.read_peer

    def counting(der: bytes | None) -> Any:
        decoded.append(der)
        return real(der)

    monkeypatch.setattr(gate_module, "read_peer", counting)
    gate, registry = make_gate()
    conn = connection(SERVER.cert.public_bytes(Encoding.DER))
    for _ in range(3):
        assert gate.check(conn) == Admitted(Method.PIN)
    assert len(decoded) == 1
    assert sample(registry, "yuzu_gw_mgmt_auth_admitted_total", method="pin") == 3
    conn.closed()  # forgotten with the connection: a late stream decodes again
    gate.check(conn)
    assert len(decoded) == 2


def test_refusals_are_counted_by_reason_and_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate, registry = make_gate()
    agent = connection(AGENT.cert.public_bytes(Encoding.DER))
    for _ in range(3):
        assert gate.check(agent) == Rejected(Reason.MISSING_SERVER_AUTH_EKU)
    assert gate.check(connection(None)) == Rejected(Reason.BAD_PEER_CERT)
    assert (
        sample(registry, "yuzu_gw_mgmt_auth_rejected_total", reason="missing_server_auth_eku") == 3
    )
    assert sample(registry, "yuzu_gw_mgmt_auth_rejected_total", reason="bad_peer_cert") == 1
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert messages == [
        "management peer refused: missing_server_auth_eku (UNAUTHENTICATED; docs/mgmt-auth.md)",
        "management peer refused: bad_peer_cert (UNAUTHENTICATED; docs/mgmt-auth.md)",
    ]
    assert all("yuzu-server" not in m and "agent-1" not in m for m in messages)


def test_a_failing_check_refuses_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(gate_module, "decide", broken)
    gate, registry = make_gate()
    conn = connection(SERVER.cert.public_bytes(Encoding.DER))
    assert gate.check(conn) == Rejected(Reason.INTERNAL_ERROR)
    assert sample(registry, "yuzu_gw_mgmt_auth_rejected_total", reason="internal_error") == 1


def test_a_pin_published_later_is_read_without_a_message() -> None:
    gate, _ = make_gate()
    gate.board.pins = frozenset()
    conn = connection(SERVER.cert.public_bytes(Encoding.DER))
    assert gate.check(conn) == Rejected(Reason.NO_PINS_RESOLVED)
    gate.board.pins = frozenset({spki_sha256(SERVER.cert)})
    assert gate.check(conn) == Admitted(Method.PIN)


async def _noop(_stream: Any) -> None:
    return None


def _routes(*paths: str) -> list[Routes]:
    return [Routes({p: Handler(_noop, Cardinality.UNARY_UNARY, None, None) for p in paths})]


def test_the_guard_wraps_management_methods_of_judged_listeners_only() -> None:
    gate, _ = make_gate()
    tls = 'tls => #{certfile => "c", keyfile => "k", cacertfile => "a"}'
    combined, plaintext = parse_listeners(
        parse_term(
            "[#{name => both, service_protos => [agent_pb, management_pb],"
            " services => #{'yuzu.agent.v1.AgentService' => a,"
            f" 'yuzu.server.v1.ManagementService' => m}}, {tls}}},"
            " #{name => plain, service_protos => [management_pb],"
            " services => #{'yuzu.server.v1.ManagementService' => m},"
            " listen => #{ip => {127,0,0,1}, port => 0}}]."
        )
    )
    mgmt_path = "/yuzu.server.v1.ManagementService/ListAgents"
    agent_path = "/yuzu.agent.v1.AgentService/Register"
    [guarded] = gate.guard(combined, _routes(mgmt_path, agent_path))
    mapping = guarded.__mapping__()
    assert mapping[mgmt_path].func is not _noop
    assert mapping[mgmt_path].cardinality is Cardinality.UNARY_UNARY
    assert mapping[agent_path].func is _noop  # agents are never judged
    [untouched] = gate.guard(plaintext, _routes(mgmt_path))
    assert untouched.__mapping__()[mgmt_path].func is _noop
