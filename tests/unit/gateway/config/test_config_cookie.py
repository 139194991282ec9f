"""vm.args and the distribution cookie guard."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from gateway.config.cookie import MIN_COOKIE_CHARS, check_distribution_cookie
from gateway.config.refusal import BootRefused, refusing_boot
from gateway.config.vm_args import (
    DEFAULT_NODE_NAME,
    HISTORICAL_DEFAULT_COOKIE,
    CookieSource,
    NodeArgs,
    parse_vm_args,
)

SHIPPED_LIKE = "-name yuzu_gw@127.0.0.1\n-setcookie ${YUZU_GW_COOKIE}\n"


def vm_args(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> NodeArgs:
    path = tmp_path / "vm.args"
    path.write_text(text, encoding="utf-8")
    return parse_vm_args(path, env or {})


def guard(tmp_path: Path, env: dict[str, str], text: str = SHIPPED_LIKE) -> NodeArgs:
    node = vm_args(tmp_path, text, env)
    check_distribution_cookie(node, env)
    return node


# -- vm.args -------------------------------------------------------------------------------------


def test_vm_args_reads_name_and_cookie_and_skips_the_rest(tmp_path: Path) -> None:
    node = vm_args(
        tmp_path,
        "## comment\n+K true\n+A 64\n-name gw@10.0.0.1  # trailing comment\n"
        "-env ERL_MAX_PORTS 65536\n-setcookie ${COOKIE}${SUFFIX}\n",
        {"COOKIE": "abc", "SUFFIX": "def"},
    )
    assert (node.name, node.name_source) == ("gw@10.0.0.1", "vm.args -name")
    assert (node.cookie, node.cookie_source) == ("abcdef", CookieSource.ENV)
    assert node.cookie_variables == ("COOKIE", "SUFFIX")


def test_a_literal_cookie_comes_from_vm_args(tmp_path: Path) -> None:
    node = vm_args(tmp_path, "-setcookie literal-cookie\n")
    assert (node.cookie, node.cookie_source) == ("literal-cookie", CookieSource.VM_ARGS)
    assert node.name == DEFAULT_NODE_NAME


def test_an_unset_variable_leaves_the_historical_default(tmp_path: Path) -> None:
    node = vm_args(tmp_path, SHIPPED_LIKE, {})
    assert (node.cookie, node.cookie_source) == (HISTORICAL_DEFAULT_COOKIE, CookieSource.DEFAULT)


def test_sname_and_bare_name_take_this_host(tmp_path: Path) -> None:
    host = socket.gethostname()
    assert vm_args(tmp_path, "-sname gw\n").name == f"gw@{host.split('.')[0]}"
    assert vm_args(tmp_path, "-name gw\n").name == f"gw@{host}"


@pytest.mark.parametrize(
    ("text", "defect"),
    [("-name\n", "bad_vm_args"), ("-name gw@\n", "invalid_node_name"), ("-name a b@c\n", None)],
)
def test_bad_node_names_refuse(tmp_path: Path, text: str, defect: str | None) -> None:
    if defect is None:
        assert vm_args(tmp_path, text).name.startswith("a@")
        return
    with pytest.raises(BootRefused) as caught:
        vm_args(tmp_path, text)
    assert caught.value.defect == defect
    assert ":1:" in caught.value.detail


def test_a_missing_vm_args_refuses(tmp_path: Path) -> None:
    with pytest.raises(BootRefused) as caught:
        parse_vm_args(tmp_path / "absent", {})
    assert caught.value.defect == "config_unreadable"


def test_the_cookie_is_not_in_the_repr(tmp_path: Path) -> None:
    node = vm_args(tmp_path, SHIPPED_LIKE, {"YUZU_GW_COOKIE": "s3cr3t" * 6})
    assert "s3cr3t" not in repr(node)


# -- the guard -----------------------------------------------------------------------------------


@pytest.mark.parametrize("env", [{}, {"YUZU_GW_COOKIE": ""}])
def test_no_cookie_refuses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, env: dict[str, str]
) -> None:
    with pytest.raises(BootRefused) as caught, refusing_boot():
        guard(tmp_path, env)
    assert caught.value.defect == "default_cookie"
    assert "YUZU_GW_COOKIE" in caught.value.detail
    [critical] = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert critical.startswith("Refusing to start: default_cookie: ")
    assert HISTORICAL_DEFAULT_COOKIE not in critical


def test_the_historical_default_written_out_refuses(tmp_path: Path) -> None:
    with pytest.raises(BootRefused) as caught:
        guard(tmp_path, {"YUZU_GW_COOKIE": HISTORICAL_DEFAULT_COOKIE})
    assert caught.value.defect == "default_cookie"


def test_a_short_cookie_refuses_without_printing_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cookie = "k" * (MIN_COOKIE_CHARS - 1)
    with pytest.raises(BootRefused) as caught, refusing_boot():
        guard(tmp_path, {"YUZU_GW_COOKIE": cookie})
    assert caught.value.defect == "short_cookie"
    assert cookie not in caplog.text and cookie not in str(caught.value)
    assert str(MIN_COOKIE_CHARS - 1) not in str(caught.value)  # nor its length


def test_a_cookie_of_32_characters_passes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    guard(tmp_path, {"YUZU_GW_COOKIE": "k" * MIN_COOKIE_CHARS})
    assert caplog.records == []


@pytest.mark.parametrize("cookie", ["", HISTORICAL_DEFAULT_COOKIE, "tiny-c00kie"])
def test_the_dev_override_excuses_both_checks_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cookie: str
) -> None:
    guard(tmp_path, {"YUZU_GW_COOKIE": cookie, "YUZU_GW_ALLOW_DEFAULT_COOKIE": "1"})
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "never set it in production" in warning.getMessage()
    assert (cookie or HISTORICAL_DEFAULT_COOKIE) not in warning.getMessage()


@pytest.mark.parametrize("value", ["true", "yes", "0", " 1"])
def test_only_exactly_1_is_the_override(tmp_path: Path, value: str) -> None:
    with pytest.raises(BootRefused):
        guard(tmp_path, {"YUZU_GW_ALLOW_DEFAULT_COOKIE": value})
