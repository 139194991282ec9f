"""The dev stack's node configuration (gateway/devstack/config.py) and PKI (pki.py), read back
through the gateway's own loader and schema: what boots is checked, not the text."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from gateway.config.config import Config
from gateway.config.keys.listeners import GRPC_LISTENERS
from gateway.config.keys.mgmt import MGMT_PEER_AUTH_MODE, MGMT_PEER_IDENTITY
from gateway.config.keys.node import HEALTH_PORT, PROMETHEUS_PORT
from gateway.config.keys.upstream import ALLOW_NO_UPSTREAM, UPSTREAM_CLIENT
from gateway.config.loader import PROJECT_ROOT, SHIPPED_CONFIG, load_config, read_sections
from gateway.config.mgmt_auth_settings import Mode
from gateway.config.terms import Atom
from gateway.devstack import config
from gateway.devstack.pki import DevPki, write_pki
from gateway.devstack.stack import (
    READY_LINE,
    Options,
    RunDir,
    Stack,
    StartFailed,
    banner,
    check_free,
    free_ports,
)

PORTS = config.Ports(agent=41001, mgmt=41002, health=41003, metrics=41004, upstream=41005)


def shipped() -> list[tuple[str, list]]:
    return read_sections(PROJECT_ROOT / SHIPPED_CONFIG)


def loaded(tmp_path: Path, pki: DevPki | None, sections: list | None = None) -> Config:
    path = tmp_path / "devstack.config"
    derived = config.derive(sections or shipped(), PORTS, pki)
    path.write_text(config.render(derived, "sys_config/sys.config"))
    return load_config(path, {})


def test_the_shipped_ports_are_the_dev_config_s() -> None:
    assert config.shipped_ports(shipped()) == config.Ports(
        agent=50051, mgmt=50063, health=8081, metrics=9568, upstream=50055
    )


def test_plaintext_the_node_dials_the_fake_server_and_serves_both_listeners(
    tmp_path: Path,
) -> None:
    cfg = loaded(tmp_path, None)
    assert (cfg[HEALTH_PORT], cfg[PROMETHEUS_PORT]) == (PORTS.health, PORTS.metrics)
    assert cfg[ALLOW_NO_UPSTREAM] is False
    upstream = cfg[UPSTREAM_CLIENT]
    assert upstream is not None
    assert "http" in repr(upstream) and str(PORTS.upstream) in repr(upstream)
    by_name = {spec.name: spec for spec in cfg[GRPC_LISTENERS]}
    assert (by_name["agent"].ip, by_name["agent"].port) == ("127.0.0.1", PORTS.agent)
    assert (by_name["mgmt"].ip, by_name["mgmt"].port) == ("127.0.0.1", PORTS.mgmt)
    assert by_name["agent"].tls is None and by_name["mgmt"].tls is None
    assert by_name["mgmt"].serves_mgmt and by_name["agent"].routes_agent
    # The shipped tuning is kept (one sample key).
    assert by_name["agent"].limits.max_connections == 10000


def test_tls_one_way_to_agents_mutual_on_management_with_the_identity(tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "pki")
    cfg = loaded(tmp_path, pki)
    by_name = {spec.name: spec for spec in cfg[GRPC_LISTENERS]}
    agent_tls, mgmt_tls = by_name["agent"].tls, by_name["mgmt"].tls
    assert agent_tls is not None and mgmt_tls is not None
    assert (agent_tls.verify, agent_tls.fail_if_no_peer_cert) == ("verify_none", False)
    assert (mgmt_tls.verify, mgmt_tls.fail_if_no_peer_cert) == ("verify_peer", True)
    assert mgmt_tls.cacertfile == str(pki.ca_cert_path)
    assert cfg[MGMT_PEER_AUTH_MODE] is Mode.IDENTITY
    # The boot check derived the identity from the CA, and the server leaf carries it.
    assert cfg[MGMT_PEER_IDENTITY] == pki.identity
    upstream = repr(cfg[UPSTREAM_CLIENT])
    assert "https" in upstream


def test_a_missing_management_listener_is_added(tmp_path: Path) -> None:
    sections = [
        (
            app,
            [
                (k, [e for e in v if Atom("mgmt") != e[Atom("name")]])
                if k == Atom("grpc_listeners")
                else (k, v)
                for k, v in body
            ],
        )
        for app, body in shipped()
    ]
    by_name = {spec.name: spec for spec in loaded(tmp_path, None, sections)[GRPC_LISTENERS]}
    assert by_name["mgmt"].port == PORTS.mgmt and by_name["mgmt"].serves_mgmt


def test_the_pki_leaves(tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "pki")

    def cert(path: Path) -> x509.Certificate:
        return x509.load_pem_x509_certificate(path.read_bytes())

    server, gateway = cert(pki.server.cert_path), cert(pki.gateway.cert_path)
    for leaf in (server, gateway):
        usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert ExtendedKeyUsageOID.SERVER_AUTH in usages  # the management gate requires it
        assert ExtendedKeyUsageOID.CLIENT_AUTH in usages
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "localhost" in names.get_values_for_type(x509.DNSName)
    uris = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert uris.get_values_for_type(x509.UniformResourceIdentifier) == [pki.identity]
    for key in (pki.server.key_path, pki.gateway.key_path, tmp_path / "pki" / "ca.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    # A second run replaces everything: a new CA, so a new identity.
    assert write_pki(tmp_path / "pki").identity != pki.identity


def test_a_port_in_use_is_named_with_the_way_out() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        ports = config.Ports(agent=port, mgmt=0, health=0, metrics=0, upstream=0)
        with pytest.raises(StartFailed, match=rf"port {port} is in use.*--free-ports"):
            check_free(ports)


def test_free_ports_are_distinct() -> None:
    assert len(set(free_ports().all())) == 5


def test_the_cookie_is_the_environment_s_or_a_private_file(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    assert run_dir.cookie_for({"YUZU_GW_COOKIE": "c" * 64}) == "c" * 64
    assert not run_dir.cookie.exists()
    cookie = run_dir.cookie_for({})
    assert len(cookie) == 64 and run_dir.cookie.read_text().strip() == cookie
    assert stat.S_IMODE(run_dir.cookie.stat().st_mode) == 0o600


def test_a_second_stack_in_a_run_directory_with_a_live_node_is_refused(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    run_dir.facts.write_text(json.dumps({"node_pid": os.getpid()}))
    with pytest.raises(StartFailed, match="a dev stack already runs"):
        run_dir.refuse_if_running()
    # A file left by a stack that was killed does not stand in the way.
    run_dir.facts.write_text(json.dumps({"node_pid": 2**22 + 1}))  # above Linux's pid_max
    run_dir.refuse_if_running()


def test_the_banner_names_every_port_and_ends_with_the_ready_line(tmp_path: Path) -> None:
    stack = Stack(Options(agents=3, run_dir=tmp_path), {})
    stack.ports = PORTS
    text = banner(stack)
    assert text.splitlines()[-1] == READY_LINE
    for port in PORTS.all():
        assert f":{port}" in text
    assert "3 agents subscribed" in text and "pki=" not in text
    stack.pki = write_pki(tmp_path / "pki")
    assert f'pki="{stack.pki.directory}"' in banner(stack)
