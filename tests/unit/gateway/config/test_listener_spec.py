"""`grpc_listeners`: every defect term, the defaults, the port variables, the no-listener
refusal, the routes a handler must provide and the open-file warning."""

from __future__ import annotations

import ipaddress
import logging
import resource
from typing import Any

import pytest

from gateway.config.keys import SCHEMA
from gateway.config.keys import listeners as listener_keys
from gateway.config.listener_overrides import apply_port_overrides, require_agent_listener
from gateway.config.listener_spec import (
    AGENT_SERVICE,
    ListenerSpec,
    parse_listeners,
)
from gateway.config.origin_sources import Mode
from gateway.config.refusal import BootRefused
from gateway.config.resolve import resolve_section
from gateway.config.section import Schema
from gateway.config.terms import Atom, ExternalFun, Term, parse_term
from gateway.listeners.tree import (
    ListenerBoard,
    agent_connection_capacity,
    check_fd_limit,
    resolve_routes,
)
from protos.yuzu.agent.v1 import agent_grpc

AGENT = (
    "#{name => agent, service_protos => [agent_pb],"
    " services => #{'yuzu.agent.v1.AgentService' => yuzu_gw_agent_service},"
    " listen => #{port => 50051, ip => {0,0,0,0}}}"
)
MGMT = (
    "#{name => mgmt, service_protos => [management_pb],"
    " services => #{'yuzu.server.v1.ManagementService' => yuzu_gw_mgmt_service},"
    " listen => #{port => 50063, ip => {0,0,0,0}},"
    ' tls => #{certfile => "/c.pem", keyfile => "/k.pem", cacertfile => "/ca.pem"},'
    " auth_fun => fun yuzu_gw_authz:check_mgmt_peer/1}"
)
# The production shape of the manual, agent and mgmt.
PROD = (
    "[#{name => agent, service_protos => [agent_pb],"
    " services => #{'yuzu.agent.v1.AgentService' => yuzu_gw_agent_service},"
    " listen => #{port => 50051, ip => {0,0,0,0}},"
    ' tls => #{certfile => "/etc/yuzu/certs/default-gateway.pem",'
    ' keyfile => "/etc/yuzu/certs/default-gateway.key",'
    ' cacertfile => "/etc/yuzu/certs/default-ca.pem",'
    " verify => verify_none, fail_if_no_peer_cert => false},"
    " acceptors => 32, http2 => #{idle_timeout => 180000, max_concurrent_streams => 32}},"
    " #{name => mgmt, service_protos => [management_pb],"
    " services => #{'yuzu.server.v1.ManagementService' => yuzu_gw_mgmt_service},"
    " listen => #{port => 50063, ip => {0,0,0,0}},"
    ' tls => #{certfile => "/etc/yuzu/certs/default-gateway.pem",'
    ' keyfile => "/etc/yuzu/certs/default-gateway.key",'
    ' cacertfile => "/etc/yuzu/certs/default-ca.pem"},'
    " auth_fun => fun yuzu_gw_authz:check_mgmt_peer/1, acceptors => 4,"
    " http2 => #{idle_timeout => 600000, max_concurrent_streams => 4096}}]"
)


def term(text: str) -> Term:
    return parse_term(text + ".")


def parse(text: str) -> tuple[ListenerSpec, ...]:
    return parse_listeners(term(text))


def with_keys(base: str, extra: str) -> str:
    """`base` (a map) with `extra` (`k => v, ...`) added before its closing brace."""
    return base[:-1] + ", " + extra + "}"


def refused(text: str) -> BootRefused:
    with pytest.raises(BootRefused) as caught:
        parse(text)
    return caught.value


# -- the production shape ------------------------------------------------------------------------


