"""Loading config files and vm.args: shipped files, file shape, sections, paths."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.config.keys import cluster, heartbeat, listeners, node, upstream
from gateway.config.loader import (
    PROJECT_ROOT,
    ConfigPaths,
    default_paths,
    load,
    load_config,
)
from gateway.config.refusal import BootRefused, refusing_boot
from gateway.config.schema import Source

SYS_CONFIG = PROJECT_ROOT / "sys_config"
VM_ARGS = SYS_CONFIG / "vm.args"
STRONG_COOKIE = "c0ffee" * 8  # 48 characters
COOKIE_ENV = {"YUZU_GW_COOKIE": STRONG_COOKIE}


def write(tmp_path: Path, text: str, name: str = "sys.config") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- shipped files -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sys.config", "sys.config.prod", "test.config"])
def test_every_shipped_config_loads(name: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    # The shipped vm.args names no host: the advertise address is the node's (formation on
    # any number of hosts with no edit).
    env = {**COOKIE_ENV, "YUZU_GW_ADVERTISE_ADDR": "10.0.0.7"}
    config, node_args = load(SYS_CONFIG / name, VM_ARGS, env)
    assert node_args.name == "yuzu_gw@10.0.0.7" and node_args.advertise
    assert "127.0.0.1" not in VM_ARGS.read_text()
    assert node_args.cookie == STRONG_COOKIE
    assert config[cluster.CLUSTER_SEED_DNS_NAME]
    # A shipped file sets nothing that needs a warning.
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_shipped_dev_and_test_configs_as_documented() -> None:
    dev = load_config(SYS_CONFIG / "sys.config", {})
    assert (dev[node.HEALTH_PORT], dev[node.PROMETHEUS_PORT]) == (8081, 9568)
    # The dev config has an agent listener (loopback), so it needs no listener acknowledgement.
    assert not dev[listeners.ALLOW_NO_LISTENERS] and dev[upstream.ALLOW_NO_UPSTREAM]
    assert [spec.name for spec in dev[listeners.GRPC_LISTENERS]] == ["agent", "mgmt"]
    test = load_config(SYS_CONFIG / "test.config", {})
    assert (test[node.HEALTH_PORT], test[node.PROMETHEUS_PORT]) == (0, 0)
    assert [spec.port for spec in test[listeners.GRPC_LISTENERS]] == [0, 0]
    prod = load_config(SYS_CONFIG / "sys.config.prod", {})
    # A deployment never acknowledges a missing listener or upstream channel.
    assert not prod[listeners.ALLOW_NO_LISTENERS] and not prod[upstream.ALLOW_NO_UPSTREAM]


def test_shipped_vm_args_takes_the_cookie_from_the_environment() -> None:
    _, node_args = load(SYS_CONFIG / "sys.config", VM_ARGS, COOKIE_ENV)
    assert node_args.cookie_variables == ("YUZU_GW_COOKIE",)


def test_shipped_vm_args_without_a_cookie_refuses() -> None:
    with pytest.raises(BootRefused) as caught:
        load(SYS_CONFIG / "sys.config", VM_ARGS, {})
    assert caught.value.defect == "default_cookie"


# -- default paths -------------------------------------------------------------------------------


def test_default_paths_are_the_shipped_files() -> None:
    assert default_paths({}) == ConfigPaths(SYS_CONFIG / "sys.config", SYS_CONFIG / "vm.args")


def test_default_paths_follow_the_variables(tmp_path: Path) -> None:
    env = {"YUZU_GW_CONFIG": str(tmp_path / "a.config"), "YUZU_GW_VM_ARGS": "rel/vm.args"}
    paths = default_paths(env, root=Path("/srv/yuzu"))
    assert paths == ConfigPaths(tmp_path / "a.config", Path("/srv/yuzu/rel/vm.args"))


# -- file shape ----------------------------------------------------------------------------------


def test_node_name_in_the_config_wins_over_vm_args(tmp_path: Path) -> None:
    path = write(
        tmp_path, "[{yuzu_gw, [{node_name, 'gw2@10.0.0.2'}, {allow_no_listeners, true}]}]."
    )
    _, node_args = load(path, VM_ARGS, COOKIE_ENV)
    assert (node_args.name, node_args.name_source) == ("gw2@10.0.0.2", "config node_name")


def test_a_syntax_error_refuses_with_file_line_and_column(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, "[{yuzu_gw, [\n  {health_port, 8081}\n  {prometheus_port, 9568}\n]}].")
    with pytest.raises(BootRefused) as caught, refusing_boot():
        load_config(path, {})
    assert caught.value.defect == "config_syntax"
    assert caught.value.detail.startswith(f"{path}:3:3: expected ',' or ']'")
    [record] = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert record.getMessage() == caught.value.log_line()
    assert f"{path}:3:3" in record.getMessage()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "% nothing but a comment\n",
        "[{yuzu_gw, []}]. [].",
        "{yuzu_gw, []}.",
        "[yuzu_gw].",
        "[{yuzu_gw, #{}}].",
        '[{"yuzu_gw", []}].',
        '["other.config"].',
    ],
)
def test_a_file_of_the_wrong_shape_refuses(tmp_path: Path, text: str) -> None:
    with pytest.raises(BootRefused) as caught:
        load_config(write(tmp_path, text), {})
    assert caught.value.defect == "config_shape"


def test_two_sections_for_one_application_refuse(tmp_path: Path) -> None:
    with pytest.raises(BootRefused) as caught:
        load_config(write(tmp_path, "[{yuzu_gw, []}, {yuzu_gw, []}]."), {})
    assert caught.value.defect == "duplicate_keys"


def test_a_missing_file_refuses(tmp_path: Path) -> None:
    with pytest.raises(BootRefused) as caught:
        load_config(tmp_path / "absent.config", {})
    assert caught.value.defect == "config_unreadable"


def test_other_sections_are_ignored_with_one_info_line_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    path = write(
        tmp_path,
        "[{kernel, [{inet_dist_listen_min, 9100}]}, {logger, []},"
        " {yuzu_gw, [{heartbeat_batch_interval_ms, 250}, {allow_no_listeners, true}]},"
        " {grpcbox, []}].",
    )
    config = load_config(path, {})
    assert config[heartbeat.HEARTBEAT_BATCH_INTERVAL_MS] == 250
    assert config.source_of(heartbeat.HEARTBEAT_BATCH_INTERVAL_MS) is Source.APP_ENV
    ignored = [r.getMessage() for r in caplog.records if "Ignoring the" in r.getMessage()]
    assert len(ignored) == 3
    assert all(r.levelno == logging.INFO for r in caplog.records)


def test_a_file_without_a_yuzu_gw_section_gives_the_defaults(tmp_path: Path) -> None:
    # The defaults have no agent listener, so such a file refuses boot (no_listeners): the
    # listener checks are the schema's last step, after every key got its default.
    with pytest.raises(BootRefused) as caught:
        load_config(write(tmp_path, "[]."), {})
    assert caught.value.defect == "no_listeners"
    path = write(tmp_path, "[{yuzu_gw, [{allow_no_listeners, true}]}].")
    assert load_config(path, {})[node.HEALTH_PORT] == 8081


@pytest.mark.parametrize("block", ["servers", "client"])
def test_a_leftover_grpcbox_block_refuses(tmp_path: Path, block: str) -> None:
    path = write(tmp_path, f"[{{grpcbox, [{{{block}, [x]}}]}}, {{yuzu_gw, []}}].")
    with pytest.raises(BootRefused) as caught:
        load_config(path, {})
    assert caught.value.defect == "legacy_grpcbox_config"
    assert block in caught.value.detail
