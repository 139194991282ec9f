"""The client side of the console socket, used by `yuzu-gw ping | eval | remote_console`.

Nothing here imports the node: the client runs in a short-lived process next to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from pathlib import Path
from typing import Any

from gateway.console import protocol as wire

# The node answers the greeting at once when it is alive; 5 s covers a node busy under load
# without leaving `ping` (and so `rel/yuzu_gw start`) hanging on a wedged one.
CONNECT_TIMEOUT_S = 5.0
# Bridge reads: big enough for a metrics dump in a few reads.
CHUNK_BYTES = 65536
# An eval's answer is one line: `actors()` on a node holding a million agents is ~60 MB.
MAX_REPLY_BYTES = 256 << 20


class Unreachable(Exception):
    """No node answers on the socket (not running, stale socket, not a console)."""


class Refused(Exception):
    """The node answered and refused: wrong cookie or a handshake it did not accept."""


async def open_session(
    path: Path, cookie: str, mode: wire.Mode, source: str = "", timeout: float = CONNECT_TIMEOUT_S
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]]:
    """Connect, authenticate, send the request; returns the streams and the node's reply."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(str(path), limit=MAX_REPLY_BYTES), timeout
        )
    except (OSError, TimeoutError) as exc:
        raise Unreachable(f"no console at {path}: {exc.__class__.__name__}") from None
    try:
        nonce = wire.read_hello(await asyncio.wait_for(reader.readuntil(b"\n"), timeout))
        writer.write(wire.request(cookie, nonce, mode, source))
        await writer.drain()
        # An eval may take as long as the expression does; the greeting proved the node is
        # alive, so its answer is awaited without a bound (Ctrl-C ends the wait).
        reply_timeout = None if mode != "ping" else timeout
        reply = wire.decode(await asyncio.wait_for(reader.readuntil(b"\n"), reply_timeout))
    except (
        OSError,
        TimeoutError,
        asyncio.IncompleteReadError,
        asyncio.LimitOverrunError,
        wire.ProtocolError,
    ) as exc:
        writer.close()
        why = str(exc) or type(exc).__name__
        raise Unreachable(f"the console at {path} did not answer: {why}") from None
    if not reply.get("ok"):
        writer.close()
        raise Refused(str(reply.get("error", "refused")))
    return reader, writer, reply


async def one_shot(path: Path, cookie: str, mode: wire.Mode, source: str = "") -> dict[str, Any]:
    _, writer, reply = await open_session(path, cookie, mode, source)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return reply


def _stdin_lines(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[bytes]) -> None:
    """Read stdin on a daemon thread (a blocked read must not keep the client alive after
    the node closed the session). A terminal gets `input()` for line editing and history;
    a pipe (a scripted session) is read as bytes. b"" marks the end of input."""
    interactive = sys.stdin.isatty()
    if interactive:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401, PLC0415  (importing it turns on line editing)
    while True:
        if interactive:
            try:
                line = (input() + "\n").encode()
            except EOFError:
                line = b""
        else:
            line = sys.stdin.buffer.readline()
        loop.call_soon_threadsafe(queue.put_nowait, line)
        if not line:
            return


async def bridge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy stdin to the session and the session to stdout until the node closes it."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[bytes] = asyncio.Queue()
    threading.Thread(target=_stdin_lines, args=(loop, lines), daemon=True).start()

    async def upstream() -> None:
        while line := await lines.get():
            writer.write(line)
            await writer.drain()
        # Half-close: the session sees end of input and ends as Ctrl-D would, while what it
        # still has to print reaches us.
        if writer.can_write_eof():
            writer.write_eof()

    sender = loop.create_task(upstream())
    out = sys.stdout.buffer
    last = b"\n"
    try:
        while chunk := await reader.read(CHUNK_BYTES):
            out.write(chunk)
            out.flush()
            last = chunk[-1:]
    finally:
        sender.cancel()
        writer.close()
    # `exit()` leaves the last prompt unterminated; the operator's shell prompt follows.
    if last != b"\n":
        out.write(b"\n")
        out.flush()
