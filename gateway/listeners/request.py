"""One RPC stream of a listener: grpclib's `request_handler`, with hostile input answered by name.

grpclib 0.4's `request_handler` and `recv_message` (grpclib/server.py, grpclib/stream.py) answer
malformed input with UNKNOWN or an uncaught exception, and log a traceback for each call, which
anyone reaching the port could repeat without limit. `Served.serve_stream` replaces them for
the listeners (`ListenerHandler.accept` starts it); each refusal below is counted in
`yuzu_gw_grpc_request_refused_total{listener,reason}` and logged at most once a second per
reason (`Refusals`), never with a traceback (docs/listeners.md "Hostile input"):

- `grpc-timeout` of 0 (`0n`, `0S`): DEADLINE_EXCEEDED, the deadline passed before the call.
- `grpc-timeout` not 1 to 8 digits and a unit (negative, empty, `1x`): INTERNAL `malformed
  grpc-timeout header` (the spec's grammar; grpc-go's answer).
- a `-bin` header that is not base64: INTERNAL `malformed binary metadata`.
- a message with the compressed flag: UNIMPLEMENTED naming the encoding, with
  `grpc-accept-encoding: identity` (the gRPC compression spec); another flag byte: INTERNAL.
- the stream ends inside a message: INTERNAL `truncated message: ...` (where it ended).
- a second request message on a unary call: INTERNAL `more than one request message on a unary
  call` (a cardinality violation; grpc-java answers INTERNAL "Too many requests").

A deadline is armed as a timer that cancels the handler when it fires (grpclib's own raised
inside its handler when the deadline had passed by the time the call started). A unary request
is dispatched once the client has ended its side (as grpc-java does), so a second message is
seen before the handler answers; `limits.request_timeout_ms` bounds that wait. A handler's own
unexpected exception is answered UNKNOWN, as grpclib does, with one line naming its class and top
frame (crash redaction: the traceback's locals may hold an enrolment token).
"""

from __future__ import annotations

import asyncio
import logging
import re
import struct
import time
from collections.abc import Callable, Collection
from contextlib import suppress
from typing import Any

import attrs
from grpclib.const import Handler as MethodHandler
from grpclib.const import Status
from grpclib.encoding.base import GRPC_CONTENT_TYPE, CodecBase, StatusDetailsCodecBase
from grpclib.encoding.proto import ProtoCodec
from grpclib.events import _DispatchServerEvents
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.metadata import Deadline, decode_metadata, encode_grpc_message
from grpclib.protocol import Stream as H2Stream
from grpclib.server import Stream
from grpclib.utils import Wrapper
from h2.exceptions import StreamClosedError

from gateway.listeners.metrics import (
    BAD_MESSAGE_FLAG,
    BAD_METADATA,
    BAD_TIMEOUT,
    COMPRESSED,
    DEADLINE_EXPIRED,
    EXTRA_MESSAGE,
    TRUNCATED_MESSAGE,
)
from gateway.listeners.refusals import Refusals
from supervisors.reason import ExitReason

__all__ = [
    "ListenerStream",
    "RequestRefused",
    "Served",
    "TruncatedMessage",
    "parse_timeout",
]

log = logging.getLogger("yuzu_gw.listeners")

_Headers = Collection[tuple[str, str]]

# gRPC over HTTP/2: `TimeoutValue → {positive integer as ASCII string of at most 8 digits}`.
_TIMEOUT = re.compile(r"([0-9]{1,8})([HMSmun])")
_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_PREFIX = 5  # the compressed flag and the 4-byte length
# What a refused compressed message is told the gateway accepts (the gRPC compression spec).
_ACCEPT_ENCODING = (("grpc-accept-encoding", "identity"),)
# A grpc-encoding token echoed in an answer; anything else is named "an unknown encoding".
_TOKEN = re.compile(r"[A-Za-z0-9._-]{1,32}")


class TruncatedMessage(Exception):
    """The stream ended inside a message (raised by the stream's buffer)."""

    def __init__(self, expected: int, received: int) -> None:
        super().__init__(expected, received)
        self.expected = expected
        self.received = received


