"""The graceful GOAWAY of a draining listener (issue 7 §2, seed 001's go-away with a reason and a
retry time): on the wire with a raw HTTP/2 client, through grpcio, and in a planned stop.

The raw client reads frames itself: h2 treats a received GOAWAY as the end of the connection and
would refuse the frames that legitimately follow it on a stream still open, which is exactly what
these tests must see."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpclib.server import Stream
from h2.errors import ErrorCodes
from hyperframe.frame import DataFrame, Frame, GoAwayFrame, HeadersFrame, RstStreamFrame
from prometheus_client import CollectorRegistry

from gateway.config.listener_spec import parse_listeners
from gateway.config.terms import parse_term
from gateway.listeners.listener_actor import Drain, Drained, ListenerActor, ListenerArgs
from gateway.listeners.metrics import ListenerMetrics
from gateway.listeners.protocol import DRAINING
from gateway.listeners.retry_hint import (
    PUSHBACK_HEADER,
    STOPPING_HINT_MS,
    HintedRefusal,
    RefusalKind,
    send_refusal,
)
from gateway.listeners.tree import resolve_routes
from protos.yuzu.agent.v1 import agent_pb2
from tests.integration.test_listener import (
    REGISTER,
    SUBSCRIBE,
    EchoAgent,
    RawH2,
    Started,
    channel,
    channels,
    entry,
    listener_test,
)
from tests.integration.test_owner_recovery import route
from tests.integration.test_planned_stop import gateway, reports
from tests.integration.test_server_restart import fleet
from tests.support.actors import Harness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

RETRY_MS = 7000
DEBUG = f"reason=draining retry_after_ms={RETRY_MS}".encode()
UNAVAILABLE = "14"


class HoldingAgent(EchoAgent):
    """Subscribe answers its headers, waits for `release`, then sends one command and ends
    UNAVAILABLE with a stopping retry hint, as an owner ends its agent's stream in a stop."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def Subscribe(self, stream: Stream[Any, Any]) -> None:
        await stream.send_initial_metadata()
        await self.release.wait()
        await stream.send_message(agent_pb2.CommandRequest(command_id="after-goaway"))
        await send_refusal(stream, HintedRefusal(RefusalKind.STOPPING, "session owner stopped"))


def start(h: Harness, agent: HoldingAgent) -> Started:
    [spec] = parse_listeners(parse_term(f"[{entry()}]."))
    registry = CollectorRegistry()
    args = ListenerArgs(
        spec,
        resolve_routes(spec, {"echo": agent}),
        ListenerMetrics(registry),
        lambda _n, _t: None,
    )
    return Started(h, h.create(ListenerActor, args), registry)


class Frames:
    """The server's frames, one at a time. Until the GOAWAY each is also fed to the client's h2
    connection (which acknowledges SETTINGS and decodes headers); after it they are only read,
    their header blocks decoded with the same HPACK decoder."""

    def __init__(self, raw: RawH2) -> None:
        self.raw = raw
        self.pending = b""
        self.gone = False

    async def _read(self, size: int, timeout: float) -> bytes:
        while len(self.pending) < size:
            chunk = await asyncio.wait_for(self.raw.reader.read(65536), timeout)
            if not chunk:
                raise EOFError("the server closed the connection")
            self.pending += chunk
        data, self.pending = self.pending[:size], self.pending[size:]
        return data

    async def next(self, timeout: float) -> Frame:
        header = await self._read(9, timeout)
        frame, length = Frame.parse_frame_header(memoryview(header))
        body = await self._read(length, timeout)
        frame.parse_body(memoryview(body))
        if isinstance(frame, GoAwayFrame):
            self.gone = True
        elif not self.gone:
            self.raw.conn.receive_data(header + body)
            self.raw.flush()
        return frame

    async def until(self, kind: type[Frame], stream_id: int = 0, timeout: float = 3.0) -> Any:
        while True:
            frame = await self.next(timeout)
            if isinstance(frame, kind) and frame.stream_id == stream_id:
                return frame

    def headers(self, frame: HeadersFrame) -> dict[str, str]:
        return dict(self.raw.conn.decoder.decode(frame.data))