def test_the_production_shape_parses_with_its_values() -> None:
    agent, mgmt = parse(PROD)
    assert (agent.name, agent.port, agent.ip, agent.acceptors) == ("agent", 50051, "0.0.0.0", 32)
    assert agent.services == ((AGENT_SERVICE, "yuzu_gw_agent_service"),)
    assert agent.tls is not None and agent.tls.verify == "verify_none"
    assert not agent.tls.fail_if_no_peer_cert
    assert (agent.http2.idle_timeout_ms, agent.http2.max_concurrent_streams) == (180000, 32)
    assert agent.routes_agent and agent.serves_agent and not agent.serves_mgmt
    assert mgmt.tls is not None and mgmt.tls.verify == "verify_peer"
    assert mgmt.tls.fail_if_no_peer_cert
    assert mgmt.auth_fun == ExternalFun("yuzu_gw_authz", "check_mgmt_peer", 1)
    assert mgmt.serves_mgmt and not mgmt.routes_agent
    assert mgmt.http2.max_concurrent_streams == 4096


def test_defaults_of_an_agent_and_a_mgmt_listener() -> None:
    agent, mgmt = parse(f"[{AGENT}, {MGMT}]")
    assert agent.limits.max_connections == 60000
    assert mgmt.limits.max_connections == 256
    assert agent.limits.max_connection_memory_bytes == 8 * 1024 * 1024
    assert agent.limits.request_timeout_ms == 60000
    assert agent.http2.idle_timeout_ms == 600000
    assert (agent.http2.max_concurrent_streams, mgmt.http2.max_concurrent_streams) == (32, 4096)
    assert agent.http2.max_cancel_stream_rate == (500, 10000)
    assert agent.origin.mode is Mode.TRANSPORT
    assert agent.tls is None
    # Ports default by service when listen has none.
    bare = "#{name => a, service_protos => [agent_pb]}"
    assert parse(f"[{bare}]")[0].port == 50051
    bare_mgmt = "#{name => m, service_protos => [management_pb]}"
    assert parse(f"[{bare_mgmt}]")[0].port == 50063


def test_a_tls_path_never_shows_in_a_repr() -> None:
    agent, _ = parse(PROD)
    assert "/etc/yuzu" not in repr(agent)


