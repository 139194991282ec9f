"""End to end: `rel/yuzu_gw` against a real node in a subprocess, as an operator uses it.

Each test gets its own run directory, configuration (free ports) and cookie, and kills the
node's process group in a `finally` whatever happened, so a failing test leaves nothing
running.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

# A zombie counts as gone: whoever inherited the detached node may reap it late.
from gateway.console.paths import alive as _alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "rel" / "yuzu_gw"
# Port 0: the kernel picks free ports, so this test never collides with another node.
CONFIG = """\
[{yuzu_gw, [
    {health_port, 0},
    {prometheus_port, 0},
    {shutdown_flush_budget_ms, 2000},
    {allow_no_listeners, true},
    {allow_no_upstream, true}
]}].
"""
# Bounds each command; `start` waits for the node itself (YUZU_GW_START_WAIT_S).
COMMAND_TIMEOUT_S = 60


@attrs.define
class Release:
    run_dir: Path
    env: dict[str, str]

    def run(
        self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env or self.env,
            cwd=self.run_dir.parent,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )

    @property
    def pid_file(self) -> Path:
        return self.run_dir / "yuzu_gw.pid"

    @property
    def socket(self) -> Path:
        return self.run_dir / "yuzu_gw.console"

    def pid(self) -> int:
        return int(self.pid_file.read_text())

    def kill_leftovers(self) -> None:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            # `start` runs the node under setsid: its process group is its own pid.
            os.killpg(self.pid(), signal.SIGKILL)


@pytest.fixture
def release(tmp_path: Path) -> Iterator[Release]:
    config = tmp_path / "sys.config"
    config.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("YUZU_GW_")}
    env.update(
        YUZU_GW_CONFIG=str(config),
        YUZU_GW_COOKIE=secrets.token_hex(32),
        # One host, on loopback: the shipped vm.args takes its host from here.
        YUZU_GW_ADVERTISE_ADDR="127.0.0.1",
        YUZU_GW_PYTHON=sys.executable,
        YUZU_GW_START_WAIT_S="30",
        YUZU_GW_STOP_TIMEOUT_S="30",
    )
    # Relative on purpose: the script must make it absolute for the detached node.
    env["YUZU_GW_RUN_DIR"] = "run"
    rel = Release(tmp_path / "run", env)
    try:
        yield rel
    finally:
        rel.kill_leftovers()


def test_start_ping_eval_console_stop(release: Release) -> None:
    started = release.run("start")
    assert started.returncode == 0, started.stderr + started.stdout
    assert "started" in started.stdout
    pid = release.pid()
    assert stat.S_IMODE(release.socket.stat().st_mode) == 0o600
    # A second start refuses: one node per name and run directory.
    again = release.run("start")
    assert again.returncode == 1 and "already running" in again.stderr

    ping = release.run("ping")
    assert (ping.returncode, ping.stdout) == (0, "pong\n")

    two = release.run("eval", "1+1")
    assert (two.returncode, two.stdout) == (0, "2\n")
    count = release.run("eval", "len(actors())")
    # gateway_sup, metrics, health, console at least.
    assert count.returncode == 0 and int(count.stdout) >= 4
    raised = release.run("eval", "1/0")
    assert raised.returncode == 4 and "ZeroDivisionError" in raised.stderr

    session = release.run(
        "remote_console",
        stdin='tree()\nstatus("health")\nmetrics("process_")\nmetrics("yuzu_gw_console")\nexit()\n',
    )
    assert session.returncode == 0, session.stderr
    out = session.stdout
    assert "remote console on yuzu_gw@127.0.0.1" in out
    assert re.search(r"gateway_sup <0\.\d+\.0> \(GatewaySup", out)
    assert "'endpoint': 'health'" in out
    assert "\nprocess_resident_memory_bytes " in out
    assert 'yuzu_gw_console_connections_total{mode="eval",outcome="ok"}' in out
    assert release.env["YUZU_GW_COOKIE"] not in out

    wrong = release.run("ping", env={**release.env, "YUZU_GW_COOKIE": "w" * 64})
    assert wrong.returncode == 3 and "wrong cookie" in wrong.stderr

    status = release.run("status")
    assert status.returncode == 0 and f"running (pid {pid}" in status.stdout

    stopped = release.run("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not _alive(pid)
    assert not release.pid_file.exists()
    assert not release.socket.exists()
    log = (release.run_dir / "yuzu_gw.log").read_text()
    assert release.env["YUZU_GW_COOKIE"] not in log

    after = release.run("status")
    assert after.returncode == 1 and "not running" in after.stdout
    assert release.run("ping").returncode == 1
    assert release.run("stop").returncode == 1


def test_no_cookie_is_refused_unless_a_trial_asks_for_one(release: Release) -> None:
    env = {k: v for k, v in release.env.items() if k != "YUZU_GW_COOKIE"}
    cookie_file = release.run_dir / "cookie"
    # Fail closed (seed "Distribution Cookie (Required in Production)"): nothing invented.
    refused = release.run("start", env=env)
    assert refused.returncode == 1
    assert "default_cookie" in refused.stderr
    assert not cookie_file.exists() and not release.pid_file.exists()

    env["YUZU_GW_ALLOW_DEFAULT_COOKIE"] = "1"
    started = release.run("start", env=env)
    assert started.returncode == 0, started.stderr + started.stdout
    assert f"generated a trial cookie in {cookie_file}" in started.stderr
    assert stat.S_IMODE(cookie_file.stat().st_mode) == 0o600
    assert re.fullmatch(r"[0-9a-f]{64}\n", cookie_file.read_text())
    # Clients without YUZU_GW_COOKIE read the file.
    assert release.run("ping", env=env).stdout == "pong\n"
    first = release.pid()

    restarted = release.run("restart", env=env)
    assert restarted.returncode == 0, restarted.stderr + restarted.stdout
    assert release.pid() != first and not _alive(first)
    # The same cookie on the second start: generated once, then reused.
    assert release.run("eval", "node.short_name", env=env).stdout == "'yuzu_gw'\n"
    assert release.run("stop", env=env).returncode == 0


def test_foreground_execs_the_node(release: Release) -> None:
    node = subprocess.Popen(
        [str(SCRIPT), "foreground"],
        env=release.env,
        cwd=release.run_dir.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while release.run("ping").returncode != 0:
            assert node.poll() is None, node.stderr.read() if node.stderr else ""
            assert time.monotonic() < deadline, "the node did not answer ping"
            time.sleep(0.2)
        # exec: the script's process *is* the node, so signals reach it directly.
        assert release.pid() == node.pid
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=30) == 0
        assert not release.pid_file.exists()
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()


def test_refused_boot_fails_start_with_the_log(release: Release) -> None:
    refused = release.run("start", env={**release.env, "YUZU_GW_COOKIE": "short"})
    assert refused.returncode == 1
    assert "did not start" in refused.stderr
    assert "short_cookie" in refused.stderr
    assert not release.pid_file.exists()
