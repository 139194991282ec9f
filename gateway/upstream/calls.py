"""The call path of ProxyRegister and ProxyInventory: what a request process runs to call the
server under the shared breaker and a permit (seed: "Register Proxy", "Upstream call permits",
"How the gateway sizes its upstream calls"; SPEC_INDEX REG-03..REG-14, CB-13).

The call runs in the caller's own coroutine (the gRPC handler), not inside an actor, so
registrations go upstream in parallel. In order:

1. The breaker: the state the `upstream` actor published is read from its table, without a
   message. Open: refused at once (`circuit_open`), nothing sent.
2. The deadline: the agent's grpc-timeout less the handler's 5 s margin, or
   upstream_call_timeout_ms when it sent none (read on every call, as the seed says).
3. A permit: `Acquire` asked of `upstream_regulator`. It answers at once, or after the request
   waited in the queue; a full queue or a deadline that passes first is refused
   (`queue_full`, `deadline`), and such a request is never sent.
4. The call: the channel gets min(what is left of the deadline, upstream_rpc_timeout_ms) and
   sends it as grpc-timeout.
5. The outcome is told to the `upstream` actor (breaker, error metric, log line) and the permit
   released.

too_many_streams (the gateway's HTTP/2 client refusing a stream past the server's limit) is not
a breaker failure: nothing was sent. The call hands its permit back, waits 10 ms doubling to
100 ms, and asks again with the same deadline.

Cancellation: a caller whose coroutine is cancelled (stream reset, connection closed) frees its
permit or its place in the queue at once (`Cancel`). A call already sent is not cancelled: it
runs on, shielded, and its outcome still reaches the breaker (seed: "A call already in flight to
the server is not cancelled").

Refusals raise `UpstreamRefused` (the gRPC handler answers UNAVAILABLE); a failed call raises
the channel's `UpstreamCallError`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine, Mapping
from typing import Literal, TypeVar

import attrs
from google.protobuf.message import Message

from actors.core.backoff import TOO_MANY_STREAMS
from actors.core.breaker import Lane, ResultKind
from actors.core.permits import Caller, PermitPolicy
from actors.upstream import NAME as UPSTREAM
from actors.upstream import BreakerView, Outcome, breaker_view
from actors.upstream_regulator import (
    CHANNELS_TABLE,
    DEFAULT_CHANNEL,
    Acquire,
    Cancel,
    PermitGranted,
    PermitRefused,
    Release,
)
from actors.upstream_regulator import NAME as REGULATOR
from gateway.config import Config
from gateway.config.keys.upstream import UPSTREAM_CALL_TIMEOUT_MS, UPSTREAM_RPC_TIMEOUT_MS
from gateway.upstream.api import Channel, UpstreamCallError
from supervisors.address import Address
from supervisors.errors import ActorExited, NoProc
from supervisors.runtime import LoopSystemBase

__all__ = ["HANDLER_MARGIN_S", "RefusalReason", "UpstreamCalls", "UpstreamRefused"]

M = TypeVar("M", bound=Message)

RefusalReason = Literal["circuit_open", "queue_full", "deadline", "stopping", "unavailable"]

# The stream handler's margin (seed: "the agent's grpc-timeout less the stream handler's
# margin"): a queued request gives up while its agent still listens for the refusal.
HANDLER_MARGIN_S = PermitPolicy().handler_margin_s

# The breaker lane of each caller kind (they share their names).
_LANES = {caller: Lane(caller.value) for caller in Caller}

# Request ids: unique within the node, fresh for each permit request (a re-ask after
# too_many_streams is a new request that goes to the back of the queue).
_request_ids = itertools.count(1)

# Calls left running after their caller was cancelled; kept here so they are not collected
# before they end (each ends within upstream_rpc_timeout_ms).
_detached: set[asyncio.Task[object]] = set()


class UpstreamRefused(Exception):
    """The gateway refused the call itself; the gRPC handler answers UNAVAILABLE.

    `circuit_open`: the breaker is open. `queue_full` / `deadline`: no permit (the request was
    not sent). `stopping`: a planned stop. `unavailable`: the upstream actors are not running
    (a restart gap; the seed's upstream_unavailable)."""

    def __init__(self, reason: RefusalReason) -> None:
        super().__init__(reason)
        self.reason: RefusalReason = reason


@attrs.frozen
class UpstreamCalls:
    """What a request process needs to call the server: the node's runtime (for the actors and
    their tables) and its configuration. Build one per node; it holds no state of its own."""

    runtime: LoopSystemBase
    config: Config
    channel_name: str = DEFAULT_CHANNEL

    async def call(
        self,
        caller: Caller,
        method: str,
        request: Message,
        response_type: type[M],
        *,
        grpc_timeout_s: float | None,
        metadata: Mapping[str, str] | None = None,
    ) -> M:
        """Call `method` for `caller` (register, inventory or replay). `grpc_timeout_s` is the
        agent's own grpc-timeout, None when it sent none."""
        runtime = self.runtime
        loop = runtime.loop
        view = self._admit()
        regulator = runtime.whereis(REGULATOR)
        if regulator is None:
            raise UpstreamRefused("unavailable")
        now = loop.time()
        if grpc_timeout_s is None:
            deadline = now + self.config[UPSTREAM_CALL_TIMEOUT_MS] / 1000.0
        else:
            deadline = now + grpc_timeout_s - HANDLER_MARGIN_S
        rpc_timeout_s = self.config[UPSTREAM_RPC_TIMEOUT_MS] / 1000.0
        lane = _LANES[caller]
        attempt = 0
        while True:
            request_id = next(_request_ids)
            await self._acquire(regulator, request_id, caller, deadline)
            cancelled = False
            try:
                # The breaker may have opened while the request waited: do not send it then.
                view = self._admit()
                timeout = min(deadline - loop.time(), rpc_timeout_s)
                if timeout <= 0:
                    raise UpstreamRefused("deadline")
                call = self._unary(
                    method, request, response_type, timeout=timeout, metadata=metadata
                )
                return await self._send(call, _reporter(runtime, view, lane, method))
            except asyncio.CancelledError:
                # The caller is gone: its permit is freed at once.
                cancelled = True
                runtime.tell(regulator, Cancel(request_id))
                raise
            except UpstreamCallError as error:
                if error.kind is not ResultKind.TOO_MANY_STREAMS:
                    raise
            finally:
                if not cancelled:
                    runtime.tell(regulator, Release(request_id))
            # too_many_streams: the permit is back; wait, then ask again like any other call.
            delay = TOO_MANY_STREAMS.delay(attempt)
            attempt += 1
            if loop.time() + delay >= deadline:
                raise UpstreamRefused("deadline")
            await asyncio.sleep(delay)

    # -- steps --

    def _admit(self) -> BreakerView:
        view = breaker_view(self.runtime)
        if view is None:
            raise UpstreamRefused("unavailable")
        if view.is_open:
            raise UpstreamRefused("circuit_open")
        return view

    async def _unary(
        self,
        method: str,
        request: Message,
        response_type: type[M],
        *,
        timeout: float,
        metadata: Mapping[str, str] | None,
    ) -> M:
        table = self.runtime.table(CHANNELS_TABLE)
        channel: Channel | None = table.get(self.channel_name) if table is not None else None
        if channel is None:
            # Like a channel with no live connection: the call fails at once and the breaker
            # sees it (seed UP-03).
            raise UpstreamCallError(ResultKind.TRANSPORT, detail="no upstream channel")
        return await channel.unary(
            method, request, response_type, timeout=timeout, metadata=metadata
        )

    async def _acquire(
        self, regulator: Address, request_id: int, caller: Caller, deadline: float
    ) -> None:
        runtime = self.runtime
        try:
            # No timeout of our own: the regulator answers every Acquire by its deadline (its
            # expire timer), and `ask` raises ActorExited if the regulator ends first. A timer
            # per call here would only cost.
            answer = await runtime.ask(regulator, Acquire(request_id, caller, deadline))
        except asyncio.CancelledError:
            runtime.tell(regulator, Cancel(request_id))
            raise
        except (NoProc, ActorExited):
            raise UpstreamRefused("unavailable") from None
        if isinstance(answer, PermitRefused):
            raise UpstreamRefused(answer.reason)
        if not isinstance(answer, PermitGranted):  # pragma: no cover - the protocol is closed
            runtime.tell(regulator, Cancel(request_id))
            raise UpstreamRefused("unavailable")

    @staticmethod
    async def _send(call: Coroutine[object, object, M], report: Report) -> M:
        """Run the call shielded from the caller's cancellation: a cancelled caller stops
        waiting, the call runs on and reports its own outcome."""
        task = asyncio.ensure_future(_reported(call, report))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                _detached.add(task)
                task.add_done_callback(_forget)
            raise


def _forget(task: asyncio.Task[object]) -> None:
    """A detached call ended: its outcome was reported; nobody wants its error (retrieving it
    keeps asyncio from logging "exception was never retrieved" with the call's details)."""
    _detached.discard(task)
    if not task.cancelled():
        task.exception()


Report = Callable[[ResultKind, "int | None", str], None]


def _reporter(runtime: LoopSystemBase, view: BreakerView, lane: Lane, method: str) -> Report:
    """Tell the `upstream` actor how the call ended, in the breaker period it was admitted in."""

    def report(kind: ResultKind, status: int | None, detail: str) -> None:
        upstream = runtime.whereis(UPSTREAM)
        if upstream is not None:
            outcome = Outcome(view.incarnation, view.epoch, lane, method, kind, status, detail)
            runtime.tell(upstream, outcome)

    return report


async def _reported(call: Coroutine[object, object, M], report: Report) -> M:
    """Await the channel call and report how it ended, whoever still waits for it."""
    try:
        response = await call
    except UpstreamCallError as error:
        report(error.kind, error.status, error.detail)
        raise
    except asyncio.CancelledError:
        raise
    except Exception as error:
        # "an exception raised inside the upstream client's own RPC calls is caught and counted
        # as an RPC error (code exception)". The class only: its text may hold the request.
        name = type(error).__name__
        report(ResultKind.EXCEPTION, None, name)
        raise UpstreamCallError(ResultKind.EXCEPTION, detail=name) from None
    report(ResultKind.OK, None, "")
    return response
