"""Subscribe: the agent's stream process (ARCHITECTURE "The tree"; seed "Subscribe Stream
Proxy", "Known limits" > refused Subscribe; SPEC_INDEX S15-S18, PEND-11).

Admission, in order: `x-yuzu-session-id` missing or empty is INVALID_ARGUMENT; past the storm
bound (gateway/agent/admission.py) RESOURCE_EXHAUSTED with a retry hint, the row untaken; the
registry takes the pending row (`TakePending`): none is NOT_FOUND, the per-connection cap is
UNAVAILABLE; anything else that fails is INTERNAL with one line (method, exception class, top
frame). A take the handler stops waiting for (cancelled, or timed out) is handed back behind it
(`ReleaseTaken`). Then an owner actor is started under `agent_sup` with a `StreamHandle`; if it
cannot be, the taken slot is handed back; an owner that starts on a stream already ended hands
it back itself (actors/agents/owner.py).

Then the stream process only moves frames (actors/agents/api.py is the contract):

- it writes every `CommandRequest` the owner queues, in order, and ends the call with the
  `StreamEnd` the owner closes the handle with (status, details, trailers);
- it reads the agent's `CommandResponse`s and tells each to the owner as `AgentFrame`; a frame
  whose text is not valid UTF-8 is told with each invalid sequence replaced by U+FFFD, and one
  warn-limited WARNING (no agent or session id) says so;
- it watches the owner: an owner that ends without closing the stream ends it UNAVAILABLE (the
  agent registers again). After an abnormal exit it first waits up to 5 s (K32) for a restarted
  owner to take the session over (the owner tells the stream's handle when it does), and follows
  that one;
- the agent going away (its stream reset, its connection closed, a frame that is not protobuf) is
  told to the owner as `StreamClosed`, and the owner ends `normal`. So is the listener sending
  the connection away (the overload go-away, docs/listeners.md), after which the stream ends
  UNAVAILABLE with the connection's retry time in `grpc-retry-pushback-ms`.

No task per message: one reader task per stream, and the handler's own task writes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from google.protobuf.message import DecodeError
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from actors.agents.api import (
    AGENT_SUP_NAME,
    AgentFrame,
    OwnerArgs,
    StreamClosed,
    StreamEnd,
    StreamHandle,
)
from actors.core.admission import Call
from actors.core.heartbeat_sanitise import lenient_class
from actors.registry.api import ReleaseTaken, Taken, TakePending, TakeRefused, registry_address
from actors.registry.registration import RESERVE_TIMEOUT_S
from actors.upstream.api import SESSION_ID_METADATA
from gateway.agent.lenient import Undecoded, repaired
from gateway.agent.plane import AgentPlane, conn_key, crashed, failed
from gateway.agent.status import not_found, session_refused
from gateway.listeners.connection import current_call
from gateway.listeners.retry_hint import PUSHBACK_HEADER, HintedRefusal, RefusalKind, send_refusal
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.address import Address
from supervisors.api import start_child
from supervisors.reason import ExitReason

__all__ = ["OWNER_GONE_DETAILS", "REATTACH_WAIT_S", "REPAIRED_FRAME_LOG", "subscribe"]

log = logging.getLogger("yuzu_gw.agent")

# K32: how long the stream waits for a restarted owner after an abnormal owner exit. Long enough
# for the agent supervisor to restart it and the owner to re-adopt the session; short enough that
# an agent whose owner is gone for good re-registers soon.
REATTACH_WAIT_S = 5.0

# The ends the stream process makes itself; identity tells them from the owner's.
_AGENT_GONE = StreamEnd(Status.CANCELLED.value, "agent stream ended")
_BAD_FRAME = StreamEnd(Status.INTERNAL.value, "a frame from the agent cannot be decoded")
OWNER_GONE_DETAILS = "agent session ended; register again"
_OWNER_GONE = StreamEnd(Status.UNAVAILABLE.value, OWNER_GONE_DETAILS)
SENT_AWAY_DETAILS = "gateway overloaded; register again after the retry time"
REPAIRED_FRAME_LOG = (
    "Subscribe: a frame from an agent had text that is not valid UTF-8; it was delivered with"
    " the invalid bytes replaced"
)
# A frame with text that is not valid UTF-8, read to be repaired.
_LENIENT_FRAME: Any = lenient_class(agent_pb2.CommandResponse.DESCRIPTOR)

AgentStream = Stream[agent_pb2.CommandResponse, agent_pb2.CommandRequest]


async def subscribe(plane: AgentPlane, stream: AgentStream) -> None:
    metadata = stream.metadata
    session_id = metadata.get(SESSION_ID_METADATA, "") if metadata is not None else ""
    if not isinstance(session_id, str) or not session_id:
        raise GRPCError(Status.INVALID_ARGUMENT, f"{SESSION_ID_METADATA} is required")
    key = conn_key()
    handle = StreamHandle()
    # Past the storm bound: refused with a hint before the pending row is taken (it stays for
    # the retry); pending until the owner runs.
    with plane.admitted(Call.SUBSCRIBE):
        taken = await _take(plane, session_id, key)
        row = taken.row
        args = OwnerArgs(
            session_id=row.session_id,
            agent_id=row.agent_id,
            conn_key=key,
            peer=row.peer,
            register=row.register,  # type: ignore[arg-type]
            stream=handle,
            plugins=row.plugins,
        )
        owner = await _start_owner(plane, args)
    plane.metrics.agents_connected.inc()
    try:
        await _StreamProcess(plane, stream, handle, session_id, owner).run()
    finally:
        # Once per counted connect, whichever side ended the stream (or a planned stop).
        plane.metrics.agents_disconnected.inc()


async def _take(plane: AgentPlane, session_id: str, key: Any) -> Taken:
    runtime = plane.runtime
    registry = registry_address(runtime)
    if registry is None:
        raise failed("Subscribe", "registry_unavailable")
    try:
        answer = await runtime.ask(registry, TakePending(session_id, key), RESERVE_TIMEOUT_S)
    except (asyncio.CancelledError, Exception) as exc:
        # Cancelled, or timed out behind a busy mailbox, the take may still be handled: hand its
        # slot back behind it (one mailbox, in order), not at its expiry.
        runtime.tell(registry, ReleaseTaken(session_id))
        if isinstance(exc, Exception):
            raise crashed("Subscribe", exc) from None
        raise
    if isinstance(answer, Taken):
        return answer
    if isinstance(answer, TakeRefused):
        if answer.reason == "not_found":
            raise not_found("no pending registration for this session")
        if answer.reason in ("cap", "connection_down"):
            raise session_refused("Subscribe", answer.reason)
        raise failed("Subscribe", f"refused {answer.reason}")
    raise failed("Subscribe", "unexpected registry answer")


async def _start_owner(plane: AgentPlane, args: OwnerArgs) -> Address:
    runtime = plane.runtime
    release = ReleaseTaken(args.session_id)
    sup = runtime.whereis(AGENT_SUP_NAME)
    if sup is None:
        _tell_registry(plane, release)
        raise failed("Subscribe", "agent_sup_unavailable")
    start = asyncio.ensure_future(start_child(runtime, sup, args))
    try:
        # Shielded: a start already asked of the supervisor completes; if the agent left
        # meanwhile, the new owner is told at once.
        return await asyncio.shield(start)
    except asyncio.CancelledError:
        args.stream.close(_AGENT_GONE)
        start.add_done_callback(lambda task: _orphaned(plane, args.session_id, task))
        raise
    except Exception as exc:
        _tell_registry(plane, release)
        raise crashed("Subscribe", exc) from None


def _orphaned(plane: AgentPlane, session_id: str, task: asyncio.Future[Address]) -> None:
    """The agent left while its owner was being started: the owner, if it started, ends."""
    if task.cancelled() or task.exception() is not None:
        _tell_registry(plane, ReleaseTaken(session_id))
        return
    plane.runtime.tell(task.result(), StreamClosed())


def _tell_registry(plane: AgentPlane, message: object) -> None:
    registry = registry_address(plane.runtime)
    if registry is not None:
        plane.runtime.tell(registry, message)


class _StreamProcess:
    """The loop of one Subscribe stream once its owner runs (module doc)."""

    def __init__(
        self,
        plane: AgentPlane,
        stream: AgentStream,
        handle: StreamHandle,
        session_id: str,
        owner: Address,
    ) -> None:
        self.plane = plane
        self.stream = stream
        self.handle = handle
        self.session_id = session_id
        self.owner = owner
        self.monitor: int | None = None
        # The re-attach wait's deadline while waiting for a restarted owner, else None.
        self.reattach: asyncio.TimerHandle | None = None

    async def run(self) -> None:
        runtime = self.plane.runtime
        # The newest owner: one killed between its start and now may have been restarted and
        # taken the session over already, before anything listened for its word.
        self._watch(self.handle.adopted or self.owner)
        self.handle.on_adopt(self._adopted)
        connection = current_call().connection
        connection.on_sent_away(self._sent_away)
        reader = asyncio.ensure_future(self._read())
        end: StreamEnd | None = None
        try:
            await self.stream.send_initial_metadata()
            while True:
                item = await self.handle.next()
                if isinstance(item, StreamEnd):
                    end = item
                    break
                await self.stream.send_message(item)
        finally:
            reader.cancel()
            self.handle.on_adopt(None)
            self._unwatch()
            connection.forget_sent_away(self._sent_away)
            if end is None or end is _AGENT_GONE or end is _BAD_FRAME:
                # The agent went away (or the handler was cancelled): the owner ends normal.
                self.handle.close(_AGENT_GONE)
                if runtime.is_alive(self.owner):
                    runtime.tell(self.owner, StreamClosed())
        await self._finish(end, connection.goaway_retry_ms)

    async def _finish(self, end: StreamEnd, goaway_retry_ms: int | None) -> None:
        """Write the stream's end; `goaway_retry_ms`: the retry time of the GOAWAY its
        connection got, if it got one."""
        if end is _AGENT_GONE:
            # Nobody reads an answer any more; the stream is reset or the connection gone.
            raise GRPCError(Status.CANCELLED, end.details)
        hint = dict(end.trailers).get(PUSHBACK_HEADER)
        if hint is None and goaway_retry_ms is not None and end.status == Status.UNAVAILABLE.value:
            # The connection was told to go (a planned stop's drain, docs/planned-stop.md): the
            # stream's end says when to come back, as the GOAWAY did. An owner stopped by
            # anything else (its supervisor giving up, say) ends its stream without a hint.
            hint = str(goaway_retry_ms)
        if hint is not None:
            # grpclib refuses `grpc-` metadata, so the retry hint goes out in trailers written
            # by send_refusal.
            refusal = HintedRefusal(RefusalKind.STOPPING, end.details)
            refusal.trailer = (PUSHBACK_HEADER, hint)
            await send_refusal(self.stream, refusal)
            return
        metadata = end.trailers or None
        if end.status == Status.OK.value:
            await self.stream.send_trailing_metadata(metadata=metadata)
            return
        await self.stream.send_trailing_metadata(
            status=Status(end.status), status_message=end.details or None, metadata=metadata
        )

    def _sent_away(self, retry_after_ms: int) -> None:
        """The listener sent this stream's connection away: the session ends as if the agent had
        gone, and the stream tells it when to come back."""
        hint = ((PUSHBACK_HEADER, str(retry_after_ms)),)
        self.handle.close(StreamEnd(Status.UNAVAILABLE.value, SENT_AWAY_DETAILS, hint))
        if self.plane.runtime.is_alive(self.owner):
            self.plane.runtime.tell(self.owner, StreamClosed())

    # -- the agent's frames --

    async def _read(self) -> None:
        runtime = self.plane.runtime
        try:
            async for frame in self.stream:
                response = self._repaired(frame) if isinstance(frame, Undecoded) else frame
                # In a crash gap, until a restarted owner adopts the stream, this goes to the
                # dead owner: no owner is up to take it.
                runtime.tell(self.owner, AgentFrame(response))
        except DecodeError:
            self.handle.close(_BAD_FRAME)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The stream was reset or its connection closed under the read.
            self.handle.close(_AGENT_GONE)
        # A clean end of the agent's side (half close) is not the agent leaving: the stream
        # stays open for what the owner writes until the owner or the connection ends it.

    def _repaired(self, frame: Undecoded) -> agent_pb2.CommandResponse:
        """A frame whose text is not valid UTF-8 (a command's output in another encoding, say):
        delivered with each invalid sequence replaced, as the seed treats text an agent
        controls where it is admitted; the session goes on. `DecodeError` if not protobuf."""
        response = repaired(frame, agent_pb2.CommandResponse, _LENIENT_FRAME)
        self.plane.warn("subscribe_frame_text", REPAIRED_FRAME_LOG)
        return response

    # -- the owner --

    def _watch(self, owner: Address) -> None:
        self.owner = owner
        self.monitor = self.plane.runtime.monitor_callback(
            owner, lambda reason: self._owner_down(owner, reason)
        )

    def _unwatch(self) -> None:
        if self.monitor is not None:
            self.plane.runtime.demonitor(self.monitor)
            self.monitor = None
        if self.reattach is not None:
            self.reattach.cancel()
            self.reattach = None

    def _owner_down(self, owner: Address, reason: ExitReason) -> None:
        if owner != self.owner or self.handle.ended:
            return
        self.monitor = None
        if reason.is_normal or reason.kind == "noproc":
            # It ended its session without closing the stream (or was never up).
            self.handle.close(_OWNER_GONE)
            return
        self.reattach = self.plane.runtime.loop.call_later(REATTACH_WAIT_S, self._no_owner)

    def _adopted(self, owner: Address) -> None:
        """A restarted owner took the session over (`StreamHandle.adopt`, from its `init`):
        follow it, if this stream is waiting for one."""
        if self.reattach is None or self.handle.ended or owner == self.owner:
            return
        self.reattach.cancel()
        self.reattach = None
        self._watch(owner)

    def _no_owner(self) -> None:
        """No restarted owner took the session over within the wait."""
        self.reattach = None
        self.handle.close(_OWNER_GONE)
