"""What the `upstream` actor's lanes share: the host they run in and how one call runs on a worker.

A lane (the stream-status notifications in actors/upstream/notify.py, the Guardian forwards in
actors/upstream/guardian.py) is a helper object the `upstream` actor delegates its messages to.
It never owns the breaker: it asks the host for admission, runs each RPC as a worker
(`Process.run_worker`, so nothing waits inside `receiveMessage`), and hands every result back
to the host's one breaker shell (`LaneHost.record`), which counts the RPC error, logs its line
and feeds the breaker, the same path the call path's `Outcome` messages take.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs
from google.protobuf.message import Message

from actors.core.breaker import Breaker, Effect, Lane, ResultKind, Ticket
from actors.upstream.api import UpstreamCallError, upstream_channel
from supervisors.messages import WorkerDone

if TYPE_CHECKING:
    from supervisors.address import Address
    from supervisors.runtime import LoopSystemBase
    from supervisors.table import Table

__all__ = [
    "CallResult",
    "LaneHost",
    "class_and_why",
    "result_of",
    "start_call",
    "start_killable_call",
]

M = TypeVar("M", bound=Message)


class LaneHost(Protocol):
    """The part of the `upstream` actor a lane uses."""

    breaker: Breaker
    # The host's protected state table (`upstream_state`): a lane publishes what other code
    # reads without a message there (its saturation, for the slow-server sampler).
    table: Table[Any, Any]

    @property
    def runtime(self) -> LoopSystemBase: ...

    def now(self) -> float: ...

    def send(self, target: Address, msg: Any) -> None: ...

    def run_worker(self, coro: Coroutine[Any, Any, Any], tag: Any = None) -> None: ...

    def wakeupAfter(
        self, timePeriod: float | datetime.timedelta, payload: Any = None
    ) -> asyncio.TimerHandle: ...

    def cancel_wakeup(self, handle: asyncio.TimerHandle) -> None: ...

    def perform(self, effects: list[Effect]) -> None:
        """Carry out breaker effects (transition lines, the published state, drains)."""
        ...

    def record(self, ticket: Ticket, lane: Lane, method: str, result: CallResult) -> None:
        """One call's result: the RPC error metric and line, then the breaker."""
        ...


@attrs.frozen
class CallResult:
    """How a lane's call ended, as the breaker classifies it. `response` only when OK."""

    kind: ResultKind
    status: int | None = None
    detail: str = ""
    response: Any = None


# The seed writes what a call raised as Erlang's `<Class>:<Why>`, and a request the gateway's own
# encoder refused as `error:request_too_large`: so its class is `error`, every other kind's is
# the kind's name (`exception:<Class>`, `status:<code>`).
ENCODE_CLASS = "error"


def class_and_why(kind: ResultKind, why: object) -> str:
    """`<Class>:<Why>` of a call's failure, for its log lines."""
    return f"{ENCODE_CLASS if kind is ResultKind.ENCODE else kind.value}:{why}"


def result_of(done: WorkerDone) -> CallResult | None:
    """The call's result, or None when the worker died of something the call path does not
    raise (a defect in the gateway: the store counts it `crashed`)."""
    error = done.error
    if error is None:
        return CallResult(ResultKind.OK, response=done.result)
    if isinstance(error, UpstreamCallError):
        return CallResult(error.kind, error.status, error.detail)
    return None


async def _unary(
    runtime: LoopSystemBase,
    method: str,
    build: Callable[[], Message],
    response_type: type[M],
    timeout: float,
) -> M:
    channel = upstream_channel(runtime)
    if channel is None:
        # Like a channel with no live connection: the call fails at once and the breaker sees it
        # (seed UP-03), as in gateway/upstream/calls.py.
        raise UpstreamCallError(ResultKind.TRANSPORT, detail="no upstream channel")
    try:
        # Built here, not in the actor, so a value protobuf refuses (a lone surrogate in an
        # agent id) is the gateway's encode failure: breaker-neutral, and only this call lost.
        request = build()
    except Exception as exc:
        raise UpstreamCallError(ResultKind.ENCODE, detail=type(exc).__name__) from None
    try:
        return await channel.unary(method, request, response_type, timeout=timeout)
    except (UpstreamCallError, asyncio.CancelledError):
        raise
    except Exception as exc:
        # "an exception raised inside the upstream client's own RPC calls is caught and counted
        # as an RPC error (code exception)". The class only: its text may hold the request.
        raise UpstreamCallError(ResultKind.EXCEPTION, detail=type(exc).__name__) from None


def start_call(
    host: LaneHost,
    tag: Any,
    method: str,
    build: Callable[[], Message],
    response_type: type[M],
    *,
    timeout: float,
) -> None:
    """Run one unary call as a worker of `host`; its result comes back as `WorkerDone(tag)`.
    The call is the worker itself (one task): the actor ending cancels it."""
    host.run_worker(_unary(host.runtime, method, build, response_type, timeout), tag)


async def _relay(task: asyncio.Task[M]) -> M:
    # Cancelling `task` (a probe past its deadline) cancels this worker too, so the runtime
    # delivers no WorkerDone for it; the actor ending cancels this worker, and with it `task`.
    return await task


def start_killable_call(
    host: LaneHost,
    tag: Any,
    method: str,
    build: Callable[[], Message],
    response_type: type[M],
    *,
    timeout: float,
) -> asyncio.Task[M]:
    """`start_call` for a call the lane may have to kill (a probe past its deadline): the call
    runs as a task of its own behind a relay worker, and that task is returned; cancelling it
    ends the call without a WorkerDone. The relay costs a second task and a loop turn, so only
    the calls that can be killed take it."""
    task = host.runtime.loop.create_task(
        _unary(host.runtime, method, build, response_type, timeout)
    )
    # A relay cancelled before it first ran (its actor ended) never awaits the call: its
    # failure is then nobody's, and must not surface as "exception was never retrieved".
    task.add_done_callback(_settled)
    host.run_worker(_relay(task), tag)
    return task


def _settled(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
