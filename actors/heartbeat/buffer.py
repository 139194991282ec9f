"""`heartbeat_buffer`: the actor around the heartbeat buffer core (actors/core/heartbeat_buffer.py).

Request processes tell it `BufferHeartbeat` after answering the agent; it keeps one entry per
session and, every `heartbeat_batch_interval_ms`, flushes the buffer to the server in
`BatchHeartbeat` chunks. The rules (what is kept, chunked, retried, dropped) are the core's; this
module only does the I/O and the timers:

- each `SendChunk` runs as a worker calling the upstream channel (`upstream_channel(runtime)`,
  actors/upstream/api.py) with at most `upstream_rpc_timeout_ms` (and no more than the
  shutdown flush's deadline); its `WorkerDone` becomes the chunk's `Outcome` (no channel, a
  timeout, an exception: transient);
- a flush never feeds the circuit breaker (`classify` is NEUTRAL for `Lane.HEARTBEAT_FLUSH`), so
  no `Outcome` goes to the `upstream` actor; a failed chunk goes there as `CallFailed`
  (`call_failed`), which counts it in yuzu_gw_upstream_rpc_errors_total{rpc_name="batch_heartbeat"}
  and logs its `Upstream RPC BatchHeartbeat ...` line, rate limited, like every other RPC's;
- `trap_exit`: a planned stop (`ActorExitRequest`) runs the shutdown flush, best effort within
  5 s and 8 chunks, and the actor ends when it is done;
- `Count` effects go to the two metric families (actors/heartbeat/metrics.py), `LogLine`
  effects to the log (both through actors/effects.py); `format_status` shows counts only.

The server's verdict in each successful answer (`unknown_session_ids` and its truncated flag) is
read by the verdict core (actors/core/verdicts.py) with the number of heartbeats the chunk held
and the `upstream` actor's mailbox length (read from the runtime, no message); its `Cast` goes to
that actor's registration replay as a `HeartbeatVerdict`, its counts to the verdict metrics
(`HeartbeatBufferArgs.verdict_counts`: the families of actors/upstream/replay_metrics.py, which
say why they live there).

It starts with `HeartbeatBufferArgs`, built from the Config by gateway/node/children/heartbeat.py.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
from prometheus_client import CollectorRegistry
from thespian.actors import ActorExitRequest, WakeupMessage

from actors.core.breaker import ResultKind
from actors.core.heartbeat_buffer import (
    Effect,
    FlushDone,
    HeartbeatBuffer,
    HeartbeatPolicy,
    Outcome,
    SendChunk,
    outcome_for_status,
)
from actors.core.verdicts import Cast, VerdictEffect, VerdictReader
from actors.effects import Counts, carry_out
from actors.heartbeat.api import BufferHeartbeat
from actors.heartbeat.metrics import HeartbeatMetrics, heartbeat_metrics
from actors.upstream.api import (
    BATCH_HEARTBEAT,
    UPSTREAM_NAME,
    CallFailed,
    UpstreamCallError,
    upstream_channel,
)
from protos.yuzu.gateway.v1 import gateway_pb2
from supervisors.address import Address
from supervisors.messages import WorkerDone
from supervisors.process import Process
from supervisors.reason import SHUTDOWN, ExitReason

if TYPE_CHECKING:
    from supervisors.runtime import LoopSystemBase

__all__ = ["HeartbeatBufferActor", "HeartbeatBufferArgs", "call_failed", "outcome_of"]

log = logging.getLogger("yuzu_gw.heartbeat_buffer")

_FLUSH = "heartbeat_flush"
_DEADLINE = "heartbeat_shutdown_deadline"
# A call is never given less than this, so a deadline already reached still gets an answer fast.
_MIN_TIMEOUT_S = 0.001


@attrs.frozen
class HeartbeatBufferArgs:
    """The buffer core's policy, this node's name (each batch carries it), the timeout of a
    BatchHeartbeat (upstream_rpc_timeout_ms), the registry of the buffer's metrics
    (actors/heartbeat/metrics.py) and where the verdict's counts go."""

    policy: HeartbeatPolicy
    gateway_node: str
    rpc_timeout_s: float
    registry: CollectorRegistry
    verdict_counts: Counts


@attrs.frozen
class ChunkWork:
    """The tag of the worker sending chunk `chunk_id` of `count` heartbeats (the verdict's
    batch)."""

    chunk_id: int
    count: int = 0


async def send_chunk(
    runtime: LoopSystemBase, chunk: SendChunk, timeout: float
) -> gateway_pb2.BatchHeartbeatResponse:
    """One BatchHeartbeat of `chunk`; raises `UpstreamCallError` (or anything the channel
    raises, which `outcome_of` reads as transient)."""
    channel = upstream_channel(runtime)
    if channel is None:
        raise UpstreamCallError(ResultKind.TRANSPORT, detail="no upstream channel")
    try:
        request = chunk.request()
    except Exception as exc:
        raise UpstreamCallError(ResultKind.ENCODE, detail=type(exc).__name__) from None
    return await channel.unary(
        BATCH_HEARTBEAT, request, gateway_pb2.BatchHeartbeatResponse, timeout=timeout
    )