class RequestRefused(GRPCError):
    """A call refused for its wire input; `reason` is its label in the refusal counter."""

    def __init__(
        self,
        reason: str,
        status: Status,
        message: str,
        trailers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(status, message)
        self.reason = reason
        self.trailers = trailers


def parse_timeout(headers: _Headers) -> float | None:
    """The smallest `grpc-timeout` in seconds, None when there is none; `RequestRefused`
    (`bad_timeout`) when one does not follow the spec's grammar."""
    timeout: float | None = None
    for name, value in headers:
        if name != "grpc-timeout":
            continue
        match = _TIMEOUT.fullmatch(value)
        if match is None:
            raise RequestRefused(BAD_TIMEOUT, Status.INTERNAL, "malformed grpc-timeout header")
        seconds = int(match.group(1)) * _UNITS[match.group(2)]
        timeout = seconds if timeout is None else min(timeout, seconds)
    return timeout


def _encoding_named(headers: dict[str, str]) -> str:
    encoding = headers.get("grpc-encoding")
    if encoding is None or encoding == "identity":
        return "no grpc-encoding"
    if _TOKEN.fullmatch(encoding) is None:
        return "an unknown grpc-encoding"
    return f"grpc-encoding {encoding}"


class ListenerStream(Stream[Any, Any]):
    """grpclib's server stream whose `recv_message` checks the framing (module doc)."""

    def __init__(self, *args: Any, encoding: str, refusals: Refusals, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._encoding = encoding
        self._refusals = refusals
        self._request_done = False

    async def recv_message(self) -> Any:
        if self._request_done:
            return None
        body = await self._read_message()
        if body is None:
            return None
        if not self._cardinality.client_streaming:
            # The one request message: the client's side must end here.
            extra = await self._read_exact(_PREFIX, inside_message=False, extra=True)
            if extra:
                raise self._refuse(
                    EXTRA_MESSAGE,
                    Status.INTERNAL,
                    "more than one request message on a unary call",
                )
            self._request_done = True
        message = self._codec.decode(body, self._recv_type)
        (message,) = await self._dispatch.recv_message(message)
        self._messages_received += 1
        connection = self._stream.connection
        connection.messages_received += 1
        connection.last_message_received = time.monotonic()
        return message

    async def _read_message(self) -> bytes | None:
        prefix = await self._read_exact(_PREFIX, inside_message=False)
        if not prefix:
            return None
        flag, size = struct.unpack(">BI", prefix)
        if flag == 1:
            raise self._refuse(
                COMPRESSED,
                Status.UNIMPLEMENTED,
                f"compressed message ({self._encoding}) not supported: send it uncompressed",
                _ACCEPT_ENCODING,
            )
        if flag != 0:
            raise self._refuse(BAD_MESSAGE_FLAG, Status.INTERNAL, "invalid compressed-flag byte")
        return await self._read_exact(size, inside_message=True)

    async def _read_exact(self, size: int, *, inside_message: bool, extra: bool = False) -> bytes:
        try:
            return await self._stream.recv_data(size)
        except TruncatedMessage as cut:
            if extra:
                return b"\0"  # any byte after the one message is a second message
            what = f"{cut.expected}-byte message" if inside_message else "5-byte message prefix"
            raise self._refuse(
                TRUNCATED_MESSAGE,
                Status.INTERNAL,
                f"truncated message: the stream ended {cut.received} bytes into a {what}",
            ) from None

    async def send_refusal(self, refused: RequestRefused) -> None:
        """The trailers of a refusal that carries its own `grpc-` trailers, which grpclib's
        `send_trailing_metadata` refuses as reserved metadata keys."""
        headers: list[tuple[str, str]] = []
        if not self._send_initial_metadata_done:
            headers += [(":status", "200"), ("content-type", self._content_type)]
        headers.append(("grpc-status", str(refused.status.value)))
        if refused.message:
            headers.append(("grpc-message", encode_grpc_message(refused.message)))
        headers += refused.trailers
        await self._stream.send_headers(headers, end_stream=True)
        self._send_trailing_metadata_done = True
        if self._stream.closable:
            self._stream.reset_nowait()

    def _refuse(
        self, reason: str, status: Status, message: str, trailers: tuple[tuple[str, str], ...] = ()
    ) -> RequestRefused:
        self._refusals.call(reason, status.name)
        return RequestRefused(reason, status, message, trailers)


async def _answer(
    h2_stream: H2Stream, http_status: int, status: Status | None = None, message: str = ""
) -> None:
    """A trailers-only answer before any handler ran (grpclib's `_abort`, with the message
    percent-encoded as the spec requires)."""
    headers = [(":status", str(http_status))]
    if status is not None:
        headers.append(("content-type", GRPC_CONTENT_TYPE))
        headers.append(("grpc-status", str(status.value)))
        if message:
            headers.append(("grpc-message", encode_grpc_message(message)))
    await h2_stream.send_headers(headers, end_stream=True)
    if h2_stream.closable:
        h2_stream.reset_nowait()


def _crashed(listener: str, what: str, exc: BaseException) -> None:
    """The one line of an unexpected failure: its class and top frame, never its message."""
    reason = ExitReason.crash(exc)
    log.error(
        "gRPC listener %s: %s failed: %s at %s",
        listener,
        what,
        reason.exc_class,
        reason.frame or "?",
    )


@attrs.frozen
class _Call:
    """A stream's request headers, checked: what the handler is started with."""

    name: str
    method: MethodHandler
    timeout: float | None
    metadata: Any
    content_type: str
    user_agent: str | None
    encoding: str


@attrs.frozen(eq=False)
class Served:
    """What every stream of one connection is served with (grpclib's handler's fields)."""

    mapping: dict[str, MethodHandler]
    codec: CodecBase
    status_details_codec: StatusDetailsCodecBase | None
    dispatch: _DispatchServerEvents
    refusals: Refusals

    async def serve_stream(
        self, h2_stream: H2Stream, headers: list[tuple[str, str]], release: Callable[[], Any]
    ) -> None:
        """Serve one RPC stream (module doc); the stream is released however it ends."""
        try:
            call = await self._checked(h2_stream, headers)
            if call is not None:
                await self._run(h2_stream, call)
        except (StreamClosedError, StreamTerminatedError):
            pass  # the client reset the stream or the connection went: nobody reads an answer
        except Exception as exc:
            _crashed(self.refusals.listener, "a call", exc)
        finally:
            release()

    async def _checked(self, h2_stream: H2Stream, headers: list[tuple[str, str]]) -> _Call | None:
        """The call, or None once a refusal was answered. grpclib's checks in its order, then
        the timeout and the metadata."""
        headers_map = dict(headers)
        if headers_map.get(":method") != "POST":
            await _answer(h2_stream, 405)
            return None
        content_type = headers_map.get("content-type")
        if content_type is None:
            await _answer(h2_stream, 415, Status.UNKNOWN, "Missing content-type header")
            return None
        base, _, sub_type = content_type.partition("+")
        sub_type = sub_type or ProtoCodec.__content_subtype__
        if base != GRPC_CONTENT_TYPE or sub_type != self.codec.__content_subtype__:
            await _answer(h2_stream, 415, Status.UNKNOWN, "Unacceptable content-type header")
            return None
        if headers_map.get("te") != "trailers":
            await _answer(
                h2_stream, 400, Status.UNKNOWN, 'Required "te: trailers" header is missing'
            )
            return None
        name = headers_map.get(":path", "")
        method = self.mapping.get(name)
        if method is None:
            await _answer(h2_stream, 200, Status.UNIMPLEMENTED, "Method not found")
            return None
        try:
            timeout = parse_timeout(headers)
            try:
                metadata = decode_metadata(headers)
            except ValueError:  # binascii.Error: a -bin value that is not base64
                raise RequestRefused(
                    BAD_METADATA, Status.INTERNAL, "malformed binary metadata"
                ) from None
            if timeout is not None and timeout <= 0:
                raise RequestRefused(
                    DEADLINE_EXPIRED, Status.DEADLINE_EXCEEDED, "deadline exceeded before the call"
                )
        except RequestRefused as refused:
            self.refusals.call(refused.reason, refused.status.name)
            await _answer(h2_stream, 200, refused.status, refused.message or "")
            return None
        return _Call(
            name,
            method,
            timeout,
            metadata,
            content_type,
            headers_map.get("user-agent"),
            _encoding_named(headers_map),
        )

    async def _run(self, h2_stream: H2Stream, call: _Call) -> None:
        deadline = None if call.timeout is None else Deadline.from_timeout(call.timeout)
        async with ListenerStream(
            h2_stream,
            call.name,
            call.method.cardinality,
            call.method.request_type,
            call.method.reply_type,
            codec=self.codec,
            status_details_codec=self.status_details_codec,
            dispatch=self.dispatch,
            deadline=deadline,
            user_agent=call.user_agent,
            encoding=call.encoding,
            refusals=self.refusals,
        ) as stream:
            wrapper = h2_stream.wrapper = Wrapper()
            timer = None
            if call.timeout is not None:
                # A timer however short the deadline: it fires at the handler's first wait.
                timer = asyncio.get_running_loop().call_later(
                    call.timeout, wrapper.cancel, TimeoutError("deadline exceeded")
                )
            try:
                with wrapper:
                    stream.metadata, method_func = await self.dispatch.recv_request(
                        call.metadata,
                        call.method.func,
                        method_name=call.name,
                        deadline=deadline,
                        content_type=call.content_type,
                        user_agent=call.user_agent,
                        peer=stream.peer,
                    )
                    await method_func(stream)
            except RequestRefused as refused:
                if not refused.trailers:
                    raise
                with suppress(StreamClosedError):
                    await stream.send_refusal(refused)
            except GRPCError:
                raise  # answered by the stream's exit
            except TimeoutError as exc:
                if wrapper.cancelled and not wrapper.cancel_failed:
                    raise GRPCError(Status.DEADLINE_EXCEEDED) from None
                _crashed(self.refusals.listener, call.name, exc)
                raise
            except StreamTerminatedError:
                raise  # reset by the client: answered (if still possible) by the stream's exit
            except Exception as exc:
                # Answered UNKNOWN by the stream's exit, as grpclib does.
                _crashed(self.refusals.listener, call.name, exc)
                raise
            finally:
                if timer is not None:
                    timer.cancel()
                # The error a reset or the deadline cancelled the handler with stays on the
                # wrapper, and its traceback holds this frame, whose `wrapper` holds it: a cycle
                # keeping the handler's frames (the Register, its enrolment token) until a full
                # collection. Everything that reads it (`__exit__`, the checks above) has run.
                wrapper._error = None
