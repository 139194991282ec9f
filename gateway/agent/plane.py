"""What every handler of the AgentService shares: the node's runtime, the upstream call path,
the metrics, one warn limiter, and the two rules every method follows.

- **One request message.** `receive` reads a unary request: the message, or `Undecoded` when
  its text is not valid UTF-8 (or it is not protobuf), which the method's own rule reads
  leniently first (gateway/agent/lenient.py: the agent id bound, admission). A request the
  gateway then cannot forward as received (`undecodable`: text that is not valid UTF-8, or no
  protobuf at all) and (`refuse_oversize`) one larger than the server's receive limit are
  refused, INTERNAL, before any upstream call, and the refusal is told to the `upstream` actor
  as a local encoding failure: counted in `yuzu_gw_upstream_rpc_errors_total{code="encode"}`,
  logged through its limiter, and neutral to the breaker (seed: "Known limits"; SPEC_INDEX
  S11, S12, S23). Its detail names the cause (`invalid_utf8`, `not_protobuf`) and that the
  gateway refused it itself, so the upstream actor's line does not read as a call that failed.
- **One line per crash.** `guarded` wraps each handler: any exception that is not a status the
  handler chose is answered INTERNAL with one ERROR line naming the method, the exception class
  and the top frame only. grpclib's own handler would log the whole traceback (its locals can
  hold an enrolment token) and answer UNKNOWN (seed: "A refused Subscribe ends with its own
  status"; SPEC_INDEX S18). A `HintedRefusal` is answered with its retry hint in the trailers
  (gateway/listeners/retry_hint.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import h2.exceptions
from google.protobuf.message import DecodeError, Message
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.server import Stream

from actors.core.admission import Call
from actors.core.breaker import Lane, ResultKind
from actors.core.warn_limit import WarnLimiter
from actors.upstream.actor import Outcome, breaker_view
from actors.upstream.api import UPSTREAM_NAME as UPSTREAM
from gateway.agent.admission import AgentAdmission
from gateway.agent.lenient import Undecoded
from gateway.agent.metrics import AgentMetrics
from gateway.agent.status import internal
from gateway.config import Config
from gateway.listeners.connection import current_call
from gateway.listeners.retry_hint import HintedRefusal, send_refusal
from gateway.upstream.calls import UpstreamCalls
from supervisors.reason import ExitReason
from supervisors.runtime import LoopSystemBase

__all__ = [
    "MAX_REQUEST_BYTES",
    "NOT_PROTOBUF_DETAIL",
    "UNDECODABLE_DETAIL",
    "AgentPlane",
    "conn_key",
    "crashed",
    "failed",
    "guarded",
    "loosened",
    "receive",
    "refuse_oversize",
    "undecodable",
]

log = logging.getLogger("yuzu_gw.agent")

# The server's gRPC receive limit (K03), not raised: a request the gateway would forward over
# it is refused here instead of being answered RESOURCE_EXHAUSTED by the server.
MAX_REQUEST_BYTES = 4_194_304
# What the upstream actor's encode line names for a request refused as `undecodable`: its cause,
# and that nothing left the gateway (`Upstream RPC ProxyRegister raised error:<detail>`).
UNDECODABLE_DETAIL = "invalid_utf8 (the agent's request; refused locally, nothing sent)"
NOT_PROTOBUF_DETAIL = "not_protobuf (the agent's request; refused locally, nothing sent)"

M = TypeVar("M", bound=Message)
Handler = Callable[[Any, Stream[Any, Any]], Awaitable[None]]


@attrs.define(eq=False)
class AgentPlane:
    """One per node, built with the root supervisor's spec (so the summary-line state exists
    before the listeners start, as the seed requires)."""

    runtime: LoopSystemBase
    config: Config
    calls: UpstreamCalls
    metrics: AgentMetrics
    # One line per second per kind, shared by every request process of the node.
    limiter: WarnLimiter = attrs.field(factory=WarnLimiter)
    # Register's and Subscribe's storm bound (gateway/agent/admission.py); None on a plane a
    # test builds without a node's config: every call admitted.
    admission: AgentAdmission | None = None

    def admitted(self, call: Call) -> contextlib.AbstractContextManager[None]:
        """The block of one admitted call, or its `AdmissionRefusal` raised."""
        if self.admission is None:
            return contextlib.nullcontext()
        return self.admission.admitted(call, self.metrics)

    def now(self) -> float:
        return self.runtime.loop.time()

    def warn(self, kind: object, line: str) -> None:
        """A warn-limited WARNING: the first of a kind at once, then one per second with a
        count of the lines held back."""
        suffix = self.limiter.admit(kind, self.now())
        if suffix is not None:
            log.warning("%s%s", line, suffix)

    def local_refusal(self, lane: Lane, method: str, detail: str) -> None:
        """Tell the upstream actor about a request refused before it was sent: its error
        counter and log line, and no move of the breaker (an encode result is neutral)."""
        view = breaker_view(self.runtime)
        upstream = self.runtime.whereis(UPSTREAM)
        if view is None or upstream is None:
            return
        outcome = Outcome(
            view.incarnation, view.epoch, lane, method, ResultKind.ENCODE, None, detail
        )
        self.runtime.tell(upstream, outcome)


def conn_key() -> int | None:
    """The HTTP/2 connection of the call being served; None outside a listener's handler
    (admission then answers `no_connection`)."""
    try:
        return current_call().connection.key
    except LookupError:
        return None


async def receive(stream: Stream[M, Any]) -> M | Undecoded:
    """The one request message of a unary call, or `Undecoded` (module doc)."""
    request: M | Undecoded | None = await stream.recv_message()
    if request is None:
        raise internal("no request message")
    return request


def undecodable(
    plane: AgentPlane, lane: Lane | None, upstream_method: str = "", *, protobuf: bool = True
) -> GRPCError:
    """The INTERNAL for a request that cannot be forwarded as received (module doc). `lane`
    names the upstream call the request is for; None when it is not forwarded as is
    (Heartbeat). `protobuf` False: the bytes are not the message's wire format at all."""
    if lane is not None:
        detail = UNDECODABLE_DETAIL if protobuf else NOT_PROTOBUF_DETAIL
        plane.local_refusal(lane, upstream_method, detail)
    if not protobuf:
        return internal("request cannot be decoded: not a protobuf message")
    return internal("request cannot be decoded")


