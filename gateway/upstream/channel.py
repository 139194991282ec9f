"""The upstream channel: `pool_size` connections per endpoint, and the call path over them.

Implements `actors.upstream.api.Channel`. Rules (seed, "The upstream client > How calls use
the channel", "How the gateway sizes its upstream calls", "A CA, certificate or key file that
is wrong"; SPEC_INDEX UP-01..UP-06):

* Every slot (`connection.ConnectionSlot`) is dialled when the channel starts and redialled
  on its own after a loss. A call never passes through an actor: it runs in its caller's task.
* A call takes the next live connection round robin, skipping one that already has as many
  calls in flight as its server allows (so the gateway never opens more streams than the server
  allows on a connection). When every live connection is full the call is refused at once with
  TOO_MANY_STREAMS: nothing was sent, and the permit layer retries it.
* A call that finds no live connection waits, within its own timeout, while a slot is
  connecting; if none is connecting it fails at once with the last connection error (TRANSPORT
  or TLS: econnrefused, closed, an alert name), so a dead server is answered at once and the
  circuit breaker sees it. The timeout covers that wait; what is left is sent as grpc-timeout.
* `server_max_streams()` is the sum of the stream limits the live connections' server declared;
  0 while nothing is known or when a live connection declared no limit. Listeners hear every
  change.
* `tls_files_usable()` is False while the latest connection attempt of the channel failed
  because its SSL options could not be used; the channel then logs one ERROR at once and at
  most one a minute, naming the files at fault (never a keyfile's path).
"""

from __future__ import annotations

import asyncio
import logging
import random as random_module
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from google.protobuf.message import Message

from actors.core.breaker import ResultKind
from actors.upstream.api import UpstreamCallError
from gateway.config.upstream_client import ChannelSpec
from gateway.upstream.connection import (
    CHANNEL_LOGGER,
    ConnectionSlot,
    DialFailure,
    SlotState,
)
from gateway.upstream.ratelimit import Every
from gateway.upstream.redial import REDIAL, Redial, RedialPolicy

__all__ = ["TLS_ERROR_INTERVAL_S", "UpstreamChannel"]

M = TypeVar("M", bound=Message)
# grpc-status 4: what a server answers when the grpc-timeout it was sent passes.
DEADLINE_EXCEEDED = 4

# Seed: the ERROR about unusable TLS options comes "first at once and then at most once a minute".
TLS_ERROR_INTERVAL_S = 60.0


