"""A stream's receive buffer for the listeners (gateway/listeners/protocol.py, module doc).

It reports what it holds to its connection (the memory bound), times out a handler stuck on a
half-received request (`limits.request_timeout_ms`), and names a stream that ends inside a
message (`TruncatedMessage`) where grpclib's `Buffer.read` raised AssertionError.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from grpclib.protocol import Buffer, Stream
from h2.errors import ErrorCodes

from gateway.listeners.metrics import EXTRA_REQUEST_DATA, ListenerMetrics
from gateway.listeners.request import TruncatedMessage

__all__ = ["BufferOwner", "GuardedBuffer"]

log = logging.getLogger("yuzu_gw.listeners")


class _Policy(Protocol):
    listener: str
    request_timeout_s: float
    metrics: ListenerMetrics


class BufferOwner(Protocol):
    """What a buffer needs of its connection (`ListenerProtocol`)."""

    loop: asyncio.AbstractEventLoop

    @property
    def policy(self) -> _Policy: ...

    def charge(self, size: int) -> None: ...

    def release(self, size: int) -> None: ...


class GuardedBuffer(Buffer):
    """A stream's receive buffer that reports what it holds to the connection and times out
    a handler stuck on a half-received request (module doc)."""

    def __init__(
        self,
        ack_callback: Callable[[int], None],
        owner: BufferOwner,
        stream: Stream,
        unary: bool,
    ) -> None:
        super().__init__(ack_callback)
        self.owner = owner
        self.stream: Stream | None = stream
        self.unary = unary
        self.task: asyncio.Task[None] | None = None
        self.held = 0
        self.ended = False
        # grpclib reads a message as a 5-byte prefix, then its body: after a prefix that
        # announces a body, the handler is in the middle of a message.
        self.mid_message = False

    def add(self, data: bytes, ack_size: int) -> None:
        super().add(data, ack_size)
        self.held += len(data)
        self.owner.charge(len(data))

    def eof(self) -> None:
        super().eof()
        self.ended = True

    async def read(self, size: int) -> bytes:
        if size == 0:
            return b""
        timer = None
        if self.held < size and not self.ended and (self.unary or self.mid_message):
            timer = self.owner.loop.call_later(self.owner.policy.request_timeout_s, self._stalled)
        try:
            chunk = await self._read_held(size)
        finally:
            if timer is not None:
                timer.cancel()
        self.held -= len(chunk)
        self.owner.release(len(chunk))
        if self.mid_message:
            self.mid_message = False
        elif len(chunk) == 5 and int.from_bytes(chunk[1:5], "big") > 0:
            self.mid_message = True
        return chunk

    async def _read_held(self, size: int) -> bytes:
        """`size` bytes, or what was left when the stream ended: b"" at a clean end,
        `TruncatedMessage` inside `size`. grpclib's `Buffer.read` raises AssertionError when the
        stream ends inside `size`, so it is only asked for bytes already held (which it returns
        without waiting), or for one byte to wait for more."""
        parts: list[bytes] = []
        got = 0
        while got < size:
            available = self.held - got
            if available <= 0 and self.ended:
                break
            part = await super().read(min(size - got, available) if available > 0 else 1)
            if not part:
                break
            parts.append(part)
            got += len(part)
        if got == size:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        if got:
            self.held -= got
            self.owner.release(got)
            raise TruncatedMessage(size, got)
        return b""

    def discard(self) -> None:
        """The stream is released: what no handler read is dropped."""
        if self.held:
            self.owner.policy.metrics.dropped(EXTRA_REQUEST_DATA, self.held)
            self.owner.release(self.held)
            self.held = 0

    def _stalled(self) -> None:
        self.owner.policy.metrics.recv_timeout.inc()
        log.debug("gRPC listener %s: a request stalled; stream reset", self.owner.policy.listener)
        if self.stream is not None and self.stream.closable:
            self.stream.reset_nowait(ErrorCodes.CANCEL)
        if self.task is not None:
            self.task.cancel()
