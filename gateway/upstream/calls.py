"""The call path of ProxyRegister and ProxyInventory: what a request process runs to call the
server under the shared breaker and a permit (seed: "Register Proxy", "Upstream call permits",
"How the gateway sizes its upstream calls"; SPEC_INDEX REG-03..REG-14, CB-13).

The call runs in the caller's own coroutine (the gRPC handler), not inside an actor, so
registrations go upstream in parallel. In order:

1. The breaker: the state the `upstream` actor published is read from its table, without a
   message. Open: refused at once (`circuit_open`), nothing sent.
2. The deadline: the agent's grpc-timeout less the handler's 5 s margin, or
   upstream_call_timeout_ms when it sent none (read on every call, as the seed says).
3. A permit, taken through the gate `upstream_regulator` publishes (a call on the loop, no
   message). It is granted at once, or after the request waited in the queue; a full queue or
   a deadline that passes first is refused (`queue_full`, `deadline`), and such a request is
   never sent. After a wait the breaker is read again: it may have opened meanwhile.
4. The call: the channel gets min(what is left of the deadline, upstream_rpc_timeout_ms) and
   sends it as grpc-timeout.
5. The outcome is told to the `upstream` actor (breaker, error metric, log line) and the permit
   released.

too_many_streams (the gateway's HTTP/2 client refusing a stream past the server's limit) is not
a breaker failure: nothing was sent. The call hands its permit back, waits 10 ms doubling to
100 ms, and asks again with the same deadline.

Cancellation: a caller whose coroutine is cancelled (stream reset, connection closed) frees its
permit or its place in the queue at once. A call already sent is not cancelled: it runs on,
shielded, and its outcome still reaches the breaker (seed: "A call already in flight to the
server is not cancelled").

Refusals raise `UpstreamRefused` (the gRPC handler answers UNAVAILABLE); a failed call raises
the channel's `UpstreamCallError` (both in actors/upstream/api.py, whose `Calls` this implements
for the `upstream` actor's replays).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine, Mapping
from functools import partial
from typing import Never, TypeVar

import attrs
from google.protobuf.message import Message

from actors.core.backoff import TOO_MANY_STREAMS
from actors.core.breaker import Lane, ResultKind
from actors.core.permits import Caller, PermitPolicy
from actors.upstream.actor import BreakerView, Outcome, breaker_view
from actors.upstream.api import (
    DEFAULT_CHANNEL,
    UPSTREAM_NAME,
    Channel,
    UpstreamCallError,
    UpstreamRefused,
    upstream_channel,
)
from actors.upstream.regulator import PermitGate, permit_gate
from gateway.config import Config
from gateway.config.keys.upstream import UPSTREAM_CALL_TIMEOUT_MS, UPSTREAM_RPC_TIMEOUT_MS
from supervisors.runtime import LoopSystemBase

__all__ = ["HANDLER_MARGIN_S", "UpstreamCalls"]

M = TypeVar("M", bound=Message)

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
        gate = permit_gate(runtime)
        if gate is None:
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
            waited = await _acquire(gate, request_id, caller, deadline)
            release = partial(gate.release, request_id)
            try:
                if waited:
                    # The breaker may have opened while the request waited: do not send it
                    # then. Granted at once, the view just read is still the published one.
                    view = self._admit()
                timeout = min(deadline - loop.time(), rpc_timeout_s)
                if timeout <= 0:
                    raise UpstreamRefused("deadline")
            except UpstreamRefused:
                release()
                raise
            channel = self._channel()
            call = (
                _no_channel()
                if channel is None
                else channel.unary(
                    method, request, response_type, timeout=timeout, metadata=metadata
                )
            )
            try:
                return await _send(loop, call, _reporter(runtime, view, lane, method), release)
            except UpstreamCallError as error:
                if error.kind is not ResultKind.TOO_MANY_STREAMS:
                    raise
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

    def _channel(self) -> Channel | None:
        return upstream_channel(self.runtime, self.channel_name)


async def _acquire(gate: PermitGate, request_id: int, caller: Caller, deadline: float) -> bool:
    """Take a permit or raise `UpstreamRefused`. True when the request had to wait for it.

    No timeout of our own: the regulator answers every waiter by its deadline (its expire
    timer), and `unavailable` if it ends first. A timer per call here would only cost."""
    answer = gate.acquire(request_id, caller, deadline)
    if answer is None:
        return False
    if isinstance(answer, str):
        raise UpstreamRefused(answer)
    try:
        refusal = await answer
    except asyncio.CancelledError:
        gate.cancel(request_id)  # its place, or the permit granted as it was cancelled
        raise
    if refusal is not None:
        raise UpstreamRefused(refusal)
    return True


async def _no_channel() -> Never:
    # Like a channel with no live connection: the call fails at once and the breaker sees it
    # (seed UP-03).
    raise UpstreamCallError(ResultKind.TRANSPORT, detail="no upstream channel")


Report = Callable[[ResultKind, "int | None", str], None]


def _reporter(runtime: LoopSystemBase, view: BreakerView, lane: Lane, method: str) -> Report:
    """Tell the `upstream` actor how the call ended, in the breaker period it was admitted in."""

    def report(kind: ResultKind, status: int | None, detail: str) -> None:
        upstream = runtime.whereis(UPSTREAM_NAME)
        if upstream is not None:
            outcome = Outcome(view.incarnation, view.epoch, lane, method, kind, status, detail)
            runtime.tell(upstream, outcome)

    return report


async def _send(
    loop: asyncio.AbstractEventLoop,
    call: Coroutine[object, object, M],
    report: Report,
    release: Callable[[], None],
) -> M:
    """Run the call as a task of its own (`_run`), which the caller awaits through a future: a
    cancelled caller stops waiting and frees the permit at once; the call runs on, reports its
    own outcome and gives the permit back when it ends (then a no-op)."""
    done: asyncio.Future[M] = loop.create_future()
    task = loop.create_task(_run(call, report, release, done))
    try:
        return await done
    except asyncio.CancelledError:
        release()
        if not task.done():
            _detached.add(task)
            task.add_done_callback(_detached.discard)
        elif not done.cancelled():
            # Answered as the caller went: retrieving a failure keeps asyncio from logging
            # "exception was never retrieved" with the call's details.
            done.exception()
        raise


async def _run(
    call: Coroutine[object, object, M],
    report: Report,
    release: Callable[[], None],
    done: asyncio.Future[M],
) -> None:
    """The call's own task: await the channel, report how the call ended, give the permit back,
    then hand the result to the caller if it still waits. The next waiter's permit and the
    caller's answer leave from here, not a loop turn later from a done callback."""
    failure: UpstreamCallError | None
    try:
        response = await call
    except asyncio.CancelledError:
        release()
        done.cancel()
        raise
    except UpstreamCallError as error:
        failure = error
    except Exception as error:
        # "an exception raised inside the upstream client's own RPC calls is caught and counted
        # as an RPC error (code exception)". The class only: its text may hold the request.
        failure = UpstreamCallError(ResultKind.EXCEPTION, detail=type(error).__name__)
    else:
        failure = None
    try:
        if failure is None:
            report(ResultKind.OK, None, "")
        else:
            report(failure.kind, failure.status, failure.detail)
        release()
    finally:
        # Even after a defect above, the caller gets its answer, unless it went away.
        if done.done():
            pass
        elif failure is None:
            done.set_result(response)
        else:
            done.set_exception(failure)
