"""A refused dial leaves no reference cycle (issue 21, the soak's RSS): the node collects its
old generations rarely (supervisors/gc_policy.py), so an error kept by a frame its own traceback
holds would keep that frame, its socket and the whole traceback until a full collection, once
per redial while the server is down."""

from __future__ import annotations

import asyncio
import gc
import random
import socket
from collections.abc import Iterator

import pytest

from gateway.config.upstream_client import EndpointSpec
from gateway.upstream.connection import ConnectionSlot, _DialFailedError
from gateway.upstream.redial import Redial


@pytest.fixture
def no_automatic_collection() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Events:
    def slot_changed(self, slot: ConnectionSlot) -> None: ...

    def dial_failed(self, slot: ConnectionSlot, failure: object) -> None: ...


@pytest.mark.usefixtures("no_automatic_collection")
def test_a_refused_dial_leaves_no_cycle() -> None:
    slot = ConnectionSlot(
        channel_name="test",
        endpoint=EndpointSpec("http", "127.0.0.1", _closed_port()),
        index=0,
        connect_timeout_s=5.0,
        nodelay=True,
        max_receive=2**20,
        redial=Redial(random=random.random),
        events=_Events(),
    )

    async def dial() -> None:
        with pytest.raises(_DialFailedError):
            await slot._tcp(asyncio.get_running_loop())

    asyncio.run(dial())
    gc.collect()  # the loop's own garbage
    for _ in range(3):
        asyncio.run(dial())
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        cyclic = [o for o in gc.garbage if isinstance(o, OSError)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert cyclic == []
