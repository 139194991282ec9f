"""The owner's side of a Subscribe stream (actors/agents/api.py `StreamHandle`): bounded,
ordered, the end always gets through, and the one reader wakes for each frame."""

from __future__ import annotations

import asyncio

from actors.agents.api import StreamEnd, StreamHandle
from protos.yuzu.agent.v1 import agent_pb2


def _cmd(n: int) -> agent_pb2.CommandRequest:
    return agent_pb2.CommandRequest(command_id=f"c{n}")


def test_frames_come_out_in_order_and_a_full_handle_refuses() -> None:
    handle = StreamHandle(maxsize=2)
    assert handle.take_nowait() is None
    assert handle.deliver(_cmd(1)) and handle.deliver(_cmd(2))
    assert not handle.deliver(_cmd(3))
    assert handle.qsize() == 2
    assert [handle.take_nowait(), handle.take_nowait()] == [_cmd(1), _cmd(2)]
    assert handle.take_nowait() is None and handle.qsize() == 0


def test_the_end_displaces_the_oldest_frame_of_a_full_handle_and_ends_delivery() -> None:
    handle = StreamHandle(maxsize=2)
    handle.deliver(_cmd(1))
    handle.deliver(_cmd(2))
    end = StreamEnd(status=14, details="stuck")
    handle.close(end)
    handle.close(StreamEnd(status=0))  # a second close changes nothing
    assert not handle.deliver(_cmd(3))
    assert [handle.take_nowait(), handle.take_nowait(), handle.take_nowait()] == [
        _cmd(2),
        end,
        None,
    ]


def test_the_reader_waits_for_the_next_frame() -> None:
    async def scenario() -> None:
        handle = StreamHandle()
        reader = asyncio.ensure_future(handle.next())
        await asyncio.sleep(0)
        assert not reader.done()
        handle.deliver(_cmd(1))
        assert await asyncio.wait_for(reader, 1.0) == _cmd(1)
        handle.deliver(_cmd(2))
        handle.close(StreamEnd(status=0))
        assert await handle.next() == _cmd(2)
        assert await handle.next() == StreamEnd(status=0)

    asyncio.run(scenario())


def test_a_cancelled_reader_leaves_the_handle_usable() -> None:
    async def scenario() -> None:
        handle = StreamHandle()
        reader = asyncio.ensure_future(handle.next())
        await asyncio.sleep(0)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        handle.deliver(_cmd(1))
        assert await asyncio.wait_for(handle.next(), 1.0) == _cmd(1)

    asyncio.run(scenario())
