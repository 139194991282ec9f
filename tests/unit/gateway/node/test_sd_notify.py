"""Reading systemd's variables (gateway/node/sd_notify.py); the datagrams themselves are
checked against a real node in tests/integration/test_sd_notify.py."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from gateway.node.sd_notify import SystemdNotify


def test_no_socket_means_silent() -> None:
    notify = SystemdNotify.from_env({"WATCHDOG_USEC": "1000000"})
    assert not notify.enabled
    notify.ready("serving")  # nothing to send to, nothing raised


def test_abstract_socket_and_half_the_watchdog_interval() -> None:
    notify = SystemdNotify.from_env(
        {"NOTIFY_SOCKET": "@yuzu/notify", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"},
        pid=42,
    )
    assert notify.address == b"\0yuzu/notify"
    assert notify.watchdog_interval_s == 15.0


def test_watchdog_meant_for_another_process_is_not_answered() -> None:
    env = {"NOTIFY_SOCKET": "/run/n", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "41"}
    assert SystemdNotify.from_env(env, pid=42).watchdog_interval_s is None


@pytest.mark.parametrize("usec", ["0", "-5", "soon"])
def test_a_bad_watchdog_usec_is_one_warning_and_no_watchdog(
    usec: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        notify = SystemdNotify.from_env({"NOTIFY_SOCKET": "/run/n", "WATCHDOG_USEC": usec})
    assert notify.enabled and notify.watchdog_interval_s is None
    assert [r.getMessage() for r in caplog.records] == [
        f"systemd notify: WATCHDOG_USEC={usec!r} is not a positive number; no watchdog"
    ]


def test_a_vsock_address_is_refused_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        notify = SystemdNotify.from_env({"NOTIFY_SOCKET": "vsock:2:1234"})
    assert not notify.enabled
    assert "is not a unix socket" in caplog.text


def test_datagrams_carry_the_assignments(tmp_path: Path) -> None:
    path = tmp_path / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(str(path))
        notify = SystemdNotify(str(path))
        notify.stopping()
        notify.watchdog()
        assert receiver.recv(4096) == b"STOPPING=1\nSTATUS=planned stop"
        assert receiver.recv(4096) == b"WATCHDOG=1"
        notify.close()