# -- every defect term ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "term_"),
    [
        # closed key sets: the entry and each sub-map
        (with_keys(AGENT, "color => blue"), "unknown_keys"),
        (AGENT.replace("port => 50051", "port => 50051, backlog => 1"), "unknown_keys"),
        (with_keys(AGENT, "http2 => #{idle => 1}"), "unknown_keys"),
        (with_keys(AGENT, "limits => #{max_conns => 1}"), "unknown_keys"),
        (with_keys(AGENT, "origin => #{mode => transport, hops => 1}"), "unknown_keys"),
        (
            with_keys(
                AGENT,
                'tls => #{certfile => "c", keyfile => "k", cacertfile => "a",'
                " versions => ['tlsv1.2']}",
            ),
            "unknown_keys",
        ),
        # grpcbox-era keys, named before the generic unknown_keys
        (with_keys(AGENT, "grpc_opts => #{}, color => blue"), "legacy_keys"),
        ("#{listen_opts => #{port => 1}}", "legacy_keys"),
        (with_keys(AGENT, "transport_opts => #{ssl => true}"), "legacy_keys"),
        # TLS needs all three files
        (with_keys(AGENT, 'tls => #{certfile => "c", keyfile => "k"}'), "tls_incomplete"),
        (with_keys(AGENT, 'tls => #{cacertfile => "a"}'), "tls_incomplete"),
        (
            with_keys(AGENT, 'tls => #{certfile => "", keyfile => "k", cacertfile => "a"}'),
            "tls_incomplete",
        ),
        # auth_fun on any listener serving the agent service
        (with_keys(AGENT, "auth_fun => fun m:f/1"), "auth_fun_on_agent_listener"),
        (
            "#{name => a, service_protos => [agent_pb], auth_fun => fun m:f/1}",
            "auth_fun_on_agent_listener",
        ),
        (
            "#{name => both, service_protos => [agent_pb, management_pb],"
            " services => #{'yuzu.server.v1.ManagementService' => m}, auth_fun => fun m:f/1}",
            "auth_fun_on_agent_listener",
        ),
        # origin
        (with_keys(AGENT, "origin => #{mode => haproxy}"), "bad_origin_mode"),
        (with_keys(AGENT, "origin => #{mode => proxy_protocol}"), "origin_without_sources"),
        (
            with_keys(AGENT, "origin => #{mode => forwarded_for, sources => []}"),
            "origin_without_sources",
        ),
        (
            with_keys(AGENT, "origin => #{mode => proxy_protocol, sources => [localhost]}"),
            "bad_origin_source",
        ),
        (
            with_keys(AGENT, "origin => #{mode => proxy_protocol, sources => [{{10,0,0,0},33}]}"),
            "bad_origin_source",
        ),
        (
            with_keys(
                AGENT,
                "origin => #{mode => proxy_protocol,"
                " sources => [{{0,0,0,0,0,16#ffff,16#0a00,0}, 96}]}",
            ),
            "mapped_source_prefix",
        ),
        (
            with_keys(
                AGENT, "origin => #{mode => proxy_protocol, sources => [{{0,0,0,0,0,0,0,0}, 64}]}"
            ),
            "mapped_source_prefix",
        ),
        (
            MGMT[:-1] + ", origin => #{mode => forwarded_for, sources => [{10,0,0,5}]}}",
            "forwarded_for_with_auth_fun",
        ),
        (
            "#{name => m, service_protos => [management_pb],"
            " origin => #{mode => proxy_protocol, sources => [{10,0,0,5}]}}",
            "proxied_mgmt_listener",
        ),
        # routes the config alone can tell are wrong
        (
            "#{name => a, service_protos => [agent_pbx]}",
            "{bad_routes,{unknown_proto,agent_pbx}}",
        ),
        (
            "#{name => a, service_protos => [management_pb],"
            " services => #{'yuzu.agent.v1.AgentService' => m}}",
            "{bad_routes,{service_not_in_protos,'yuzu.agent.v1.AgentService'}}",
        ),
        # values
        (with_keys(AGENT, "acceptors => 0"), "bad_listener"),
        (AGENT.replace("port => 50051", "port => 70000"), "bad_listener"),
        (AGENT.replace("ip => {0,0,0,0}", "ip => {256,0,0,0}"), "bad_listener"),
        (AGENT.replace("ip => {0,0,0,0}", 'ip => "0.0.0.0"'), "bad_listener"),
        (with_keys(AGENT, "http2 => #{idle_timeout => 0}"), "bad_listener"),
        (with_keys(AGENT, "http2 => #{max_concurrent_streams => 0}"), "bad_listener"),
        (with_keys(AGENT, "http2 => #{max_cancel_stream_rate => 500}"), "bad_listener"),
        (with_keys(AGENT, "limits => #{max_connections => 0}"), "bad_listener"),
        (with_keys(AGENT, "limits => #{max_connection_memory_bytes => 1024}"), "bad_listener"),
        (with_keys(AGENT, "limits => #{request_timeout_ms => 10}"), "bad_listener"),
        (
            with_keys(
                AGENT,
                "origin => #{mode => forwarded_for, sources => [{1,2,3,4}], trusted_hops => -1}",
            ),
            "bad_listener",
        ),
        (
            with_keys(
                AGENT,
                'tls => #{certfile => "c", keyfile => "k", cacertfile => "a",'
                " verify => verify_none}",
            ),
            "bad_listener",
        ),
        (
            with_keys(AGENT, 'tls => #{certfile => 1, keyfile => "k", cacertfile => "a"}'),
            "bad_listener",
        ),
        ("#{service_protos => [agent_pb]}", "bad_listener"),
        ('#{name => "agent"}', "bad_listener"),
        ("#{name => m, service_protos => [management_pb], auth_fun => fun m:f/2}", "bad_listener"),
        # shapes
        ("agent", "config_shape"),
        ("[[name, agent]]", "config_shape"),
    ],
)
def test_each_defect_refuses_boot_with_its_term(text: str, term_: str) -> None:
    # One entry (a map) is wrapped in the list; the shape cases are given whole.
    refusal = refused(f"[{text}]" if text.startswith("#{") else text)
    assert refusal.term == term_, refusal.log_line()


