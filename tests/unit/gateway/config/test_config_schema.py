"""Resolving the yuzu_gw section: closed key set, bad values, env overrides, cluster_id."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

import attrs
import pytest

from gateway.config import keys
from gateway.config.closed import closed_map
from gateway.config.config import Config
from gateway.config.converters import IntRange
from gateway.config.keys import SCHEMA, cluster, heartbeat, listeners, node, upstream
from gateway.config.refusal import BootRefused, refusing_boot
from gateway.config.resolve import resolve_section
from gateway.config.schema import Key, Source
from gateway.config.section import Schema
from gateway.config.terms import Atom, Term, parse_term

CONFIG = "yuzu_gw.config"
BOOT = "yuzu_gw.boot"


def section(text: str) -> Term:
    """The `[{key, Value}]` list of a yuzu_gw section written in Erlang syntax."""
    return parse_term(text + ".")


# The schema without its refusal of a gateway with no agent listener: these tests resolve
# partial sections key by key (the refusal is tested in test_listener_spec.py).
KEYS_SCHEMA = attrs.evolve(
    SCHEMA, checks=tuple(c for c in SCHEMA.checks if c is not listeners.listeners_route_agents)
)


def resolve(text: str = "[]", env: dict[str, str] | None = None) -> Config:
    return resolve_section(KEYS_SCHEMA, section(text), env or {}, "test.config")


def lines(caplog: pytest.LogCaptureFixture, logger: str, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == level]


@pytest.fixture(autouse=True)
def _capture_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)


# -- defaults and typed access ------------------------------------------------------------------


def test_empty_section_gives_every_default_from_the_manual() -> None:
    config = resolve()
    assert config[node.HEALTH_PORT] == 8081
    assert config[node.PROMETHEUS_PORT] == 9568
    assert config[heartbeat.HEARTBEAT_BATCH_INTERVAL_MS] == 1000
    assert config[keys.router.DEFAULT_COMMAND_TIMEOUT_S] == 300
    assert config[node.TELEMETRY_GAUGE_INTERVAL_MS] == 10000
    assert config[cluster.HASH_RING_VNODES] == 256
    assert config[cluster.CLUSTER_ID] == "default"
    assert config[cluster.CLUSTER_SEED_DNS_NAME] == "gateway"
    assert config[cluster.CLUSTER_SEED_NODES] == ()
    assert config[cluster.CLUSTER_REDIAL_INTERVAL_MS] == 5000
    assert config[cluster.CLUSTER_MAX_LIFETIME_ADDRS] == 1024
    assert config[node.SHUTDOWN_FLUSH_BUDGET_MS] == 20000
    assert config[listeners.ALLOW_NO_LISTENERS] is False
    assert config[upstream.ALLOW_NO_UPSTREAM] is False
    assert config[node.NODE_NAME] is None
    assert all(config.source_of(k) is Source.DEFAULT for k in SCHEMA.keys)


def test_values_from_the_file_are_typed_and_sourced() -> None:
    config = resolve(
        '[{health_port, 0}, {cluster_seed_nodes, [<<"10.0.0.1">>, "gw-2", {10,0,0,3}]},'
        ' {cluster_id, "Z\\x{FC}rich"}, {upstream_tcp_nodelay, false}]'
    )
    assert config[node.HEALTH_PORT] == 0
    assert config[cluster.CLUSTER_SEED_NODES] == ("10.0.0.1", "gw-2", "10.0.0.3")
    assert config[cluster.CLUSTER_ID] == "Zürich"
    assert config[upstream.UPSTREAM_TCP_NODELAY] is False
    assert config.source_of(node.HEALTH_PORT) is Source.APP_ENV
    assert config.value_of("health_port") == 0


def test_a_key_of_another_schema_is_not_in_the_config() -> None:
    stranger: Key[int] = Key(
        name="stranger", default=1, convert=IntRange(0), read_when="-", doc="-", area="-"
    )
    with pytest.raises(KeyError, match="stranger"):
        resolve()[stranger]


def test_with_value_replaces_one_value_and_its_source() -> None:
    config = resolve().with_value(node.HEALTH_PORT, 9000, Source.ENV)
    assert config[node.HEALTH_PORT] == 9000
    assert config.source_of(node.HEALTH_PORT) is Source.ENV


def test_repr_shows_sources_never_values() -> None:
    config = resolve('[{cluster_id, <<"secret-zone">>}]')
    assert "secret-zone" not in repr(config)
    assert "cluster_id=app_env" in repr(config)


# -- closed key set ------------------------------------------------------------------------------


def test_unknown_keys_refuse_boot_naming_them(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(BootRefused) as caught, refusing_boot():
        resolve('[{poolsize, 4}, {heartbeat_batch_interval_ms, 1000}, {grpc_listenerz, "x"}]')
    assert caught.value.defect == "unknown_keys"
    assert "grpc_listenerz, poolsize" in caught.value.detail
    [critical] = lines(caplog, BOOT, logging.CRITICAL)
    assert critical.startswith("Refusing to start: unknown_keys: yuzu_gw has keys outside")


def test_dead_keys_are_accepted_and_named_once(caplog: pytest.LogCaptureFixture) -> None:
    config = resolve(
        '[{upstream_addr, "127.0.0.1"}, {upstream_port, 50055}, {upstream_pool_size, 16},'
        " {agent_listen_port, 50051}, {mgmt_listen_addr, x}, {tls, []}]"
    )
    assert config[upstream.UPSTREAM_PORT] == 50055
    [info] = [m for m in lines(caplog, CONFIG, logging.INFO) if "nothing reads" in m]
    assert "agent_listen_port, mgmt_listen_addr, tls" in info


def test_a_key_set_twice_refuses_boot() -> None:
    with pytest.raises(BootRefused) as caught:
        resolve("[{health_port, 1}, {health_port, 2}]")
    assert caught.value.defect == "duplicate_keys"
    assert "health_port" in caught.value.detail


@pytest.mark.parametrize("text", ["[{1, a}]", "[health_port]", "[{a, b, c}]", "#{}"])
def test_a_malformed_section_refuses_with_config_shape(text: str) -> None:
    with pytest.raises(BootRefused) as caught:
        resolve(text)
    assert caught.value.defect == "config_shape"


def test_closed_map_for_nested_maps() -> None:
    entry = parse_term("#{name => agent, listen => #{port => 1}}.")
    assert closed_map(entry, {"name", "listen", "tls"}, "listener agent") == {
        "name": Atom("agent"),
        "listen": {Atom("port"): 1},
    }
    with pytest.raises(BootRefused) as caught:
        closed_map(parse_term('#{name => a, acceptor => 3, "k" => 1}.'), {"name"}, "listener a")
    assert caught.value.defect == "unknown_keys"
    assert caught.value.detail.startswith("listener a has keys outside its closed set: a list,")
    assert "acceptor" in caught.value.detail
    with pytest.raises(BootRefused) as caught:
        closed_map([1], {"name"}, "listener a", not_a_map="bad_listener")
    assert caught.value.defect == "bad_listener"


# -- bad values replaced by defaults --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("50", "is 50, not an integer from 100 to 60000"),
        ("infinity", "is infinity, not"),
        ('"4"', "is a list, not"),
        ("2.0", "is a float, not"),
        ('<<"1000">>', "is a binary, not"),
        ("#{}", "is a map, not"),
        ("{1000}", "is a tuple, not"),
        ("true", "is true, not"),
    ],
)
def test_bad_value_warns_once_and_uses_the_default(
    caplog: pytest.LogCaptureFixture, value: str, shown: str
) -> None:
    config = resolve(f"[{{heartbeat_batch_interval_ms, {value}}}]")
    assert config[heartbeat.HEARTBEAT_BATCH_INTERVAL_MS] == 1000
    assert config.source_of(heartbeat.HEARTBEAT_BATCH_INTERVAL_MS) is Source.DEFAULT
    [warning] = lines(caplog, CONFIG, logging.WARNING)
    assert warning.startswith(f"yuzu_gw heartbeat_batch_interval_ms {shown}")
    assert warning.endswith("the default 1000 is used instead (docs/configuration.md)")


def test_bad_value_warning_never_prints_a_non_integer_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    resolve('[{cluster_seed_dns_name, "/etc/yuzu/keys/secret.key has spaces"}]')
    [warning] = lines(caplog, CONFIG, logging.WARNING)
    assert "secret" not in warning
    assert "cluster_seed_dns_name is a list, not" in warning


@pytest.mark.parametrize("port", [0, 1, 65535])
def test_ports_take_zero_for_a_free_port(port: int) -> None:
    config = resolve(f"[{{health_port, {port}}}, {{prometheus_port, {port}}}]")
    assert (config[node.HEALTH_PORT], config[node.PROMETHEUS_PORT]) == (port, port)


@pytest.mark.parametrize("value", ["true", "yes", '"true"', "1", "[true]"])
def test_only_the_literal_true_acknowledges(caplog: pytest.LogCaptureFixture, value: str) -> None:
    config = resolve(f"[{{allow_no_listeners, {value}}}, {{allow_no_upstream, {value}}}]")
    expected = value == "true"
    assert config[listeners.ALLOW_NO_LISTENERS] is expected
    assert config[upstream.ALLOW_NO_UPSTREAM] is expected
    assert lines(caplog, CONFIG, logging.WARNING) == []


def test_a_default_decided_elsewhere_reads_as_none(caplog: pytest.LogCaptureFixture) -> None:
    replay = upstream.UPSTREAM_REPLAY_CONCURRENCY
    assert resolve()[replay] is None
    assert resolve("[{upstream_replay_concurrency, undefined}]")[replay] is None
    assert resolve("[{upstream_replay_concurrency, 12}]")[replay] == 12
    assert resolve("[{upstream_replay_concurrency, 0}]")[replay] is None
    [warning] = lines(caplog, CONFIG, logging.WARNING)
    assert "is 0, not an integer from 1 to 4096, or undefined" in warning


def test_a_bad_node_name_refuses_boot() -> None:
    with pytest.raises(BootRefused) as caught:
        resolve('[{node_name, "gw one"}]')
    assert caught.value.defect == "invalid_node_name"
    assert "gw one" not in str(caught.value)
    assert resolve("[{node_name, 'gw1@10.0.0.5'}]")[node.NODE_NAME] == "gw1@10.0.0.5"


# -- environment overrides -----------------------------------------------------------------------


def test_env_override_applies_with_an_info_line(caplog: pytest.LogCaptureFixture) -> None:
    config = resolve(
        "[{heartbeat_batch_interval_ms, 2000}]", {"YUZU_GW_HEARTBEAT_INTERVAL_MS": "500"}
    )
    assert config[heartbeat.HEARTBEAT_BATCH_INTERVAL_MS] == 500
    assert config.source_of(heartbeat.HEARTBEAT_BATCH_INTERVAL_MS) is Source.ENV
    assert lines(caplog, CONFIG, logging.INFO) == [
        "ENV override: YUZU_GW_HEARTBEAT_INTERVAL_MS=500 replaces heartbeat_batch_interval_ms"
    ]


def test_every_declared_override_is_applied(caplog: pytest.LogCaptureFixture) -> None:
    config = resolve(
        env={
            "YUZU_GW_SEED_DNS_NAME": "gw.internal",
            "YUZU_GW_SEED_NODES": " 10.0.0.1, 10.0.0.2,",
            "YUZU_GW_CLUSTER_REDIAL_INTERVAL_MS": "750",
            "YUZU_GW_CLUSTER_ID": "zone-a",
        }
    )
    assert config[cluster.CLUSTER_SEED_DNS_NAME] == "gw.internal"
    assert config[cluster.CLUSTER_SEED_NODES] == ("10.0.0.1", "10.0.0.2")
    assert config[cluster.CLUSTER_REDIAL_INTERVAL_MS] == 750
    assert config[cluster.CLUSTER_ID] == "zone-a"
    infos = [m for m in lines(caplog, CONFIG, logging.INFO) if m.startswith("ENV override: ")]
    assert len(infos) == 4


def test_an_empty_variable_counts_as_unset(caplog: pytest.LogCaptureFixture) -> None:
    config = resolve("[{heartbeat_batch_interval_ms, 2000}]", {"YUZU_GW_HEARTBEAT_INTERVAL_MS": ""})
    assert config[heartbeat.HEARTBEAT_BATCH_INTERVAL_MS] == 2000
    assert lines(caplog, CONFIG, logging.INFO) == []


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ("50", "is 50, not an integer from 100 to 60000"),
        ("abc", "is not an integer from 100 to 60000"),
        ("1.5s", "is not an integer from 100 to 60000"),
    ],
)
def test_a_bad_variable_warns_and_uses_the_default(
    caplog: pytest.LogCaptureFixture, text: str, wrong: str
) -> None:
    config = resolve(
        "[{heartbeat_batch_interval_ms, 2000}]", {"YUZU_GW_HEARTBEAT_INTERVAL_MS": text}
    )
    assert config[heartbeat.HEARTBEAT_BATCH_INTERVAL_MS] == 1000
    assert lines(caplog, CONFIG, logging.WARNING) == [
        f"ENV override: YUZU_GW_HEARTBEAT_INTERVAL_MS {wrong}; ignoring it,"
        " the default 1000 is used for heartbeat_batch_interval_ms"
    ]
    assert lines(caplog, CONFIG, logging.INFO) == []


def test_upstream_address_variables_have_no_effect(caplog: pytest.LogCaptureFixture) -> None:
    config = resolve(
        '[{upstream_addr, "127.0.0.1"}]',
        {"YUZU_GW_UPSTREAM_ADDR": "10.9.9.9", "YUZU_GW_UPSTREAM_PORT": "1"},
    )
    assert config[upstream.UPSTREAM_ADDR] == "127.0.0.1"
    assert lines(caplog, CONFIG, logging.WARNING) == [
        "YUZU_GW_UPSTREAM_ADDR is set but has no effect",
        "YUZU_GW_UPSTREAM_PORT is set but has no effect",
    ]
    assert not any("ENV override" in m for m in lines(caplog, CONFIG, logging.INFO))


# -- cluster_id ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('<<"Z\\x{FC}rich"/utf8>>', "Zürich"),
        ('"Z\\x{FC}rich"', "Zürich"),
        ('"Zürich"', "Zürich"),
        ("[90, 252]", "Zü"),
        # The manual: a plain binary with code points above 255 keeps their low bytes and is
        # accepted when those happen to be UTF-8 (here "@A", not what was written).
        ('<<"\\x{140}\\x{141}">>', "@A"),
        ("<<>>", ""),
        ('""', ""),
        ("[]", ""),
    ],
)
def test_cluster_id_forms_that_work(value: str, expected: str) -> None:
    assert resolve(f"[{{cluster_id, {value}}}]")[cluster.CLUSTER_ID] == expected


@pytest.mark.parametrize(
    "value",
    [
        '<<"Z\\x{FC}rich">>',  # the single byte 16#FC: not UTF-8
        "<<16#ED, 16#A0, 16#80>>",  # an encoded surrogate
        "<<16#F4, 16#90, 16#80, 16#80>>",  # above 16#10FFFF
        "[16#110000]",
        "zurich",  # an atom
        "42",
    ],
)
def test_cluster_id_from_the_file_refuses_without_the_value(
    caplog: pytest.LogCaptureFixture, value: str
) -> None:
    with pytest.raises(BootRefused) as caught, refusing_boot():
        resolve(f"[{{cluster_id, {value}}}]")
    assert caught.value.term == "{invalid_cluster_id,app_env}"
    [critical] = lines(caplog, BOOT, logging.CRITICAL)
    assert critical.startswith("Refusing to start: {invalid_cluster_id,app_env}: ")
    assert "cluster_id from the config file" in critical
    for secret in ("rich", "zurich", "42"):
        assert secret not in critical


def test_cluster_id_variable_with_bytes_that_are_not_utf8_refuses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # How Python hands over the byte 16#FC from a UTF-8 environment: surrogateescape.
    env = {"YUZU_GW_CLUSTER_ID": "Z\udcfcrich"}
    with pytest.raises(BootRefused) as caught, refusing_boot():
        resolve('[{cluster_id, <<"fine">>}]', env)
    assert caught.value.term == "{invalid_cluster_id,env}"
    assert lines(caplog, CONFIG, logging.WARNING) == [
        "ENV override: YUZU_GW_CLUSTER_ID cannot be represented as UTF-8; ignoring it"
    ]
    [critical] = lines(caplog, BOOT, logging.CRITICAL)
    assert "YUZU_GW_CLUSTER_ID" in critical
    assert "rich" not in caplog.text


def test_cluster_id_variable_replaces_the_setting_and_is_never_echoed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Only the source in use is checked: the bad setting underneath is not refused.
    config = resolve('[{cluster_id, <<"Z\\x{FC}">>}]', {"YUZU_GW_CLUSTER_ID": "Zürich-east"})
    assert config[cluster.CLUSTER_ID] == "Zürich-east"
    assert config.source_of(cluster.CLUSTER_ID) is Source.ENV
    assert lines(caplog, CONFIG, logging.INFO) == [
        "ENV override: YUZU_GW_CLUSTER_ID replaces cluster_id (value not logged)"
    ]
    assert "east" not in caplog.text


# -- declarations --------------------------------------------------------------------------------


@pytest.mark.parametrize("area", keys.AREAS, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_declared_key_of_an_area_is_in_its_keys(area: ModuleType) -> None:
    declared = [v for v in vars(area).values() if isinstance(v, Key)]
    assert sorted(k.name for k in declared) == sorted(k.name for k in area.KEYS)
    assert all(k.area == area.AREA for k in area.KEYS)


def test_every_key_is_documented_and_its_default_is_valid() -> None:
    for key in SCHEMA.keys:
        assert key.doc and key.read_when, key.name
        assert key.convert(key.default) == key.default_value
        assert set(key.our_choices) <= {"default", "valid values", "bad value"}


def test_a_schema_refuses_a_key_declared_twice() -> None:
    key: Key[Any] = SCHEMA.keys[0]
    with pytest.raises(ValueError, match="declared twice"):
        Schema(section="x", keys=(key, key))


def test_a_default_its_converter_refuses_fails_at_declaration() -> None:
    with pytest.raises(Exception, match="not an integer"):
        Key(name="k", default=-1, convert=IntRange(0), read_when="-", doc="-", area="-")


def test_checks_run_after_the_keys_and_may_adjust() -> None:
    def pin_port(config: Config, env: Any) -> Config:
        return config.with_value(node.HEALTH_PORT, 1234, Source.ENV)

    schema = Schema(section="yuzu_gw", keys=SCHEMA.keys, checks=(pin_port,))
    assert resolve_section(schema, [], {})[node.HEALTH_PORT] == 1234