class UpstreamChannel:
    """One named channel. Create it on the loop, `start()` it, `close()` it."""

    def __init__(
        self,
        spec: ChannelSpec,
        *,
        nodelay: bool = True,
        random: Callable[[], float] = random_module.random,
        redial: RedialPolicy = REDIAL,
        on_handshake_failure: Callable[[], None] | None = None,
    ) -> None:
        self.name = spec.name
        self.spec = spec
        self._on_handshake_failure = on_handshake_failure
        # Interleave the endpoints (a1 b1 a2 b2 ...) so round robin alternates between them.
        self._slots = [
            ConnectionSlot(
                channel_name=spec.name,
                endpoint=endpoint,
                index=n + 1,
                connect_timeout_s=spec.connect_timeout_s,
                nodelay=nodelay,
                max_receive=spec.max_receive_message_bytes,
                redial=Redial(redial, random=random),
                events=self,
            )
            for n in range(spec.pool_size)
            for endpoint in spec.endpoints
        ]
        self._cursor = 0
        self._changed = asyncio.Event()
        self._last_error: UpstreamCallError | None = None
        self._total = 0
        self._listeners: list[Callable[[int], None]] = []
        self._tls_files_ok = True
        self._tls_error_log = Every(TLS_ERROR_INTERVAL_S)
        self._started = False
        self._closed = False
        self.log = logging.getLogger(CHANNEL_LOGGER)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Dial every slot (the dials run on the loop; this returns at once)."""
        if self._started:
            raise RuntimeError(f"upstream channel {self.name} already started")
        self._started = True
        loop = loop or asyncio.get_running_loop()
        for slot in self._slots:
            slot.start(loop)

    def close(self) -> None:
        """Close every connection and stop redialling. Calls in flight fail (TRANSPORT);
        calls waiting for a connection fail at once."""
        self._closed = True
        self._last_error = UpstreamCallError(ResultKind.TRANSPORT, detail="channel closed")
        for slot in self._slots:
            slot.close()
        self._wake()
        self._set_total(0)

    # -- the Channel contract --------------------------------------------------------------
    async def unary(
        self,
        method: str,
        request: Message,
        response_type: type[M],
        *,
        timeout: float,
        metadata: Mapping[str, str] | None = None,
    ) -> M:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        payload = self._encode(request)
        slot = await self._connection(loop, deadline)
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise UpstreamCallError(ResultKind.TIMEOUT, detail="deadline exceeded")
        try:
            reply = await slot.call(method, payload, response_type, remaining, metadata)
        except UpstreamCallError as error:
            # The server enforces the grpc-timeout it was sent, so on a busy loop its
            # DEADLINE_EXCEEDED can arrive before the call's own timer fires: the same deadline
            # passing, so the same result (a timeout), whichever side noticed first.
            if error.status == DEADLINE_EXCEEDED and loop.time() >= deadline:
                raise UpstreamCallError(ResultKind.TIMEOUT, detail="deadline exceeded") from error
            raise
        return reply  # type: ignore[return-value]

    def server_max_streams(self) -> int:
        return self._total

    def add_settings_listener(self, listener: Callable[[int], None]) -> None:
        self._listeners.append(listener)

    def tls_files_usable(self) -> bool:
        return self._tls_files_ok

    # -- introspection ---------------------------------------------------------------------
    def live_connections(self) -> int:
        return sum(1 for s in self._slots if s.live)

    def connection_states(self) -> dict[str, int]:
        counts = {state.value: 0 for state in SlotState}
        for slot in self._slots:
            counts[slot.state.value] += 1
        return counts

    def status(self) -> Mapping[str, Any]:
        """For format_status and the console: counts and reasons, no paths or payloads."""
        return {
            "connections": [slot.status() for slot in self._slots],
            "server_max_streams": self._total,
            "tls_files_usable": self._tls_files_ok,
            "last_error": self._last_error.detail if self._last_error else None,
        }

    # -- the call path ---------------------------------------------------------------------
    @staticmethod
    def _encode(request: Message) -> bytes:
        if not isinstance(request, Message):
            raise UpstreamCallError(ResultKind.ENCODE, detail="request is not a message")
        try:
            return request.SerializeToString()
        except Exception as exc:
            raise UpstreamCallError(ResultKind.ENCODE, detail=type(exc).__name__) from None

    def _pick(self) -> ConnectionSlot | None:
        count = len(self._slots)
        for step in range(count):
            slot = self._slots[(self._cursor + step) % count]
            if slot.live and slot.has_room():
                self._cursor = (self._cursor + step + 1) % count
                return slot
        return None

    async def _connection(self, loop: asyncio.AbstractEventLoop, deadline: float) -> ConnectionSlot:
        while True:
            slot = self._pick()
            if slot is not None:
                return slot
            if any(s.live for s in self._slots):
                raise UpstreamCallError(
                    ResultKind.TOO_MANY_STREAMS,
                    detail="every live connection has as many streams as the server allows",
                )
            if self._closed or not any(s.state is SlotState.CONNECTING for s in self._slots):
                raise self._last_error or UpstreamCallError(
                    ResultKind.TRANSPORT, detail="no connection"
                )
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise UpstreamCallError(
                    ResultKind.TIMEOUT, detail="no connection came up within the call's timeout"
                )
            changed = self._changed
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                raise UpstreamCallError(
                    ResultKind.TIMEOUT, detail="no connection came up within the call's timeout"
                ) from None

    def _wake(self) -> None:
        # One event per generation: every waiter re-checks, and later waiters get a fresh one.
        self._changed.set()
        self._changed = asyncio.Event()

    # -- what the slots report (connection.SlotEvents) -------------------------------------
    def slot_changed(self, slot: ConnectionSlot) -> None:
        if slot.state is SlotState.UP:
            self._tls_files_ok = True
            self._tls_error_log.reset()
        elif slot.state is SlotState.BACKOFF and slot.last_error is not None:
            self._last_error = slot.last_error
        self._set_total(self._sum_limits())
        self._wake()

    def dial_failed(self, slot: ConnectionSlot, failure: DialFailure) -> None:
        if failure.handshake and self._on_handshake_failure is not None:
            self._on_handshake_failure()
        if not failure.tls_options:
            self._tls_files_ok = True
            self._tls_error_log.reset()
            return
        self._tls_files_ok = False
        if self._tls_error_log.allow(asyncio.get_running_loop().time()):
            self.log.error("%s", self._tls_error_text(failure))

    def _tls_error_text(self, failure: DialFailure) -> str:
        if failure.file_problems:
            cause = "; ".join(failure.file_problems)
        else:
            cause = (
                "none of the files (cacertfile, certfile, keyfile) is at fault, so the cause is"
                f" one of the other TLS options (the TLS library says {failure.tls_detail})"
            )
        return (
            f"Upstream channel {self.name}: the TLS client options cannot be used, so every"
            f" connection fails: {cause}. The gateway keeps retrying and /readyz stays 503"
            " until this is fixed."
        )

    def _sum_limits(self) -> int:
        live = [s for s in self._slots if s.live]
        if not live or any(s.max_streams is None for s in live):
            return 0
        return sum(s.max_streams for s in live if s.max_streams is not None)

    def _set_total(self, total: int) -> None:
        if total == self._total:
            return
        self._total = total
        for listener in list(self._listeners):
            try:
                listener(total)
            except Exception:
                # A listener's bug must not stop the others or the slot that reported.
                self.log.exception("upstream channel %s: a settings listener failed", self.name)
