"""The operator CLIs' conveniences: environment defaults of the connection options,
`--version` on every entry point, `send --help`, `python -m gateway --help`, `rel/yuzu_gw help`
and the shell completion generated from the parsers (gateway/ctl/completion.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.ctl.cli import CA_ENV, CERT_ENV, KEY_ENV, TARGET_ENV, Completion, parse, parser
from gateway.ctl.completion import levels, script
from gateway.node.version import version

ROOT = Path(__file__).resolve().parents[4]


def test_the_environment_gives_the_connection_defaults_and_the_command_line_wins() -> None:
    env = {TARGET_ENV: "gw.example:7000", CA_ENV: "ca.pem", CERT_ENV: "c.pem", KEY_ENV: "c.key"}
    connection = parse(["agents", "list"], env=env).connection
    assert (connection.host, connection.port) == ("gw.example", 7000)
    assert (connection.ca, connection.cert, connection.key) == (
        Path("ca.pem"),
        Path("c.pem"),
        Path("c.key"),
    )
    given = parse(["agents", "list", "--target", "other:1", "--ca", "x.pem"], env=env).connection
    assert (given.host, given.port, given.ca) == ("other", 1, Path("x.pem"))
    # Empty is unset.
    assert parse(["watch"], env={TARGET_ENV: ""}).connection.port == 50063


def test_a_bad_environment_default_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(["watch"], env={TARGET_ENV: "nocolon"})
    assert exited.value.code == 2
    assert "'nocolon' is not HOST:PORT" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["watch"], env={CERT_ENV: "c.pem"})
    assert KEY_ENV in capsys.readouterr().err


def test_send_help_explains_the_words(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(["send", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for word in ("ID ", "PLUGIN ", "ACTION ", "KEY=VALUE "):
        assert f"\n  {word}" in out


def test_completion_is_a_command_that_connects_nowhere() -> None:
    assert parse(["completion", "zsh"]).command == Completion("zsh")


def test_the_completion_tree_is_the_parsers() -> None:
    tree = {level.path: level for level in levels(parser())}
    assert tree[()].commands == ("agents", "send", "watch", "completion")
    assert tree[("agents",)].commands == ("list", "get")
    assert "--cursor" in tree[("agents", "list")].valued
    assert set(tree[()].files) == {"--ca", "--cert", "--key"}
    assert "--all" in tree[("send",)].options and "--all" not in tree[("send",)].valued


def _complete(words: list[str], shell_script: str) -> list[str]:
    line = " ".join(f"'{w}'" for w in words)
    program = f"{shell_script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}\n"
    program += '_yuzu_gw_ctl_complete; printf "%s\\n" "${COMPREPLY[@]}"\n'
    done = subprocess.run(
        ["bash", "--norc", "-c", program], capture_output=True, text=True, timeout=10, check=True
    )
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_commands_options_and_files(tmp_path: Path) -> None:
    text = script(parser(), "yuzu-gw-ctl", "bash")
    assert _complete(["yuzu-gw-ctl", ""], text)[:3] == ["agents", "send", "watch"]
    assert _complete(["yuzu-gw-ctl", "--target", "gw:1", "agents", "l"], text) == ["list"]
    assert "--cursor" in _complete(["yuzu-gw-ctl", "agents", "list", "--"], text)
    assert _complete(["yuzu-gw-ctl", "send", "--comm"], text) == ["--command-id"]
    (tmp_path / "ca.pem").write_text("")
    assert _complete(["yuzu-gw-ctl", "--ca", f"{tmp_path}/c"], text) == [f"{tmp_path}/ca.pem"]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
    )


@pytest.mark.parametrize(
    "module",
    [
        "gateway",
        "gateway.cli",
        "gateway.ctl",
        "gateway.release",
        "gateway.devstack",
        "gateway.devstack.fake_upstream",
    ],
)
def test_every_entry_point_has_version(module: str) -> None:
    done = _run(sys.executable, "-m", module, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f" {version()}")


def test_python_m_gateway_help_boots_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "--help"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "YUZU_GW_RUN_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("usage: python -m gateway")
    assert list(tmp_path.iterdir()) == []  # no pid file, no console socket: nothing booted


def test_rel_yuzu_gw_help_and_version(tmp_path: Path) -> None:
    script_path = str(ROOT / "rel" / "yuzu_gw")
    done = _run(script_path, "help")
    assert done.returncode == 0 and done.stderr == ""
    for command in (
        "foreground",
        "start",
        "stop",
        "restart",
        "ping",
        "status",
        "remote_console",
        "eval",
        "devstack",
    ):
        assert f"\n  {command}" in done.stdout
    assert _run(script_path, "--version").stdout == f"yuzu_gw {version()}\n"
    assert _run(script_path, "bogus").returncode == 2
