"""yuzu-gw-ctl's command line (gateway/ctl/cli.py): what each form parses into, the usage
errors (exit 2), KEY=VALUE parameters and the requests built from them."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.ctl.cli import (
    DEFAULT_TIMEOUT_S,
    Connection,
    GetAgent,
    ListAgents,
    Send,
    Watch,
    list_request,
    parse,
    parse_parameters,
    parse_target,
    send_request,
    split_send_words,
)
from protos.typed.yuzu.agent.v1 import CommandRequest
from protos.typed.yuzu.server.v1 import ListAgentsRequest, SendCommandRequest


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


# -- the connection ----------------------------------------------------------------------------


def test_defaults_are_the_dev_configs_plaintext_management_listener() -> None:
    invocation = parse(["agents", "list"])
    assert invocation.connection == Connection("127.0.0.1", 50063, DEFAULT_TIMEOUT_S)
    assert not invocation.connection.tls and not invocation.json
    assert invocation.command == ListAgents()


def test_connection_options_stand_before_or_after_the_command_words() -> None:
    before = parse(["--target", "gw:1", "--ca", "ca.pem", "--json", "agents", "get", "a1"])
    after = parse(["agents", "get", "a1", "--target", "gw:1", "--ca", "ca.pem", "--json"])
    assert before == after
    assert before.connection.target == "gw:1" and before.connection.tls and before.json
    assert before.command == GetAgent("a1")
    # An option given before the command words survives the subcommand's parsing.
    assert parse(["--json", "--timeout", "3", "watch"]).json
    assert parse(["--timeout", "3", "watch"]).connection.timeout_s == 3.0
    assert parse(["watch", "--timeout", "4"]).connection.timeout_s == 4.0


def test_mutual_tls_needs_the_certificate_and_its_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    full = parse(["--cert", "c.pem", "--key", "c.key", "watch"]).connection
    assert full.tls and full.cert == Path("c.pem") and full.key == Path("c.key")
    assert "--cert and --key go together" in usage_error(["--cert", "c.pem", "watch"], capsys)
    assert "--cert and --key go together" in usage_error(["--key", "c.key", "watch"], capsys)


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("127.0.0.1:50063", "127.0.0.1", 50063),
        ("gw.example:1", "gw.example", 1),
        ("[::1]:50063", "::1", 50063),
    ],
)
def test_targets(text: str, host: str, port: int) -> None:
    assert parse_target(text) == (host, port)
    assert Connection(host, port).target == text


@pytest.mark.parametrize("text", ["gw", ":50063", "gw:", "gw:0", "gw:65536", "gw:x", "::1:5"])
def test_bad_targets_are_usage_errors(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "--target" in usage_error(["--target", text, "watch"], capsys)


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_timeout_must_be_positive_seconds(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    usage_error(["--timeout", value, "watch"], capsys)


# -- agents ------------------------------------------------------------------------------------


def test_agents_list_pages() -> None:
    assert parse(["agents", "list"]).command.page_size == 100  # type: ignore[union-attr]
    every = parse(["agents", "list", "--all"]).command
    assert every == ListAgents(all=True) and every.page_size == 1000  # type: ignore[union-attr]
    some = parse(["agents", "list", "--limit", "7", "--cursor", "a9"]).command
    assert some == ListAgents(limit=7, cursor="a9")
    assert list_request(some, "a9") == ListAgentsRequest(limit=7, cursor="a9")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "argv",
    [
        ["agents", "list", "--limit", "0"],
        ["agents", "list", "--limit", "1001"],
        ["agents", "list", "--all", "--cursor", "a1"],
        ["agents", "get"],
        ["agents"],
        [],
    ],
)
def test_agents_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    usage_error(argv, capsys)


# -- send --------------------------------------------------------------------------------------


def test_send_to_named_agents_with_parameters() -> None:
    argv = ["send", "a1", "a2", "shell", "run", "cmd=ls -l", "env=A=1", "empty=", "--timeout"]
    invocation = parse([*argv, "30", "--command-id", "c-7"])
    assert invocation.command == Send(
        agent_ids=("a1", "a2"),
        plugin="shell",
        action="run",
        parameters=(("cmd", "ls -l"), ("env", "A=1"), ("empty", "")),
        timeout_s=30,
        command_id="c-7",
    )
    request = send_request(invocation.command)  # type: ignore[arg-type]
    expected = SendCommandRequest(
        agent_ids=["a1", "a2"],
        timeout_seconds=30,
        command=CommandRequest(
            command_id="c-7",
            plugin="shell",
            action="run",
            parameters={"cmd": "ls -l", "env": "A=1", "empty": ""},
        ),
    )
    assert request == expected


def test_send_to_all_uses_no_agent_ids_a_new_id_and_the_gateways_default_timeout() -> None:
    invocation = parse(["--timeout", "2", "send", "--all", "os", "info"], new_id=lambda: "new")
    assert invocation.connection.timeout_s == 2.0  # before the words: the connect timeout
    assert invocation.command == Send((), "os", "info", (), None, "new")
    request = send_request(invocation.command)  # type: ignore[arg-type]
    assert list(request.agent_ids) == [] and request.timeout_seconds == 0
    assert request.command.command_id == "new"
    ids = {parse(["send", "--all", "os", "info"]).command.command_id for _ in range(3)}  # type: ignore[union-attr]
    assert len(ids) == 3


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["send", "os", "info"], "name the target agent ids, or --all"),
        (["send", "--all", "a1", "os", "info"], "agent ids or --all, not both"),
        (["send", "--all", "os"], "name a PLUGIN and an ACTION"),
        (["send", "--all", "os", "k=v"], "name a PLUGIN and an ACTION"),
        (["send", "a1", "os", "info", "=v"], "has an empty key"),
        (["send", "a1", "os", "info", "k=1", "k=2"], "given twice"),
        (["send", "--all", "os", "info", "--timeout", "0"], "--timeout"),
        (["send", "--all", "os", "info", "--timeout", "3601"], "--timeout"),
    ],
)
def test_send_usage_errors(argv: list[str], why: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert why in usage_error(argv, capsys)


def test_watch_every_agent_or_some() -> None:
    assert parse(["watch"]).command == Watch()
    assert parse(["watch", "a1", "a2"]).command == Watch(("a1", "a2"))


# -- properties --------------------------------------------------------------------------------

keys = st.text(min_size=1).filter(lambda k: "=" not in k)


@given(st.dictionaries(keys, st.text()))
def test_parameters_round_trip(parameters: dict[str, str]) -> None:
    words = [f"{key}={value}" for key, value in parameters.items()]
    assert dict(parse_parameters(words)) == parameters


@given(
    st.lists(st.text(min_size=1).filter(lambda w: "=" not in w), min_size=1, max_size=4),
    st.dictionaries(keys, st.text(), max_size=3),
)
def test_send_words_split_into_ids_plugin_action_and_parameters(
    ids: list[str], parameters: dict[str, str]
) -> None:
    words = [*ids, "plugin", "action", *(f"{k}={v}" for k, v in parameters.items())]
    assert split_send_words(words, everyone=False) == (
        tuple(ids),
        "plugin",
        "action",
        tuple(parameters.items()),
    )
    with pytest.raises(ValueError, match="not both"):
        split_send_words(words, everyone=True)
