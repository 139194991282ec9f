"""The grpclib pieces the connection slots plug together, and why each is shaped as it is.

grpclib's `Channel` dials lazily on the first call and owns its one connection; the gateway's
slots dial themselves (with their own redial policy and bounds) and must read every SETTINGS
frame the server sends. So:

* `SettingsProtocol`: grpclib's HTTP/2 protocol, plus the server's SETTINGS (the first arrival,
  and SETTINGS_MAX_CONCURRENT_STREAMS from each frame, through the processor's dispatch table
  for h2's RemoteSettingsChanged event) and a future for the loss of the connection.
* `SlotChannel`: a grpclib `Channel` over a connection the slot made, which never dials.
* `Codec`: requests arrive encoded; responses are checked against max_receive_message_bytes.
* h2's record of closed streams is bounded (`gateway.listeners.h2_closed_streams`): the connection
opens
  a stream per call of the whole node for as long as it lives.
* The protocol writes through a `CoalescingTransport` (`writes`, gateway/listeners/coalesce.py),
  which the slot corks around a call's send so its HEADERS and DATA frames leave in one write.
* Every stream `SlotChannel.request` opens is counted and timed (`rpc_metrics.MeteredCall`):
  the one place every upstream call passes, whichever lane makes it.

Written against grpclib 0.4.9; the integration tests exercise every one of these hooks.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any, cast

from grpclib.client import Channel as GrpclibChannel
from grpclib.client import Handler
from grpclib.config import Configuration
from grpclib.const import Cardinality
from grpclib.encoding.base import CodecBase
from grpclib.metadata import Deadline
from grpclib.protocol import H2Protocol
from h2.config import H2Configuration
from h2.events import RemoteSettingsChanged
from h2.settings import SettingCodes

from gateway.config.upstream_client import EndpointSpec
from gateway.listeners.coalesce import CoalescingTransport
from gateway.listeners.h2_closed_streams import bound_closed_streams
from gateway.upstream.failures import ResponseTooLargeError
from gateway.upstream.rpc_metrics import MeteredCall, method_series

__all__ = ["Codec", "SettingsProtocol", "SlotChannel"]

# grpclib's client defaults (no keepalive pings); h2 as grpclib's own client configures it:
# str headers, no header validation or normalisation (grpclib builds valid headers itself).
GRPCLIB_CONFIG = Configuration().__for_client__()


def _h2_config() -> H2Configuration:
    return H2Configuration(
        client_side=True,
        header_encoding="ascii",
        validate_inbound_headers=False,
        validate_outbound_headers=False,
        normalize_inbound_headers=False,
        normalize_outbound_headers=False,
    )


class Codec(CodecBase):
    """Requests arrive encoded (the channel encodes before it picks a connection, so an
    encoding failure is ENCODE and never costs a stream); responses are decoded here, with the
    channel's max_receive_message_bytes."""

    __content_subtype__ = "proto"

    def __init__(self, max_receive: int) -> None:
        self.max_receive = max_receive

    def encode(self, message: Any, message_type: Any) -> bytes:
        assert isinstance(message, bytes)
        return message

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self.max_receive:
            raise ResponseTooLargeError()
        return message_type.FromString(data)


class SettingsProtocol(H2Protocol):
    """grpclib's HTTP/2 protocol, plus the two things the slot must know: the server's
    SETTINGS (first arrival and every stream limit) and the loss of the connection."""

    writes: CoalescingTransport  # set in connection_made

    def __init__(self, loop: asyncio.AbstractEventLoop, on_limit: Callable[[], None]) -> None:
        super().__init__(Handler(), GRPCLIB_CONFIG, _h2_config())
        self.max_streams: int | None = None
        self.settled: asyncio.Future[bool] = loop.create_future()  # True: SETTINGS arrived
        self.lost: asyncio.Future[BaseException | None] = loop.create_future()
        self.lost_error: BaseException | None = None
        self._on_limit = on_limit
        self._loop = loop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The slot corks it around a call's send (gateway/listeners/coalesce.py). uvloop's
        # transports do not subclass asyncio.Transport, hence the cast.
        self.writes = CoalescingTransport(cast(asyncio.Transport, transport), self._loop)
        super().connection_made(self.writes)
        bound_closed_streams(self.connection._connection)
        # The processor's dispatch table is the one place grpclib lets SETTINGS through.
        table = self.processor.processors
        original = table[RemoteSettingsChanged]

        def on_settings(event: RemoteSettingsChanged) -> None:
            original(event)
            self._settings(event)

        table[RemoteSettingsChanged] = on_settings

    def _settings(self, event: RemoteSettingsChanged) -> None:
        changed = event.changed_settings.get(SettingCodes.MAX_CONCURRENT_STREAMS)
        if changed is not None:
            self.max_streams = int(changed.new_value)
        if not self.settled.done():
            self.settled.set_result(True)
        elif changed is not None:
            self._on_limit()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.lost_error = exc
        if not self.settled.done():
            self.settled.set_result(False)
        if not self.lost.done():
            self.lost.set_result(exc)


class SlotChannel(GrpclibChannel):
    """A grpclib channel over a connection the slot made. It never dials: a call that finds
    the connection gone fails (TRANSPORT, closed) instead of opening one outside the slot's
    redial policy."""

    def __init__(
        self,
        endpoint: EndpointSpec,
        context: ssl.SSLContext | None,
        codec: Codec,
        protocol: SettingsProtocol,
    ) -> None:
        super().__init__(endpoint.host, endpoint.port, ssl=context, codec=codec)
        self._protocol = protocol

    def request(  # type: ignore[override]
        self,
        name: str,
        cardinality: Cardinality,
        request_type: Any,
        reply_type: Any,
        *,
        timeout: float | None = None,
        deadline: Deadline | None = None,
        metadata: Any = None,
    ) -> MeteredCall:
        """grpclib's stream, inside `async with` counted and timed (rpc_metrics.py)."""
        stream = super().request(
            name,
            cardinality,
            request_type,
            reply_type,
            timeout=timeout,
            deadline=deadline,
            metadata=metadata,
        )
        return MeteredCall(stream, method_series(name, cardinality))

    async def __connect__(self) -> H2Protocol:
        if not self._connected:
            raise ConnectionResetError("the upstream connection is closed")
        assert self._protocol is not None
        return self._protocol
