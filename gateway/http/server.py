"""A minimal HTTP/1.1 responder for the health and metrics ports.

Seed, "Readiness": each connection is served on its own, a client that connects and sends
nothing is given at most 2 s for its request so it cannot hold up the probes behind it,
and at most 64 connections are served at once; past that new ones wait in the kernel's
listen backlog. The accept loop takes a slot before it accepts, so that last rule is
literal: a 65th connection is not accepted until a slot frees.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Mapping

import attrs

log = logging.getLogger("yuzu_gw.http")

REQUEST_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 64
MAX_REQUEST_HEAD_BYTES = 8192
LISTEN_BACKLOG = 128


@attrs.frozen
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    # Further header lines, such as Content-Encoding.
    headers: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class Request:
    """What a handler may read of the request: its header fields, names in lower case (a
    field sent twice keeps its last value)."""

    headers: Mapping[str, str] = attrs.field(factory=dict)

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


Handler = Callable[[Request], Response]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


def bind(host: str, port: int) -> socket.socket:
    """Bind synchronously, so a port in use fails the endpoint's start (and the boot)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _render(response: Response, head_only: bool) -> bytes:
    head = (
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'OK')}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in response.headers)
        + "Connection: close\r\n\r\n"
    ).encode("ascii")
    return head if head_only else head + response.body


def _headers(lines: list[str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if colon:
            fields[name.strip().lower()] = value.strip()
    return fields


def _route(head: bytes, routes: Mapping[str, Handler]) -> tuple[Response, bool]:
    request_line, *lines = head.decode("latin-1").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3:
        return Response(400, b"bad request\n"), False
    method, target, _ = parts
    if method not in ("GET", "HEAD"):
        return Response(405, b"method not allowed\n"), False
    handler = routes.get(target.split("?", 1)[0])
    if handler is None:
        return Response(404, b"not found\n"), method == "HEAD"
    return handler(Request(_headers(lines))), method == "HEAD"


async def _serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, routes: Mapping[str, Handler]
) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return
    response, head_only = _route(head, routes)
    writer.write(_render(response, head_only))
    with contextlib.suppress(ConnectionError):
        await writer.drain()


async def serve(sock: socket.socket, routes: Mapping[str, Handler]) -> None:
    """Accept and answer until cancelled; cancelling also cancels open connections."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(MAX_CONNECTIONS)
    tasks: set[asyncio.Task[None]] = set()

    async def one(conn: socket.socket) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_connection(sock=conn, limit=MAX_REQUEST_HEAD_BYTES)
            await _serve_connection(reader, writer, routes)
        finally:
            if writer is not None:
                writer.close()
            else:
                conn.close()
            slots.release()

    try:
        while True:
            await slots.acquire()
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError:
                slots.release()
                log.warning("accept failed on %s", sock.getsockname())
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(one(conn))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        for task in tasks:
            task.cancel()