def test_a_name_used_twice_refuses() -> None:
    second = AGENT.replace("port => 50051", "port => 50052")
    assert refused(f"[{AGENT}, {second}]").term == "duplicate_name"


def test_a_fixed_port_used_twice_refuses_but_port_0_does_not() -> None:
    other = AGENT.replace("name => agent", "name => agent2")
    assert refused(f"[{AGENT}, {other}]").term == "duplicate_port"
    zero = AGENT.replace("port => 50051", "port => 0")
    zero2 = zero.replace("name => agent", "name => agent2")
    assert [s.port for s in parse(f"[{zero}, {zero2}]")] == [0, 0]


def test_a_refusal_never_prints_a_tls_path() -> None:
    text = with_keys(
        AGENT, 'tls => #{certfile => "/secret/c.pem", keyfile => 7, cacertfile => "/a"}'
    )
    refusal = refused(f"[{text}]")
    assert "/secret" not in refusal.log_line()
    assert "keyfile" in refusal.log_line()


def test_origin_sources_fold_ipv4_mapped_forms() -> None:
    text = with_keys(
        AGENT,
        "origin => #{mode => proxy_protocol, sources => [{10,0,0,5},"
        " {{0,0,0,0,0,16#ffff,16#0a01,0}, 120}, {{10,2,0,9}, 24}, {0,0,0,0,0,16#ffff,16#0a03,1}]}",
    )
    origin = parse(f"[{text}]")[0].origin
    assert origin.mode is Mode.PROXY_PROTOCOL
    assert origin.sources.trusts("10.0.0.5")
    assert origin.sources.trusts("10.1.0.77")  # the mapped /120 is 10.1.0.0/24
    assert not origin.sources.trusts("10.1.1.1")
    assert origin.sources.trusts("10.2.0.200")  # host bits masked
    assert origin.sources.trusts("10.3.0.1")
    assert origin.sources.trusts("::ffff:10.0.0.5")
    assert ipaddress.ip_network("10.1.0.0/24") in origin.sources.networks


def test_a_pointless_origin_option_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    text = with_keys(
        AGENT, "origin => #{mode => transport, sources => [{1,2,3,4}], trusted_hops => 1}"
    )
    caplog.set_level(logging.WARNING)
    parse(f"[{text}]")
    lines = [r.getMessage() for r in caplog.records]
    assert any("sources has no effect" in line for line in lines)
    assert any("trusted_hops has no effect" in line for line in lines)


# -- the key, the checks and the environment -----------------------------------------------------

SCHEMA_WITH_CHECKS = Schema(
    section="yuzu_gw", keys=SCHEMA.keys, dead=SCHEMA.dead, checks=listener_keys.CHECKS
)


def resolve(listeners: str, env: dict[str, str] | None = None, allow: bool = False) -> Any:
    entries: list[Term] = [(Atom("grpc_listeners"), term(listeners))]
    if allow:
        entries.append((Atom("allow_no_listeners"), True))
    return resolve_section(SCHEMA_WITH_CHECKS, entries, env or {})


def test_the_key_reads_the_listeners() -> None:
    config = resolve(PROD)
    assert [s.name for s in config[listener_keys.GRPC_LISTENERS]] == ["agent", "mgmt"]


@pytest.mark.parametrize("listeners", ["[]", None])
def test_no_listeners_refuses_unless_allowed(listeners: str | None) -> None:
    entries: list[Term] = [] if listeners is None else [(Atom("grpc_listeners"), [])]
    with pytest.raises(BootRefused) as caught:
        resolve_section(SCHEMA_WITH_CHECKS, entries, {})
    assert caught.value.term == "no_listeners"
    allowed = [*entries, (Atom("allow_no_listeners"), True)]
    assert resolve_section(SCHEMA_WITH_CHECKS, allowed, {})[listener_keys.GRPC_LISTENERS] == ()