def loosened(
    plane: AgentPlane, received: Undecoded, lenient: Any, lane: Lane | None, method: str = ""
) -> Any:
    """`received` read with its lenient class; bytes that are not protobuf at all are
    `undecodable`."""
    try:
        return lenient.FromString(received.data)
    except DecodeError:
        raise undecodable(plane, lane, method, protobuf=False) from None


def refuse_oversize(plane: AgentPlane, request: Message, lane: Lane, upstream_method: str) -> None:
    """A request the gateway would send over the server's receive limit (module doc)."""
    if request.ByteSize() > MAX_REQUEST_BYTES:
        plane.local_refusal(lane, upstream_method, "request_too_large")
        raise internal("request larger than 4194304 bytes")


def crashed(method: str, exc: BaseException) -> GRPCError:
    """Log the one line a failed call gets (method, class, top frame: never the message, the
    request or the context) and return the INTERNAL to answer with."""
    reason = ExitReason.crash(exc)
    log.error("%s failed: %s at %s", method, reason.exc_class, reason.frame or "?")
    return internal("Internal error")


def failed(method: str, reason: str) -> GRPCError:
    """The same one line for a failure that is not an exception (a named actor is not
    running): `<method> failed: <reason>`."""
    log.error("%s failed: %s", method, reason)
    return internal("Internal error")


def guarded(method: str) -> Callable[[Handler], Handler]:
    """Answer any unexpected failure of the handler INTERNAL, with one line (module doc)."""

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def run(self: Any, stream: Stream[Any, Any]) -> None:
            try:
                try:
                    await handler(self, stream)
                except HintedRefusal as refusal:
                    await send_refusal(stream, refusal)
            except (GRPCError, asyncio.CancelledError, StreamTerminatedError):
                raise
            except h2.exceptions.StreamClosedError:
                # The agent reset the stream or the connection went: nobody reads an answer.
                raise GRPCError(Status.CANCELLED, "stream closed") from None
            except Exception as exc:
                raise crashed(method, exc) from None

        return run

    return wrap
