"""systemd's readiness protocol (sd_notify(3)), spoken without libsystemd: one datagram per
state change to the unix socket named by `$NOTIFY_SOCKET`, which systemd sets for a
`Type=notify` unit (docs/install.md, "systemd").

- `READY=1` once the tree has started, which is after every listener has bound (a child
  that fails to start refuses the boot), with a `STATUS=` naming the bound addresses;
- `STOPPING=1` when the planned stop begins (the manual, "Planned stop");
- `WATCHDOG=1` from the loop monitor every half `$WATCHDOG_USEC` (`WatchdogSec=` of the
  unit), so a loop that stalls for longer stops the pings and systemd restarts the node.

Without `$NOTIFY_SOCKET` every call does nothing. A socket that cannot be reached is one
WARNING line and the node keeps running: readiness is systemd's concern, not a reason to stop
serving agents.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

import attrs

__all__ = [
    "NOTIFY_SOCKET",
    "READY",
    "STOPPING",
    "WATCHDOG",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
    "SystemdNotify",
]

log = logging.getLogger("yuzu_gw.node")

NOTIFY_SOCKET = "NOTIFY_SOCKET"
WATCHDOG_USEC = "WATCHDOG_USEC"
WATCHDOG_PID = "WATCHDOG_PID"

READY = "READY=1"
STOPPING = "STOPPING=1"
WATCHDOG = "WATCHDOG=1"

# sd_watchdog_enabled(3): "send keep-alive notifications ... at half the interval".
WATCHDOG_SHARE = 0.5


def _address(text: str) -> str | bytes | None:
    """The socket address of `$NOTIFY_SOCKET`: a path, or `@name` for the abstract namespace.
    None for what this module cannot reach (systemd's `vsock:` addresses)."""
    if text.startswith("/"):
        return text
    if text.startswith("@") and len(text) > 1:
        return b"\0" + text[1:].encode()
    return None


def _watchdog_s(env: Mapping[str, str], pid: int) -> float | None:
    """Half the watchdog interval systemd asks of this process, or None without one."""
    text = env.get(WATCHDOG_USEC, "")
    if not text:
        return None
    owner = env.get(WATCHDOG_PID, "")
    # systemd names the process the watchdog is meant for; a child that inherited the
    # variables (not this node) must not answer for it.
    if owner and owner != str(pid):
        return None
    if not text.isdigit() or int(text) == 0:
        log.warning(
            "systemd notify: %s=%r is not a positive number; no watchdog", WATCHDOG_USEC, text
        )
        return None
    return int(text) / 1_000_000 * WATCHDOG_SHARE


@attrs.define
class SystemdNotify:
    """The node's notifier. `SystemdNotify()` (no socket) does nothing."""

    address: str | bytes | None = None
    # Seconds between two WATCHDOG=1, or None when systemd wants none.
    watchdog_interval_s: float | None = None
    _sock: socket.socket | None = attrs.field(init=False, default=None)
    _warned: bool = attrs.field(init=False, default=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str], pid: int | None = None) -> SystemdNotify:
        text = env.get(NOTIFY_SOCKET, "")
        if not text:
            return cls()
        address = _address(text)
        if address is None:
            log.warning(
                "systemd notify: %s=%r is not a unix socket; not notifying", NOTIFY_SOCKET, text
            )
            return cls()
        return cls(address, _watchdog_s(env, os.getpid() if pid is None else pid))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def ready(self, status: str) -> None:
        self.send(READY, f"STATUS={status}", f"MAINPID={os.getpid()}")

    def stopping(self) -> None:
        self.send(STOPPING, "STATUS=planned stop")

    def watchdog(self) -> None:
        self.send(WATCHDOG)

    def send(self, *assignments: str) -> None:
        if self.address is None:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                # Never wait on systemd: a full queue loses one ping, not the loop's time.
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(assignments).encode(), self.address)
        except OSError as exc:
            # Once: a watchdog ping every few seconds would otherwise repeat it forever.
            if not self._warned:
                self._warned = True
                log.warning(
                    "systemd notify: cannot send %s to %s: %s; later failures are not logged",
                    assignments[0],
                    NOTIFY_SOCKET,
                    exc.strerror or exc,
                )

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
