"""The advertise address (gateway/config/advertise.py and local_host.py; docs/cluster.md):
the seed's order as a pure function (hypothesis), the interface addresses read from
/proc/net/fib_trie, the vm.args line that opts in, and boot and the release supervisor
agreeing on the name."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import local_host
from gateway.config.advertise import ADVERTISE_VAR, FALLBACK_ADDR, LocalHost, Step, choose
from gateway.config.loader import PROJECT_ROOT, load
from gateway.config.local_host import bounded_resolver, local_ipv4_addrs, parse_fib_trie
from gateway.config.refusal import BootRefused
from gateway.release.plan import pin_advertise, plan
from tests.unit.gateway.config.test_config_cookie import vm_args

ADVERTISED = "-name gw@${YUZU_GW_ADVERTISE_ADDR}\n-setcookie ${YUZU_GW_COOKIE}\n"
COOKIE_ENV = {"YUZU_GW_COOKIE": "c0ffee" * 8}
TEST_CONFIG = PROJECT_ROOT / "sys_config" / "test.config"

# /proc/net/fib_trie of a container on a Compose network (its address 172.18.0.3) with a
# secondary address 10.1.0.7 on the same interface.
FIB_TRIE = """\
Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 172.18.0.0/16 2 0 2
        |-- 172.18.0.0
           /16 link UNICAST
        |-- 172.18.0.3
           /32 host LOCAL
        |-- 10.1.0.7
           /32 host LOCAL
        |-- 172.18.255.255
           /32 link BROADCAST
Local:
  +-- 0.0.0.0/0 3 0 5
     |-- 127.0.0.1
        /32 host LOCAL
