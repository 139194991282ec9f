"""`gateway.listeners.coalesce.CoalescingTransport`: corked writes leave together, nothing is
lost or reordered, nothing is held longer than a loop turn."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from gateway.listeners.coalesce import CoalescingTransport


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closing = False
        self.closed = False
        self.aborted = False

    def write(self, data: Any) -> None:
        if self.closed:
            raise RuntimeError("write after close")
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = self.closed = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)

    def get_write_buffer_size(self) -> int:
        return 7


async def _turn() -> None:
    await asyncio.sleep(0)


def _on_a_loop(body: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """The project's tests run their loop themselves (no pytest-asyncio)."""

    @functools.wraps(body)
    def test() -> None:
        asyncio.run(body())

    return test


@_on_a_loop
async def test_uncorked_writes_go_out_at_once() -> None:
    real = RecordingTransport()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.write(b"ping-ack")
    transport.write(b"")
    assert real.writes == [b"ping-ack"]


@_on_a_loop
async def test_corked_writes_go_out_together_in_order_at_the_last_uncork() -> None:
    real = RecordingTransport()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.cork()
    transport.write(b"headers")
    transport.cork()
    transport.write(bytearray(b"-data"))
    transport.uncork()
    assert real.writes == []
    assert transport.get_write_buffer_size() == 7 + len(b"headers-data")
    transport.uncork()
    assert real.writes == [b"headers-data"]
    transport.write(b"next")
    await _turn()
    assert real.writes == [b"headers-data", b"next"]


@_on_a_loop
async def test_a_cork_held_across_a_wait_holds_nothing_longer_than_a_turn() -> None:
    real = RecordingTransport()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.cork()
    transport.write(b"headers")
    transport.write(b"window-update")
    await _turn()
    assert real.writes == [b"headerswindow-update"]
    transport.write(b"data")
    transport.uncork()
    assert real.writes == [b"headerswindow-update", b"data"]


@_on_a_loop
async def test_close_flushes_first() -> None:
    real = RecordingTransport()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.cork()
    transport.write(b"goaway")
    transport.close()
    assert real.writes == [b"goaway"] and real.closed
    await _turn()
    assert real.writes == [b"goaway"]


@_on_a_loop
async def test_abort_drops_what_is_held() -> None:
    real = RecordingTransport()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.cork()
    transport.write(b"held")
    transport.abort()
    await _turn()
    assert real.writes == [] and real.aborted


@_on_a_loop
async def test_a_write_while_closing_reaches_the_real_transport_in_the_writers_task() -> None:
    real = RecordingTransport()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.cork()
    transport.write(b"held")
    real.close()  # the connection went away under the protocol
    assert transport.is_closing()
    with pytest.raises(RuntimeError, match="write after close"):
        transport.write(b"late")
    transport.uncork()
    await _turn()
    assert real.writes == []  # what was held is dropped, as the real transport drops it


@_on_a_loop
async def test_extra_info_is_the_real_transports() -> None:
    real = RecordingTransport()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)
    assert transport.get_extra_info("socket", "none") == "none"
