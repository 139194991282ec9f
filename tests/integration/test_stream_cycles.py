"""A stream the client resets leaves nothing of its handler in a reference cycle (issue 21, the
soak's RSS; docs/dev/benchmarks.md, the soak).

grpclib's `Wrapper` keeps the `StreamTerminatedError` it cancels the handler with when the
client resets the stream; the error's traceback holds the frame of
`gateway/listeners/request.py` `Served._run`, whose local `wrapper` holds the error: a cycle
holding the handler's frames (a Subscribe's Register, its enrolment token) until a full
collection, which the node makes rare (supervisors/gc_policy.py). Here five Health Watch
streams, old enough to sit in the oldest generation as a long-lived Subscribe does, are reset
with automatic collection off; once their handlers have ended, a collection that saves what it
finds must find no frame of that module.
"""

from __future__ import annotations

import asyncio
import gc
import types
from pathlib import Path

import pytest

from gateway.listeners import request
from tests.integration.test_agent_plane import gateway, run, until
from tests.integration.test_grpc_health import AGENT, SERVING, Health, next_status

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

STREAMS = 5


def _served_streams() -> int:
    """Frames of `Served._run` still running: one per open stream."""
    return sum(
        1
        for task in asyncio.all_tasks()
        for frame in _frames(task)
        if frame.f_code is request.Served._run.__code__
    )


def _frames(task: asyncio.Task[object]) -> list[types.FrameType]:
    frames = []
    coro = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None)
        if frame is not None:
            frames.append(frame)
        coro = getattr(coro, "cr_await", None)
    return frames


def _cyclic_frames_of(module_file: str) -> list[str]:
    """What a full collection finds unreachable: the frames of `module_file` among it."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return [
            o.f_code.co_name
            for o in gc.garbage
            if isinstance(o, types.FrameType) and o.f_code.co_filename == module_file
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_reset_streams_leave_no_handler_in_a_cycle(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as (node, _fake):
            health = Health(node, "agent")
            try:
                watches = [health.watch(AGENT) for _ in range(STREAMS)]
                for watch in watches:
                    assert await next_status(watch) == SERVING
                await until(lambda: _served_streams() >= STREAMS, "the streams served")
                before = _served_streams() - STREAMS
                gc.collect()  # everything so far, the open streams too, in the oldest generation
                gc.disable()
                try:
                    for watch in watches:
                        watch.cancel()  # RST_STREAM: grpclib cancels the handler
                    await until(lambda: _served_streams() == before, "the handlers to end")
                    await asyncio.sleep(0.1)  # the streams' release callbacks
                    cyclic = _cyclic_frames_of(request.__file__)
                finally:
                    gc.enable()
            finally:
                await health.channel.close()
            assert cyclic == []

    run(body)