"""

addrs = st.ip_addresses(v=4).map(str)
names = st.sampled_from(["gateway", "gw-a", "gw-b", "10.0.0.1", "host"])


def host_of(table: dict[str, list[str]], local: set[str], hostname: str) -> LocalHost:
    return LocalHost(lambda name: table.get(name, []), frozenset(local), hostname)


# -- the order -------------------------------------------------------------------------------------


@given(
    explicit=st.one_of(st.none(), st.just(""), addrs),
    seed_hosts=st.lists(names, max_size=4),
    seed_name=names,
    table=st.dictionaries(names, st.lists(addrs, max_size=3)),
    local=st.sets(addrs, max_size=4),
    hostname=names,
    lucky=st.booleans(),
)
def test_the_first_step_that_finds_an_address_wins(
    *,
    explicit: str | None,
    seed_hosts: list[str],
    seed_name: str,
    table: dict[str, list[str]],
    local: set[str],
    hostname: str,
    lucky: bool,
) -> None:
    if lucky and table:  # often enough, one of the resolved addresses is this host's
        local.add(next(iter(a for values in table.values() for a in values), FALLBACK_ADDR))
    found = choose(explicit, seed_hosts, seed_name, host_of(table, local, hostname))
    if explicit:
        assert (found.addr, found.step) == (explicit, Step.EXPLICIT)
        return
    # The seed list, when there is one, replaces the seed name (as discovery does).
    dialled = seed_hosts or [seed_name]
    candidates = [a for name in dialled for a in table.get(name, [])]
    mine = [a for a in candidates if a in local]
    if mine:
        assert found.addr == mine[0]
        assert found.step is (Step.SEED_NODES if seed_hosts else Step.SEED_NAME)
    elif table.get(hostname):
        assert (found.addr, found.step) == (table[hostname][0], Step.HOSTNAME)
    else:
        assert (found.addr, found.step) == (FALLBACK_ADDR, Step.DEFAULT)


def test_a_compose_replica_finds_its_own_record_of_the_seed_name() -> None:
    table = {"gateway": ["172.18.0.2", "172.18.0.3", "172.18.0.4"], "c0ffee": ["172.18.0.3"]}
    local = {"127.0.0.1", "172.18.0.3"}
    found = choose(None, [], "gateway", host_of(table, local, "c0ffee"))
    assert (found.addr, found.step) == ("172.18.0.3", Step.SEED_NAME)


def test_with_a_seed_list_the_seed_name_is_not_asked() -> None:
    asked: list[str] = []

    def resolve(name: str) -> list[str]:
        asked.append(name)
        return [name] if name[0].isdigit() else []

    host = LocalHost(resolve, frozenset({"10.0.0.6"}), "vm")
    found = choose(None, ["10.0.0.5", "10.0.0.6"], "gateway", host)
    assert (found.addr, found.step) == ("10.0.0.6", Step.SEED_NODES)
    assert asked == ["10.0.0.5", "10.0.0.6"]


# -- the host, read for real ---------------------------------------------------------------------


def test_fib_trie_leaves_with_a_host_route_are_the_addresses() -> None:
    # 127.0.0.0 (/8 host LOCAL) is a network; the broadcast and network leaves are not local.
    assert parse_fib_trie(FIB_TRIE) == {"127.0.0.1", "172.18.0.3", "10.1.0.7"}
    assert parse_fib_trie("") == frozenset()


def test_no_fib_trie_means_no_interface_addresses(tmp_path: Path) -> None:
    assert local_ipv4_addrs(tmp_path / "absent") == frozenset()


@pytest.mark.skipif(not local_host.FIB_TRIE.exists(), reason="no /proc/net/fib_trie")
def test_this_host_has_its_loopback_address() -> None:
    assert "127.0.0.1" in local_ipv4_addrs()


def test_resolution_is_ipv4_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert bounded_resolver()("127.0.0.1") == ("127.0.0.1",)
    assert bounded_resolver()("no-such-host.invalid") == ()

    def hung(*_args: object, **_kwargs: object) -> list[object]:
        time.sleep(5)
        return []

    monkeypatch.setattr(socket, "getaddrinfo", hung)
    resolve = bounded_resolver(0.2)
    start = time.monotonic()
    assert (resolve("gateway"), resolve("vm")) == ((), ())
    # Both lookups together within the one budget.
    assert time.monotonic() - start < 1.0


# -- opting in: vm.args, boot, the release supervisor ----------------------------------------------


def test_only_the_advertise_variable_may_leave_the_host_empty(tmp_path: Path) -> None:
    unset = vm_args(tmp_path, ADVERTISED)
    assert (unset.name, unset.advertise) == ("gw@", True)
    given_addr = vm_args(tmp_path, ADVERTISED, {ADVERTISE_VAR: "10.0.0.5"})
    assert (given_addr.name, given_addr.advertise) == ("gw@10.0.0.5", True)
    assert not vm_args(tmp_path, "-name gw@10.0.0.5\n").advertise
    # The host must be the variable alone.
    suffixed = vm_args(tmp_path, "-name gw@${YUZU_GW_ADVERTISE_ADDR}x\n")
    assert (suffixed.name, suffixed.advertise) == ("gw@x", False)
    # Any other empty host is still a broken name.
    for text in ("-name gw@\n", "-name gw@${OTHER}\n"):
        with pytest.raises(BootRefused) as caught:
            vm_args(tmp_path, text)
        assert caught.value.defect == "invalid_node_name"


def boot(tmp_path: Path, config_text: str, env: dict[str, str]) -> str:
    config = tmp_path / "advertise.config"
    config.write_text(config_text)
    path = tmp_path / "vm.args"
    path.write_text(ADVERTISED)
    _config, node = load(config, path, {**COOKIE_ENV, **env})
    return node.name


def test_boot_names_the_node_with_the_address_found(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="yuzu_gw.cluster")
    text = TEST_CONFIG.read_text()
    # YUZU_GW_ADVERTISE_ADDR wins outright.
    assert boot(tmp_path, text, {ADVERTISE_VAR: "10.9.8.7"}) == "gw@10.9.8.7"
    # Unset: test.config's seed name is localhost, whose record is on this host's loopback
    # (on Linux; elsewhere the host name, then the default, decide).
    name = boot(tmp_path, text, {})
    seeds = '{cluster_seed_nodes, [<<"127.0.0.1:9101">>]}'
    seeded = text.replace("{cluster_seed_nodes, []}", seeds)
    from_list = boot(tmp_path, seeded, {})
    named = text.replace("{cluster_id,", "{node_name, 'other@10.0.0.9'},\n{cluster_id,")
    assert boot(tmp_path, named, {}) == "other@10.0.0.9"
    lines = [r.getMessage() for r in caplog.records if r.name == "yuzu_gw.cluster"]
    assert lines[0] == f"Advertise address 10.9.8.7: {Step.EXPLICIT.value}"
    if local_host.FIB_TRIE.exists():
        assert name == from_list == "gw@127.0.0.1"
        assert lines[1:] == [
            f"Advertise address 127.0.0.1: {Step.SEED_NAME.value}",
            f"Advertise address 127.0.0.1: {Step.SEED_NODES.value}",
        ]
    # node_name wins over vm.args: nothing to find, nothing logged.
    assert len(lines) == 3


def test_the_supervisor_hands_its_nodes_the_address_it_found(tmp_path: Path) -> None:
    config = tmp_path / "advertise.config"
    config.write_text(TEST_CONFIG.read_text())
    path = tmp_path / "vm.args"
    path.write_text(ADVERTISED)
    loaded, node = load(config, path, COOKIE_ENV)
    host = node.name.partition("@")[2]
    assert host
    pinned = pin_advertise(COOKIE_ENV, node)
    assert pinned == {**COOKIE_ENV, ADVERTISE_VAR: host}
    # Each node then boots at step 1, under the name nodes.json records.
    _, again = load(config, path, pinned)
    assert [p.name for p in plan(loaded, again, 2)] == [f"gw-1@{host}", f"gw-2@{host}"]
    assert [p.name for p in plan(loaded, node, 2)] == [f"gw-1@{host}", f"gw-2@{host}"]
    plain = tmp_path / "plain.args"
    plain.write_text("-name gw@10.0.0.5\n-setcookie ${YUZU_GW_COOKIE}\n")
    _, fixed = load(config, plain, COOKIE_ENV)
    assert pin_advertise(COOKIE_ENV, fixed) == COOKIE_ENV
