"""A transport wrapper that merges grpclib's writes: one `send()` for what would be several.

grpclib writes each frame block the moment h2 produces it, each a `send()` system call (and a
TCP segment) of its own. Two users:

- An upstream call (gateway/upstream/connection.py): the slot corks the transport around
  `send_message` (`cork()` ... `uncork()`), so a unary call's HEADERS and DATA go out as one
  write, at the same moment the DATA frame would have gone out alone: nothing is sent later
  than before, and one system call per call is saved (docs/upstream-calls.md, "What a call
  costs").
- A listener's connection (gateway/listeners/protocol.py) is corked for good: what its streams
  write in one turn of the loop (a Register's response headers, message and trailers, the
  answers of every stream that ran) leaves in one write at the start of the next turn. In a
  10,000-agent cold wave one `send()` per frame block was an eighth of the node's CPU.

Rules:

* Uncorked (the normal state), a write goes straight to the real transport, after anything
  still held, so order is always kept.
* Corked, writes are held until the last `uncork()`. A corked sender that has to wait (the
  write buffer is full, no flow-control window, the stream limit) must not hold anyone's
  frames: the first held write also schedules a flush for the next loop turn, whatever the
  cork depth, so nothing waits longer than one turn (a WINDOW_UPDATE the server waits for
  among them).
* `close()` flushes first, so nothing written before it is lost (a GOAWAY, an RST_STREAM).
* While the real transport is closing, a write goes straight to it, so whatever it does with a
  write after close (drop it, or raise in the writer's task) is unchanged; what is still held
  is dropped then, as the real transport would drop it.
* `abort()` drops what is held: abort means "discard what is queued".
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["CoalescingTransport"]


class CoalescingTransport(asyncio.Transport):
    """What grpclib's HTTP/2 protocol uses of a transport, plus `cork()` / `uncork()`."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._corked = 0
        self._held: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None

    def cork(self) -> None:
        self._corked += 1

    def uncork(self) -> None:
        self._corked -= 1
        if self._corked == 0:
            self._flush()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._transport.is_closing():
            self._transport.write(data)
            return
        if self._corked == 0 and not self._held:
            self._transport.write(data)
            return
        self._held.append(bytes(data))
        if self._corked == 0:
            self._flush()
        elif self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._held = []
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._held))

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()
