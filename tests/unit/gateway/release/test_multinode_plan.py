"""Several nodes per host, the pure part: node names, per-node ports, the node's environment,
and boot applying the same plan the release supervisor records (gateway/node/multinode.py,
gateway/release/plan.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config.keys.cluster import CLUSTER_PORT
from gateway.config.keys.node import HEALTH_PORT, PROMETHEUS_PORT
from gateway.config.keys.shedder import MEMORY_SHEDDING
from gateway.config.refusal import BootRefused
from gateway.config.schema import Source
from gateway.listeners.server import REUSEPORT_VAR
from gateway.node.boot import prepare
from gateway.node.multinode import (
    MAX_NODES,
    NODE_COUNT_VAR,
    NODE_INDEX_VAR,
    indexed_name,
    offset_port,
)
from gateway.release import plan as release_plan
from gateway.release.plan import NodePlan, node_env, parse_count
from tests.support.node import node_env as support_env

PORTS = """[{yuzu_gw, [{health_port, 8081}, {prometheus_port, 9568}, {cluster_port, 9100},
 {allow_no_listeners, true}, {allow_no_upstream, true}]}]."""


def test_node_names_append_the_index_to_the_short_name_and_keep_the_host() -> None:
    assert indexed_name("yuzu_gw@127.0.0.1", 1) == "yuzu_gw-1@127.0.0.1"
    assert indexed_name("gw_a@10.0.0.5", 12) == "gw_a-12@10.0.0.5"


@given(st.integers(1, 65535), st.integers(1, MAX_NODES))
def test_ports_are_offset_by_index_minus_one_or_refused_past_65535(port: int, index: int) -> None:
    if port + index - 1 > 65535:
        with pytest.raises(ValueError):
            offset_port(port, index)
    else:
        assert offset_port(port, index) == port + index - 1


def test_port_zero_stays_zero_for_every_node() -> None:
    assert [offset_port(0, k) for k in (1, 2, 3)] == [0, 0, 0]


@pytest.mark.parametrize(
    ("text", "cpus", "count"), [("1", 8, 1), ("3", 8, 3), ("auto", 4, 4), ("auto", 0, 1)]
)
def test_node_count_is_a_count_or_one_per_core(text: str, cpus: int, count: int) -> None:
    assert parse_count(text, cpus) == count


@pytest.mark.parametrize("text", ["0", "-1", "two", "", str(MAX_NODES + 1), "1.5"])
def test_a_bad_node_count_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--nodes"):
        parse_count(text, 4)


def test_each_node_gets_its_index_and_shared_ports_but_never_the_clients_name() -> None:
    base = {"YUZU_GW_COOKIE": "c" * 64, "YUZU_GW_NODE_NAME": "yuzu_gw", "PATH": "/bin"}
    env = node_env(base, 2, 3)
    assert env[NODE_INDEX_VAR] == "2" and env[NODE_COUNT_VAR] == "3" and env[REUSEPORT_VAR] == "1"
    assert "YUZU_GW_NODE_NAME" not in env
    assert env["YUZU_GW_COOKIE"] == base["YUZU_GW_COOKIE"] and env["PATH"] == "/bin"
    assert base["YUZU_GW_NODE_NAME"] == "yuzu_gw"  # the supervisor's own is untouched


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "ports.config"
    path.write_text(PORTS)
    return path


def test_the_plan_and_the_booted_node_agree(tmp_path: Path) -> None:
    env = support_env(tmp_path, _config(tmp_path))
    single = prepare(env)
    plans = release_plan.plan(single.config, single.node, 3)
    assert plans == (
        NodePlan(1, "yuzu_gw-1@127.0.0.1", 8081, 9568, 9100),
        NodePlan(2, "yuzu_gw-2@127.0.0.1", 8082, 9569, 9101),
        NodePlan(3, "yuzu_gw-3@127.0.0.1", 8083, 9570, 9102),
    )
    for node_plan in plans:
        ctx = prepare({**env, **node_env({}, node_plan.index, 3)})
        assert ctx.node.name == node_plan.name
        assert (ctx.node.index, ctx.node.host_nodes) == (node_plan.index, 3)
        assert ctx.node.short_name == node_plan.short_name
        assert ctx.config[HEALTH_PORT] == node_plan.health_port
        assert ctx.config[PROMETHEUS_PORT] == node_plan.prometheus_port
        assert ctx.config[CLUSTER_PORT] == node_plan.cluster_port
        assert ctx.config.source_of(HEALTH_PORT) is Source.ENV


def test_each_node_sheds_at_its_share_of_the_memory_limit(tmp_path: Path) -> None:
    env = support_env(tmp_path, _config(tmp_path))
    whole = prepare(env).config[MEMORY_SHEDDING].plan
    node = prepare({**env, **node_env({}, 2, 4)}).config[MEMORY_SHEDDING].plan
    assert whole is not None and node is not None and whole.limit is not None
    assert whole.marks is not None and node.marks is not None
    assert (whole.nodes, node.nodes, node.limit) == (1, 4, whole.limit)
    share = whole.limit.limit_bytes // 4
    assert node.marks.high.bytes == int(0.75 * share)
    assert node.marks.low.bytes == int(0.65 * share)


def test_without_an_index_boot_is_unchanged(tmp_path: Path) -> None:
    ctx = prepare(support_env(tmp_path, _config(tmp_path)))
    assert ctx.node.name == "yuzu_gw@127.0.0.1"
    assert (ctx.node.index, ctx.node.host_nodes) == (1, 1)
    assert (ctx.config[HEALTH_PORT], ctx.config[PROMETHEUS_PORT]) == (8081, 9568)
    assert ctx.config[CLUSTER_PORT] == 9100


@pytest.mark.parametrize("index", ["0", "x", "-2", str(MAX_NODES + 1)])
def test_a_bad_index_refuses_boot(tmp_path: Path, index: str) -> None:
    env = {**support_env(tmp_path, _config(tmp_path)), NODE_INDEX_VAR: index}
    with pytest.raises(BootRefused) as refused:
        prepare(env)
    assert refused.value.defect == "invalid_node_index"


def test_an_index_without_a_count_names_the_nodes_up_to_it(tmp_path: Path) -> None:
    ctx = prepare({**support_env(tmp_path, _config(tmp_path)), NODE_INDEX_VAR: "2"})
    assert (ctx.node.index, ctx.node.host_nodes) == (2, 2)


@pytest.mark.parametrize("count", ["1", "x", "0", str(MAX_NODES + 1)])
def test_a_count_below_the_index_or_out_of_range_refuses_boot(tmp_path: Path, count: str) -> None:
    env = {**support_env(tmp_path, _config(tmp_path)), NODE_INDEX_VAR: "2", NODE_COUNT_VAR: count}
    with pytest.raises(BootRefused) as refused:
        prepare(env)
    assert refused.value.defect == "invalid_node_index"


def test_a_node_whose_port_would_pass_65535_refuses_boot(tmp_path: Path) -> None:
    config = tmp_path / "high.config"
    config.write_text(PORTS.replace("9568", "65535"))
    env = support_env(tmp_path, config)
    assert prepare({**env, NODE_INDEX_VAR: "1"}).config[PROMETHEUS_PORT] == 65535
    with pytest.raises(BootRefused, match="prometheus_port"):
        prepare({**env, NODE_INDEX_VAR: "2"})
