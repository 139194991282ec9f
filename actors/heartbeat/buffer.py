"""`heartbeat_buffer`: the actor around the heartbeat buffer core (actors/core/heartbeat_buffer.py).

Request processes tell it `BufferHeartbeat` after answering the agent; it keeps one entry per
session and, every `heartbeat_batch_interval_ms`, flushes the buffer to the server in
`BatchHeartbeat` chunks. The rules (what is kept, chunked, retried, dropped) are the core's; this
module only does the I/O and the timers:

- each `SendChunk` runs as a worker calling the upstream channel (`upstream_channel(runtime)`)
  with at most `upstream_rpc_timeout_ms` (and no more than the shutdown flush's deadline); its
  `WorkerDone` becomes the chunk's `Outcome` (no channel, a timeout, an exception: transient);
- a flush never feeds the circuit breaker (`classify` is NEUTRAL for `Lane.HEARTBEAT_FLUSH`), so
  no result goes to the `upstream` actor;
- `trap_exit`: a planned stop (`ActorExitRequest`) runs the shutdown flush, best effort within
  5 s and 8 chunks, and the actor ends when it is done;
- `Count` effects go to the two metric families (actors/heartbeat/metrics.py), `LogLine`
  effects to the log; `format_status` shows counts only.

The server's verdict in each successful answer (`unknown_session_ids` and its truncated flag) is
read by the verdict core (actors/core/verdicts.py) with the number of heartbeats the chunk held
and the `upstream` actor's mailbox length (read from the runtime, no message); its `Cast` goes to
that actor's registration replay as a `HeartbeatVerdict`, its counts to the verdict metrics
(actors/upstream/replay_metrics.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
from thespian.actors import ActorExitRequest, WakeupMessage

from actors.core import LogLine
from actors.core.breaker import ResultKind
from actors.core.heartbeat_buffer import (
    Count,
    Effect,
    FlushDone,
    HeartbeatBuffer,
    Outcome,
    SendChunk,
    outcome_for_status,
    policy_from_settings,
)
from actors.core.verdicts import Cast, VerdictEffect, VerdictReader
from actors.heartbeat.api import BufferHeartbeat
from actors.heartbeat.metrics import HeartbeatMetrics, heartbeat_metrics
from actors.upstream.actor import NAME as UPSTREAM
from actors.upstream.api import BATCH_HEARTBEAT, UpstreamCallError
from actors.upstream.replay_metrics import ReplayMetrics, replay_metrics
from gateway.config.keys.heartbeat import (
    HEARTBEAT_BATCH_INTERVAL_MS,
    MAX_HEARTBEAT_BUFFER,
    MAX_HEARTBEAT_BUFFER_BYTES,
)
from gateway.config.keys.upstream import UPSTREAM_RPC_TIMEOUT_MS
from gateway.upstream.channel_actor import upstream_channel
from protos.yuzu.gateway.v1 import gateway_pb2
from supervisors.address import Address
from supervisors.messages import WorkerDone
from supervisors.process import Process
from supervisors.reason import SHUTDOWN, ExitReason

if TYPE_CHECKING:
    from gateway.config.context import NodeContext
    from supervisors.runtime import LoopSystemBase

__all__ = ["HeartbeatBufferActor", "outcome_of"]

log = logging.getLogger("yuzu_gw.heartbeat_buffer")

_FLUSH = "heartbeat_flush"
_DEADLINE = "heartbeat_shutdown_deadline"
# A call is never given less than this, so a deadline already reached still gets an answer fast.
_MIN_TIMEOUT_S = 0.001
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


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


class HeartbeatBufferActor(Process):
    trap_exit: ClassVar[bool] = True

    def init(self, args: NodeContext) -> None:
        config = args.config
        policy = policy_from_settings(
            heartbeat_batch_interval_ms=config[HEARTBEAT_BATCH_INTERVAL_MS],
            max_heartbeat_buffer=config[MAX_HEARTBEAT_BUFFER],
            max_heartbeat_buffer_bytes=config[MAX_HEARTBEAT_BUFFER_BYTES],
        )
        self.buffer = HeartbeatBuffer(policy, gateway_node=args.node.name)
        self.rpc_timeout_s = config[UPSTREAM_RPC_TIMEOUT_MS] / 1000.0
        self.metrics: HeartbeatMetrics = heartbeat_metrics(args.registry)
        buffer = self.buffer
        self.metrics.watch(lambda: buffer.sessions)
        self.verdicts = VerdictReader()
        self.verdict_metrics: ReplayMetrics = replay_metrics(args.registry)
        self._stopping = False
        self._flush_timer: Any = self.wakeupAfter(policy.interval_s, _FLUSH)

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
        outcome = outcome_of(done)
        if outcome is Outcome.OK:
            self._on_verdict(done.result, count)
        elif outcome is Outcome.TRANSIENT and not isinstance(done.error, UpstreamCallError):
            # A defect or an unexpected library error: the class only (its text may hold data).
            log.warning(
                "BatchHeartbeat failed with %s; the heartbeats stay buffered",
                type(done.error).__name__,
            )
        self._perform(self.buffer.chunk_result(chunk_id, outcome, self.now()))

    def _on_verdict(self, response: gateway_pb2.BatchHeartbeatResponse, batch: int) -> None:
        """The server's verdict on a chunk of `batch` heartbeats: the sessions it does not hold
        go to the registration replay (an older server's answer has none: nothing happens)."""
        runtime = self.runtime
        upstream = runtime.whereis(UPSTREAM)
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
                case Count():
                    self.verdict_metrics.count(effect)
                case LogLine(level=level, text=text):
                    log.log(_LEVELS[level], "%s", text)

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
                case Count():
                    self.metrics.count(effect)
                case LogLine(level=level, text=text):
                    log.log(_LEVELS[level], "%s", text)
                case SendChunk():
                    self._send(effect)
                case FlushDone(shutdown=True):
                    self.exit(SHUTDOWN)
                case FlushDone():
                    pass

    def _send(self, chunk: SendChunk) -> None:
        timeout = self.rpc_timeout_s
        if chunk.deadline is not None:
            timeout = min(timeout, chunk.deadline - self.now())
        timeout = max(_MIN_TIMEOUT_S, timeout)
        work = ChunkWork(chunk.chunk_id, chunk.count)
        self.run_worker(send_chunk(self.runtime, chunk, timeout), work)
