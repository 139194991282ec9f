"""`console`, the actor that serves the remote console on `<run_dir>/<short_name>.console`.

Rules:
- Loopback only, by construction: a unix socket, mode 0600, inside the run directory. The
  cookie handshake (`console_protocol`) is the authentication; the file mode is the first
  line of defence, as the firewall is for the Erlang distribution port.
- The socket file is the address `yuzu-gw` looks for, so it exists exactly while the actor
  lives: bound in `init` (a failure refuses the boot, like a port in use), removed in
  `terminate`.
- Every session is a task this actor owns and cancels when it ends, so a planned stop or a
  restart leaves no console code running in the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter

from gateway.console import protocol as wire
from gateway.console.paths import RunFiles
from gateway.console.session import Session
from supervisors.messages import WorkerDone
from supervisors.process import Process
from supervisors.reason import ExitReason

if TYPE_CHECKING:
    from gateway.config.context import NodeContext

log = logging.getLogger("yuzu_gw.console")

# Operators attach by hand, a few at a time; each session may hold code running in the node's
# loop, so a bound keeps a runaway script from opening hundreds of them.
MAX_SESSIONS = 8
# sun_path is 108 bytes on Linux, the terminating NUL included.
MAX_SOCKET_PATH_BYTES = 107
# How long the stale-socket probe waits for a live node to accept.
PROBE_TIMEOUT_S = 0.5


# The counter outlives a console restart: registering it again would raise (a registry
# holds one collector per name), so it is made once per registry.
_COUNTERS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def _connections_counter(registry: CollectorRegistry) -> Counter:
    counter = _COUNTERS.get(registry)
    if counter is None:
        counter = Counter(
            "yuzu_gw_console_connections",
            "Console connections by mode and outcome (refused: wrong cookie or bad handshake).",
            ("mode", "outcome"),
            registry=registry,
        )
        _COUNTERS[registry] = counter
    return counter


def _clear_stale(path: Path) -> None:
    """Remove a socket a previous node left behind; refuse to take over a live one."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        # Not ours to delete: an operator's file, or a mistyped run directory.
        raise RuntimeError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT_S)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        return
    except OSError:
        pass  # a timeout: something holds it but is not answering; do not steal it
    finally:
        probe.close()
    raise RuntimeError(f"another node serves the console at {path}")


def bind_console(path: Path) -> socket.socket:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise RuntimeError(f"console socket path too long for a unix socket: {path}")
    _clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # umask around bind: the socket is born 0600, with no window in which another local user
    # could connect before the chmod. The node is single-threaded here (init runs on the loop).
    previous = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(previous)
    os.chmod(path, 0o600)
    sock.listen(MAX_SESSIONS)
    sock.setblocking(False)
    return sock


class ConsoleServer(Process):
    def init(self, args: NodeContext) -> None:
        self.ctx = args
        self.path = RunFiles(args.run_dir, args.node.short_name).console
        args.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.sock = bind_console(self.path)
        self.inode = self.path.stat().st_ino
        self.started = time.monotonic()
        self.counter = _connections_counter(args.registry)
        self.sessions: set[asyncio.Task[None]] = set()
        log.info("console listening on %s", self.path)
        self.run_worker(self._accept(), "accept")

    def receiveMessage(self, msg: Any, sender: Any) -> None:
        # The accept loop only ends by itself on a defect: crash, so the supervisor rebinds.
        if isinstance(msg, WorkerDone) and msg.tag == "accept":
            raise RuntimeError("console accept loop ended")

    def terminate(self, reason: ExitReason) -> None:
        for task in self.sessions:
            task.cancel()
        self.sessions.clear()
        self.sock.close()
        # Only our own socket: a later node may already have bound a new one at this path.
        with contextlib.suppress(FileNotFoundError):
            if self.path.stat().st_ino == self.inode:
                self.path.unlink()

    def format_status(self) -> Mapping[str, Any]:
        return {"socket": str(self.path), "sessions": len(self.sessions)}

    def _outcome(self, outcome: str, mode: str) -> None:
        self.counter.labels(mode=mode, outcome=outcome).inc()

    async def _accept(self) -> None:
        loop = self.loop
        slots = asyncio.Semaphore(MAX_SESSIONS)
        session = Session(self.ctx, self.runtime, self.started, self._outcome)

        async def one(conn: socket.socket) -> None:
            try:
                reader, writer = await asyncio.open_connection(
                    sock=conn, limit=wire.MAX_FRAME_BYTES
                )
            except OSError:
                conn.close()
                return
            await session.serve(reader, writer)

        while True:
            # A slot before accept: the (MAX_SESSIONS+1)th client waits in the backlog.
            await slots.acquire()
            try:
                conn, _ = await loop.sock_accept(self.sock)
            except OSError:
                slots.release()
                log.warning("console: accept failed")
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(one(conn))
            self.sessions.add(task)
            task.add_done_callback(self.sessions.discard)
            task.add_done_callback(lambda _: slots.release())