def test_a_drained_connection_gets_goaway_while_its_open_stream_ends_with_a_retry_hint() -> None:
    async def body(h: Harness) -> None:
        agent = HoldingAgent()
        listener = start(h, agent)
        raw = await RawH2.open(listener.port)
        late: RawH2 | None = None
        try:
            frames = Frames(raw)
            held = raw.request(SUBSCRIBE)
            await frames.until(HeadersFrame, held)  # the Subscribe is open: its headers came
            drained = await h.ask(listener.address, Drain(DRAINING, (RETRY_MS, RETRY_MS)))
            assert drained == Drained("agent", 1)

            goaway = await frames.until(GoAwayFrame)
            assert goaway.error_code == ErrorCodes.NO_ERROR
            assert goaway.last_stream_id == held
            assert goaway.additional_data == DEBUG

            # A stream opened after the GOAWAY is refused, not served.
            refused = raw.request(REGISTER)
            reset = await frames.until(RstStreamFrame, refused)
            assert reset.error_code == ErrorCodes.REFUSED_STREAM

            # The open stream runs to its end: a message, then UNAVAILABLE with the hint.
            agent.release.set()
            data = await frames.until(DataFrame, held)
            assert b"after-goaway" in data.data
            trailers = frames.headers(await frames.until(HeadersFrame, held))
            assert trailers["grpc-status"] == UNAVAILABLE
            hint = int(trailers[PUSHBACK_HEADER])
            assert STOPPING_HINT_MS[0] <= hint <= STOPPING_HINT_MS[1]

            # A connection made after the drain is told at once: nothing was taken on it.
            late = await RawH2.open(listener.port)
            late_frames = Frames(late)
            first = await late_frames.until(GoAwayFrame)
            assert (first.last_stream_id, first.additional_data) == (0, DEBUG)
            stream = late.request(REGISTER)
            assert (await late_frames.until(RstStreamFrame, stream)).error_code == (
                ErrorCodes.REFUSED_STREAM
            )

            # When the listener stops, the final GOAWAY does not raise the last stream id past
            # the graceful one, though the client opened a stream after it.
            listener.actor.server.close()
            final = await frames.until(GoAwayFrame)
            assert final.last_stream_id == held
        finally:
            raw.close()
            if late is not None:
                late.close()

    listener_test(body)


def test_grpcio_leaves_a_drained_connection_while_its_stream_runs_on() -> None:
    async def body(h: Harness) -> None:
        agent = HoldingAgent()
        listener = start(h, agent)
        chan = channel(listener.port)
        async with channels(chan):
            call = chan.stream_stream(
                SUBSCRIBE,
                request_serializer=agent_pb2.CommandResponse.SerializeToString,
                response_deserializer=agent_pb2.CommandRequest.FromString,
            )()
            await call.initial_metadata()
            assert chan.get_state() is grpc.ChannelConnectivity.READY
            await h.ask(listener.address, Drain(DRAINING, (RETRY_MS, RETRY_MS)))
            # grpcio takes the GOAWAY as "this connection takes no new calls": the channel
            # leaves READY while the Subscribe is still open.
            await asyncio.wait_for(chan.wait_for_state_change(grpc.ChannelConnectivity.READY), 3)
            assert not call.done()
            agent.release.set()
            assert (await call.read()).command_id == "after-goaway"
            assert await call.code() is grpc.StatusCode.UNAVAILABLE
            hint = int(dict(await call.trailing_metadata())[PUSHBACK_HEADER])
            assert STOPPING_HINT_MS[0] <= hint <= STOPPING_HINT_MS[1]

    listener_test(body)


def test_a_planned_stop_sends_goaway_before_the_subscribe_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        async with asyncio.timeout(50):
            # A budget of 2 s: the router's grace for the command left in flight is 0.6 s, the
            # time between the GOAWAY (step 2) and the end of the sessions (step 3).
            async with gateway(tmp_path, 2000) as (node, fake), fleet(node, fake, 1) as [held]:
                route(node, "unanswered", (held.agent_id,))
                assert (await held.stream.read()).command_id == "unanswered"
                chan = held.agent.channel
                assert chan.get_state() is grpc.ChannelConnectivity.READY
                caplog.clear()
                stopping = asyncio.ensure_future(node.stop())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        chan.wait_for_state_change(grpc.ChannelConnectivity.READY), 5
                    )
                assert chan.get_state() is not grpc.ChannelConnectivity.READY
                assert not held.stream.done()  # told to go while its Subscribe still ran
                await stopping
                assert await held.stream.code() is grpc.StatusCode.UNAVAILABLE
                hint = int(dict(await held.stream.trailing_metadata())[PUSHBACK_HEADER])
                assert STOPPING_HINT_MS[0] <= hint <= STOPPING_HINT_MS[1]
        drains = [r.getMessage() for r in caplog.records if "draining (draining)" in r.getMessage()]
        assert drains == [
            "gRPC listener agent draining (draining): GOAWAY sent on 1 connection(s); new streams"
            " refused, open ones run to their end"
        ]
        assert reports(caplog) == []

    asyncio.run(body())
