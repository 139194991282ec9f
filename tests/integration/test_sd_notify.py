"""systemd's notify protocol against a real node (`python -m gateway`), with the test playing
systemd: a datagram unix socket named by NOTIFY_SOCKET, read here.

READY=1 comes once the listeners accept connections (its STATUS names them and they are
dialled), WATCHDOG=1 comes from the loop monitor when WATCHDOG_USEC is set, and SIGTERM gives
STOPPING=1 before the node exits 0 (gateway/node/sd_notify.py, docs/install.md)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.node import ROOT, node_env

pytestmark = pytest.mark.integration

BOOT_TIMEOUT_S = 30
STOP_TIMEOUT_S = 30
# 0.2 s: pings every 0.1 s, so a few arrive within any wait below.
WATCHDOG_USEC = 200_000


def _receive(sock: socket.socket, until: str, deadline: float) -> list[dict[str, str]]:
    """Every message up to and including the first that sets `until` (KEY=VALUE lines each)."""
    seen = []
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            raw = sock.recv(4096)
        except TimeoutError:
            raise AssertionError(f"no {until} within the time; got {seen}") from None
        message = dict(line.split("=", 1) for line in raw.decode().splitlines())
        seen.append(message)
        if until in message:
            return seen


def _listening(status: str) -> dict[str, int]:
    return {name: int(port) for name, port in re.findall(r"(\w+) [\d.]+:(\d+)", status)}


@pytest.mark.timeout(BOOT_TIMEOUT_S + STOP_TIMEOUT_S + 10)
def test_ready_watchdog_and_stopping(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    env = {
        **os.environ,
        **node_env(tmp_path / "run"),
        "NOTIFY_SOCKET": str(path),
        "WATCHDOG_USEC": str(WATCHDOG_USEC),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway"], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    try:
        before = _receive(sock, "READY", time.monotonic() + BOOT_TIMEOUT_S)
        ready = before[-1]
        assert int(ready["MAINPID"]) == proc.pid
        ports = _listening(ready["STATUS"])
        assert {"listener_agent", "listener_mgmt", "health", "metrics"} <= ports.keys()
        # Bound before READY=1: each accepts a connection now.
        for port in ports.values():
            socket.create_connection(("127.0.0.1", port), timeout=5).close()

        pings = _receive(sock, "WATCHDOG", time.monotonic() + 10)
        assert pings[-1] == {"WATCHDOG": "1"}

        proc.send_signal(signal.SIGTERM)
        after = _receive(sock, "STOPPING", time.monotonic() + STOP_TIMEOUT_S)
        assert after[-1]["STOPPING"] == "1"
        assert proc.wait(timeout=STOP_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
    log = proc.stderr.read() if proc.stderr else ""
    assert "systemd notify" not in log  # no warning: every datagram was delivered


@pytest.mark.timeout(BOOT_TIMEOUT_S + STOP_TIMEOUT_S + 10)
def test_no_watchdog_without_watchdog_usec_and_a_gone_socket_is_one_warning(
    tmp_path: Path,
) -> None:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    env = {**os.environ, **node_env(tmp_path / "run"), "NOTIFY_SOCKET": str(path)}
    env.pop("WATCHDOG_USEC", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway"], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    try:
        _receive(sock, "READY", time.monotonic() + BOOT_TIMEOUT_S)
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(4096)  # no WATCHDOG=1 comes
        # systemd gone: STOPPING=1 cannot be delivered, and the stop is still clean.
        sock.close()
        path.unlink()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STOP_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
    log = proc.stderr.read() if proc.stderr else ""
    assert log.count("systemd notify: cannot send STOPPING=1") == 1
