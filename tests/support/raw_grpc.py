"""A bare gRPC-over-HTTP/2 client on the `h2` package: it sends what grpcio never would (a zero
or malformed grpc-timeout, a compressed flag, a length prefix longer than its data, two
messages on a unary call, bytes that are not protobuf) and reads the answer as raw frames.

    async with RawGrpc.connect(port) as raw:
        answer = await raw.call("/yuzu.agent.v1.AgentService/Register", frame(b"..."),
                                headers=[("grpc-timeout", "0n")])
        answer.status, answer.message, answer.trailers

`connect(..., ssl=context, before=b"PROXY ...")` dials TLS and/or writes a PROXY header first.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_module
from collections.abc import AsyncIterator, Sequence
from urllib.parse import unquote

import attrs
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
)
from h2.exceptions import ProtocolError, StreamClosedError

__all__ = ["Answer", "RawGrpc", "frame"]


def frame(body: bytes, *, flag: int = 0, length: int | None = None) -> bytes:
    """One gRPC message: the flag byte, the 4-byte length (`length`, or the body's), the body."""
    size = len(body) if length is None else length
    return bytes([flag]) + size.to_bytes(4, "big") + body


@attrs.define
class Answer:
    """How one call ended. `status` is grpc-status (None when the stream was reset or the
    connection closed without one); `reset` the RST_STREAM code, if any."""

    headers: dict[str, str] = attrs.field(factory=dict)
    trailers: dict[str, str] = attrs.field(factory=dict)
    data: bytes = b""
    reset: int | None = None
    closed: bool = False

    def meta(self, name: str) -> str | None:
        """A trailer, or the header of a trailers-only answer."""
        return self.trailers.get(name, self.headers.get(name))

    @property
    def status(self) -> int | None:
        value = self.meta("grpc-status")
        return None if value is None else int(value)

    @property
    def message(self) -> str:
        return unquote(self.meta("grpc-message") or "")


class RawGrpc:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = H2Connection(
            H2Configuration(
                client_side=True, header_encoding="utf-8", validate_outbound_headers=False
            )
        )
        self.conn.initiate_connection()
        self.flush()
        self._answers: dict[int, Answer] = {}
        self._done: dict[int, asyncio.Event] = {}
        self._reader_task = asyncio.ensure_future(self._read())
        self.closed = asyncio.Event()

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        port: int,
        *,
        ssl: ssl_module.SSLContext | None = None,
        before: bytes = b"",
        host: str = "127.0.0.1",
    ) -> AsyncIterator[RawGrpc]:
        if before:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(before)
            await writer.drain()
            if ssl is not None:
                await writer.start_tls(ssl, server_hostname="localhost")
        else:
            reader, writer = await asyncio.open_connection(
                host, port, ssl=ssl, server_hostname="localhost" if ssl is not None else None
            )
        raw = cls(reader, writer)
        try:
            yield raw
        finally:
            raw.close()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    def close(self) -> None:
        self._reader_task.cancel()
        self.writer.close()

    async def call(
        self,
        path: str,
        *messages: bytes,
        headers: Sequence[tuple[str, str]] = (),
        end: bool = True,
        timeout: float = 10.0,
    ) -> Answer:
        """One call: HEADERS, one DATA frame per entry of `messages` (raw bytes, see `frame`),
        END_STREAM on the last when `end`; waits for its end."""
        stream_id = self.conn.get_next_available_stream_id()
        self._answers[stream_id] = Answer()
        self._done[stream_id] = asyncio.Event()
        self.conn.send_headers(
            stream_id,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *headers,
            ],
            end_stream=end and not messages,
        )
        for index, data in enumerate(messages):
            last = index == len(messages) - 1
            self.conn.send_data(stream_id, data, end_stream=end and last)
        self.flush()
        await asyncio.wait_for(self._done[stream_id].wait(), timeout)
        del self._done[stream_id]
        return self._answers.pop(stream_id)

    async def _read(self) -> None:
        try:
            while data := await self.reader.read(65536):
                try:
                    events = self.conn.receive_data(data)
                except ProtocolError:
                    break
                for event in events:
                    self._event(event)
                self.flush()
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()
            for stream_id, answer in self._answers.items():
                answer.closed = True
                self._done[stream_id].set()

    def _event(self, event: object) -> None:
        stream_id = getattr(event, "stream_id", 0)
        answer = self._answers.get(stream_id)
        if isinstance(event, ConnectionTerminated) or answer is None:
            return
        if isinstance(event, ResponseReceived):
            answer.headers = dict(event.headers)  # type: ignore[arg-type]
        elif isinstance(event, TrailersReceived):
            answer.trailers = dict(event.headers)  # type: ignore[arg-type]
        elif isinstance(event, DataReceived):
            answer.data += event.data or b""
            with contextlib.suppress(StreamClosedError):
                self.conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
        elif isinstance(event, StreamReset):
            answer.reset = event.error_code
            self._done[stream_id].set()
        elif isinstance(event, StreamEnded):
            self._done[stream_id].set()