def outcome_of(done: WorkerDone) -> Outcome:
    """A chunk worker's end as the buffer core reads it."""
    error = done.error
    if error is None:
        return Outcome.OK
    if isinstance(error, UpstreamCallError):
        if error.kind is ResultKind.STATUS and error.status is not None:
            return outcome_for_status(error.status)
        if error.kind is ResultKind.ENCODE:
            return Outcome.UNENCODABLE
    return Outcome.TRANSIENT


def call_failed(error: BaseException) -> CallFailed:
    """A failed chunk as the `upstream` actor counts and logs it. The manual: "a marshal failure
    on the heartbeat buffer's flush is counted as code="exception"" (no encode series exists for
    batch_heartbeat). Anything else the channel raised is named by its class only: its text may
    hold the request."""
    if isinstance(error, UpstreamCallError):
        kind = ResultKind.EXCEPTION if error.kind is ResultKind.ENCODE else error.kind
        return CallFailed(BATCH_HEARTBEAT, kind, error.status, error.detail)
    return CallFailed(BATCH_HEARTBEAT, ResultKind.EXCEPTION, detail=type(error).__name__)


class HeartbeatBufferActor(Process):
    trap_exit: ClassVar[bool] = True

    def init(self, args: HeartbeatBufferArgs) -> None:
        self.buffer = HeartbeatBuffer(args.policy, gateway_node=args.gateway_node)
        self.rpc_timeout_s = args.rpc_timeout_s
        self.metrics: HeartbeatMetrics = heartbeat_metrics(args.registry)
        buffer = self.buffer
        self.metrics.watch(lambda: buffer.sessions)
        self.verdicts = VerdictReader()
        self.verdict_counts = args.verdict_counts
        self._stopping = False
        self._flush_timer: Any = self.wakeupAfter(args.policy.interval_s, _FLUSH)

    def terminate(self, reason: ExitReason) -> None:
        self.metrics.unwatch()  # what is still buffered dies with this actor

    def format_status(self) -> Mapping[str, Any]:
        # Counts only: the buffer holds session ids, tags and snapshots, which must never show.
        return {**attrs.asdict(self.buffer.status()), **self.verdicts.status()}

    # -- messages --

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        match msg:
            case BufferHeartbeat(heartbeat=heartbeat):
                self._perform(self.buffer.intake(heartbeat))
            case WorkerDone(tag=ChunkWork(chunk_id=chunk_id, count=count)):
                self._on_chunk_done(chunk_id, count, msg)
            case WakeupMessage(payload=payload) if payload == _FLUSH:
                self._on_flush_timer()
            case WakeupMessage(payload=payload) if payload == _DEADLINE:
                self._perform(self.buffer.poll(self.now()))
            case ActorExitRequest():
                self._start_shutdown()
            case _:
                pass

    def _on_flush_timer(self) -> None:
        self._flush_timer = None
        if self._stopping:
            return
        self._flush_timer = self.wakeupAfter(self.buffer.policy.interval_s, _FLUSH)
        self._perform(self.buffer.start_flush(self.now()))

    def _on_chunk_done(self, chunk_id: int, count: int, done: WorkerDone) -> None:
        error = done.error
        if error is None:
            self._on_verdict(done.result, count)
        elif (upstream := self.runtime.whereis(UPSTREAM_NAME)) is not None:
            self.send(upstream, call_failed(error))  # in its restart gap it goes uncounted
        self._perform(self.buffer.chunk_result(chunk_id, outcome_of(done), self.now()))

    def _on_verdict(self, response: gateway_pb2.BatchHeartbeatResponse, batch: int) -> None:
        """The server's verdict on a chunk of `batch` heartbeats: the sessions it does not hold
        go to the registration replay (an older server's answer has none: nothing happens)."""
        runtime = self.runtime
        upstream = runtime.whereis(UPSTREAM_NAME)
        mailbox = None if upstream is None else runtime.mailbox_len(upstream)
        effects: list[VerdictEffect] = self.verdicts.read(
            response.unknown_session_ids,
            response.unknown_session_ids_truncated,
            batch,
            self.now(),
            mailbox,
        )
        for effect in effects:
            match effect:
                case Cast(verdict=verdict) if upstream is not None:
                    self.send(upstream, verdict)
                case _:
                    carry_out(effect, log, self.verdict_counts)

    def _start_shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        if self._flush_timer is not None:
            self.cancel_wakeup(self._flush_timer)
            self._flush_timer = None
        now = self.now()
        self._perform(self.buffer.start_shutdown_flush(now))
        if self.buffer.stopped:
            return  # the FlushDone above ended the actor
        deadline = self.buffer.deadline
        if deadline is not None:
            self.wakeupAfter(max(0.0, deadline - now), _DEADLINE)

    # -- effects --

    def _perform(self, effects: list[Effect]) -> None:
        for effect in effects:
            match effect:
                case SendChunk():
                    self._send(effect)
                case FlushDone(shutdown=True):
                    self.exit(SHUTDOWN)
                case FlushDone():
                    pass
                case _:
                    carry_out(effect, log, self.metrics)

    def _send(self, chunk: SendChunk) -> None:
        timeout = self.rpc_timeout_s
        if chunk.deadline is not None:
            timeout = min(timeout, chunk.deadline - self.now())
        timeout = max(_MIN_TIMEOUT_S, timeout)
        work = ChunkWork(chunk.chunk_id, chunk.count)
        self.run_worker(send_chunk(self.runtime, chunk, timeout), work)