def test_listeners_that_route_no_agent_service_refuse() -> None:
    # agent_pb with an empty services map does not count: nothing would answer an agent.
    text = f"[#{{name => a, service_protos => [agent_pb], services => #{{}}}}, {MGMT}]"
    with pytest.raises(BootRefused) as caught:
        resolve(text)
    assert caught.value.term == "no_agent_listener"
    assert resolve(text, allow=True)[listener_keys.GRPC_LISTENERS]


def test_only_the_literal_true_allows_no_listeners() -> None:
    entries: list[Term] = [(Atom("allow_no_listeners"), Atom("yes"))]
    with pytest.raises(BootRefused):
        resolve_section(SCHEMA_WITH_CHECKS, entries, {})


def test_a_bad_listener_refuses_through_the_key_too() -> None:
    with pytest.raises(BootRefused) as caught:
        resolve(f"[{with_keys(AGENT, 'auth_fun => fun m:f/1')}]")
    assert caught.value.term == "auth_fun_on_agent_listener"


def test_agent_port_variable_moves_the_agent_listener(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    config = resolve(PROD, {"YUZU_GW_AGENT_PORT": "6000", "YUZU_GW_MGMT_PORT": "6001"})
    agent, mgmt = config[listener_keys.GRPC_LISTENERS]
    assert (agent.port, mgmt.port) == (6000, 6001)
    assert any(
        "ENV override: YUZU_GW_AGENT_PORT=6000 replaces listen port of grpc_listeners entry agent"
        in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.parametrize("value", ["abc", "70000", "-1", "50051x", " "])
def test_a_bad_port_variable_is_logged_and_ignored(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    config = resolve(PROD, {"YUZU_GW_AGENT_PORT": value})
    assert config[listener_keys.GRPC_LISTENERS][0].port == 50051
    if value.strip():
        [line] = [r.getMessage() for r in caplog.records if "YUZU_GW_AGENT_PORT" in r.getMessage()]
        assert "not an integer from 0 to 65535; ignoring it" in line
        assert "abc" not in line


def test_a_port_variable_with_no_or_several_targets_is_warned_and_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    second = AGENT.replace("name => agent", "name => f5").replace("50051", "50052")
    config = resolve(
        f"[{AGENT}, {second}]", {"YUZU_GW_AGENT_PORT": "7000", "YUZU_GW_MGMT_PORT": "7001"}
    )
    assert [s.port for s in config[listener_keys.GRPC_LISTENERS]] == [50051, 50052]
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        "YUZU_GW_AGENT_PORT" in line and "2 grpc_listeners entries" in line for line in lines
    )
    assert any("YUZU_GW_MGMT_PORT" in line and "0 grpc_listeners entries" in line for line in lines)


def test_on_a_combined_listener_only_the_agent_variable_applies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    combined = (
        "[#{name => both, service_protos => [agent_pb, management_pb],"
        " services => #{'yuzu.agent.v1.AgentService' => a,"
        " 'yuzu.server.v1.ManagementService' => m}}]"
    )
    [spec] = resolve(combined, {"YUZU_GW_MGMT_PORT": "7001"})[listener_keys.GRPC_LISTENERS]
    assert spec.port == 50051
    assert any("combined" in r.getMessage() for r in caplog.records)
    [spec] = resolve(combined, {"YUZU_GW_AGENT_PORT": "7002"})[listener_keys.GRPC_LISTENERS]
    assert spec.port == 7002


def test_an_override_that_makes_a_port_collide_refuses() -> None:
    with pytest.raises(BootRefused) as caught:
        resolve(PROD, {"YUZU_GW_MGMT_PORT": "50051"})
    assert caught.value.term == "duplicate_port"


def test_an_empty_variable_counts_as_unset() -> None:
    specs = parse(PROD)
    assert apply_port_overrides(specs, {"YUZU_GW_AGENT_PORT": ""}) is specs


def test_require_agent_listener_directly() -> None:
    require_agent_listener((), True)
    with pytest.raises(BootRefused):
        require_agent_listener((), False)


# -- routes: what the handlers must provide --------------------------------------------------------


class _Agent(agent_grpc.AgentServiceBase):
    pass


for _name in agent_grpc.AgentServiceBase.__abstractmethods__:
    setattr(_Agent, _name, lambda self, stream: None)
_Agent.__abstractmethods__ = frozenset()


class _Partial:
    """Routes only Register, as a module exporting only some methods."""

    def __mapping__(self) -> dict[str, Any]:
        full = _Agent().__mapping__()
        return {k: v for k, v in full.items() if k.endswith("/Register")}


class _Nothing:
    def __mapping__(self) -> dict[str, Any]:
        return {"/yuzu.server.v1.ManagementService/ListAgents": object()}


def test_routes_come_from_the_handler_of_the_module() -> None:
    agent, _ = parse(PROD)
    [routes] = resolve_routes(agent, {"yuzu_gw_agent_service": _Agent()})
    assert len(routes.__mapping__()) == 7
    [partial] = resolve_routes(agent, {"yuzu_gw_agent_service": _Partial()})
    assert list(partial.__mapping__()) == ["/yuzu.agent.v1.AgentService/Register"]


def test_an_unknown_module_is_bad_routes() -> None:
    agent, _ = parse(PROD)
    with pytest.raises(BootRefused) as caught:
        resolve_routes(agent, {})
    assert caught.value.term == "{bad_routes,{unknown_module,yuzu_gw_agent_service}}"
    with pytest.raises(BootRefused):
        resolve_routes(agent, {"yuzu_gw_agent_service": object()})


def test_a_module_that_routes_none_of_its_methods_is_service_without_routes() -> None:
    agent, _ = parse(PROD)
    with pytest.raises(BootRefused) as caught:
        resolve_routes(agent, {"yuzu_gw_agent_service": _Nothing()})
    assert caught.value.term == "{bad_routes,{service_without_routes,'yuzu.agent.v1.AgentService'}}"


# -- the open-file limit and the readiness board -------------------------------------------------


def test_max_connections_beyond_the_open_file_limit_warns(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    specs = parse(PROD)  # 60000 + 256
    raised: list[tuple[int, int]] = []
    limit = check_fd_limit(specs, lambda _r: (1024, 20000), lambda _r, v: raised.append(v))
    assert limit == 20000 and raised == [(20000, 20000)]
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "60256" in warning.getMessage() and "at most 14500 connections" in warning.getMessage()


def test_max_connections_within_the_limit_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    text = with_keys(AGENT, "limits => #{max_connections => 1000}")
    check_fd_limit(parse(f"[{text}]"), lambda _r: (65536, 65536), lambda _r, v: None)
    assert caplog.records == []


def test_the_soft_limit_stays_when_it_cannot_be_raised(caplog: pytest.LogCaptureFixture) -> None:
    def refuse(_r: int, _v: tuple[int, int]) -> None:
        raise ValueError("not allowed")

    assert check_fd_limit((), lambda _r: (1024, 4096), refuse) == 1024
    assert check_fd_limit((), lambda _r: (1024, resource.RLIM_INFINITY), refuse) == 1024


def test_agent_connection_capacity_sums_agent_listeners() -> None:
    assert agent_connection_capacity(parse(PROD)) == 60000


def test_the_board_is_not_ready_until_every_listener_runs() -> None:
    specs = parse(PROD)
    board = ListenerBoard(specs, allow_no_listeners=False)
    assert not board.ready()
    assert board.states() == {"agent": None, "mgmt": None}
    assert ListenerBoard((), allow_no_listeners=True).ready()
    assert not ListenerBoard((), allow_no_listeners=False).ready()
