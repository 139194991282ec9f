"""End to end: the root supervisor's restart intensity (seed: "OTP Process Model", 10 restarts
in 60 s; "When an agent's owner process crashes", step 5: the gateway supervisor's own limit
stops the application and systemd restarts it). A real node in a subprocess; one permanent
child of `gateway_sup` is killed 11 times through the remote console, and the node must exit 2
with its log lines and leave no pid file that says it still runs (docs/release.md)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.__main__ import EXIT_TREE_ENDED
from gateway.console.client import one_shot
from gateway.node.tree import ROOT_INTENSITY
from tests.support.node import ROOT, node_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

BOOT_S = 30.0
EXIT_S = 30.0
# A permanent child that nothing else needs while it restarts.
VICTIM = "router"
# Run in the node as a task, so the eval answers before the last kill ends the console too.
KILLER = f"""
async def _kill_repeatedly():
    for _ in range({ROOT_INTENSITY + 1}):
        while (victim := runtime.whereis({VICTIM!r})) is None:
            await asyncio.sleep(0.01)
        runtime.kill(victim)
        await asyncio.sleep(0.05)

_killer = asyncio.get_running_loop().create_task(_kill_repeatedly())
"""


def wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + BOOT_S
    while not path.exists():
        assert proc.poll() is None, "the node ended during boot"
        assert time.monotonic() < deadline, f"no {path.name} after {BOOT_S} s"
        time.sleep(0.05)


def test_a_child_killed_past_the_root_intensity_ends_the_node(tmp_path: Path) -> None:
    env = {**os.environ, **node_env(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid_file, console = tmp_path / "yuzu_gw.pid", tmp_path / "yuzu_gw.console"
        wait_for(pid_file, proc)
        wait_for(console, proc)
        reply = asyncio.run(one_shot(console, env["YUZU_GW_COOKIE"], "eval", KILLER))
        assert reply["ok"] and "raised" not in reply, reply

        status = proc.wait(timeout=EXIT_S)
        log = proc.stderr.read() if proc.stderr else ""
        assert status == EXIT_TREE_ENDED == 2, log
        assert (
            f"supervisor gateway_sup: reached_max_restart_intensity ({ROOT_INTENSITY} restarts"
            in log
        ), log
        assert "node yuzu_gw@127.0.0.1: gateway_sup ended: reached_max_restart_intensity" in log
        # One line a kill: the restarts it allowed and the one past its intensity.
        killed = f"supervisor gateway_sup: child {VICTIM} (Router) ended: killed"
        assert log.count(killed) == ROOT_INTENSITY + 1, log
        assert not pid_file.exists(), "a stale pid file says the node still runs"
        assert not console.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
