"""The stream-status notification lane of the `upstream` actor: the shell around the held store.

The rules live in the pure core (actors/core/notify_store.py and resend.py; the operator's view
is docs/stream-status-notifications.md). This shell turns the actor's messages into calls on the
core and carries out the effects it returns:

* `Notify` (told by an agent owner) -> `offer`, then `drain` with the breaker's state and epoch.
  `holds_session` reads the public `owners` table (a missing table or row: not held), and
  `replay_active` asks the actor's replay lane (`replay_active`, set by the actor).
* `Send` -> a worker calling NotifyStreamStatus through the upstream channel, admitted by
  `Breaker.admit_notification` (the half-open probe takes the breaker's probe slot). The probe's
  call gets notify_probe_timeout_ms and a timer of its own: a probe that has not reported by
  then is killed (its task cancelled), which the store counts as a failed probe and the breaker
  as PROBE_KILLED. Every other send gets upstream_rpc_timeout_ms.
* Results -> `sent_ok` / `unacknowledged` / `sent_failed` / `rejected` / `crashed`, then the
  host's breaker shell with `Lane.NOTIFY` (the same path an `Outcome` takes), then a drain.
* Timers: the store's `next_deadline` (a resend falls due, a DISCONNECTED's window ends).
  Breaker transitions to closed and ProbeReady drain too (the host calls `drain`).
* `Count` -> the prometheus counters; gauges are read at scrape time; `LogLine` -> logging
  (both through actors/effects.py); `ArmFullReplay` -> an INFO line, a count and `arm_replay`
  (the replay lane, set by the actor: actors/upstream/replay.py); `Settled` -> `on_settled`
  (the owner-recovery lane, actors/upstream/recovery.py, set by the actor).
* The planned stop's step 5 (`FlushNotifications`, asked by prep_stop) runs the core's
  `begin_flush` / `flush` / `finish_flush` and answers `FlushDone` when nothing is left or the
  budget is spent.

The store's policy (notify_pending_max in force, the resend timings) and what every notification
carries come in `NotifyArgs`, built from the Config by gateway/node/children/upstream.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs
from grpclib.const import Status

from actors.core.breaker import REQUEST_FAULT_STATUSES, Lane, ResultKind, Ticket
from actors.core.notify_store import (
    ArmFullReplay,
    Event,
    Mode,
    Notification,
    NotifyEffect,
    NotifyPolicy,
    NotifyStore,
    Send,
    Settled,
    log_text,
)
from actors.core.slow_server import LaneFlag, SlowLane
from actors.core.warn_limit import WarnLimiter
from actors.effects import carry_out
from actors.registry.api import OWNERS_TABLE
from actors.upstream.api import NOTIFY_STREAM_STATUS, Notify, NotifyHold
from actors.upstream.lane import (
    CallResult,
    LaneHost,
    class_and_why,
    result_of,
    start_call,
    start_killable_call,
)
from protos.yuzu.gateway.v1 import gateway_pb2
from supervisors.errors import TableGone
from supervisors.messages import WorkerDone

if TYPE_CHECKING:
    from actors.upstream.metrics import NotifyMetrics
    from supervisors.address import Address

__all__ = [
    "FAILED_LINE",
    "HELD_STATES",
    "REPLAY_ARMED_LINE",
    "WIRE_CAPABILITIES",
    "FlushDone",
    "FlushNotifications",
    "NotifyArgs",
    "NotifyLane",
    "NotifyTimer",
    "NotifyWork",
    "RaiseNotifyCap",
]

log = logging.getLogger("yuzu_gw.upstream")

# Wire features this gateway forwards untouched (WIRE.md): the server may stamp dispatch tags on
# commands for sessions announced with it.
WIRE_CAPABILITIES: Final = ("command_dispatch_tag_v1",)
# Owner-table states in which the node still holds the session (actors/registry/api.py): a
# refused CONNECTED is resent only while it does.
HELD_STATES: Final = frozenset({"live", "recovering"})
# The seed names "Failed to notify stream status" as the line that accompanies a failed send
# (L10; not limited); the rest of the text is this rebuild's.
FAILED_LINE: Final = "Failed to notify stream status ({event}) for {agent}: {why}; {then}"
# The seed names no line for an armed replay; at most one a second, with the count held back.
REPLAY_ARMED_LINE: Final = (
    "A CONNECTED stream status notification was lost; a full registration replay is armed"
    " (trigger notify_loss)"
)

_EVENTS: Final = {
    Event.CONNECTED: gateway_pb2.StreamStatusNotification.CONNECTED,
    Event.DISCONNECTED: gateway_pb2.StreamStatusNotification.DISCONNECTED,
}


# --- messages -----------------------------------------------------------------------------------


@attrs.frozen
class FlushNotifications:
    """Ask (the node's prep_stop, step 5): send every held notification whatever the breaker,
    64 at a time, for at most `budget_s` seconds; answered with `FlushDone` when nothing is left
    or the budget is spent. Notifications offered afterwards are counted lost, not sent."""

    budget_s: float


@attrs.frozen
class FlushDone:
    """`sent`: sends the flush started; `left`: notifications never sent (lost{shutdown})."""

    sent: int
    left: int


@attrs.frozen
class RaiseNotifyCap:
    """Tell (prep_stop, step 1): raise notify_pending_max by `extra` held keys (the seed raises
    it by 2 x the sessions held, so every session's DISCONNECTED fits), and from now on send as
    many at once as the flush (`NotifyStore.widen_for_stop`)."""

    extra: int = attrs.field(validator=attrs.validators.ge(0))


@attrs.frozen
class NotifyWork:
    """The tag of a notification worker's `WorkerDone`."""

    token: int


@attrs.frozen
class NotifyTimer:
    """The payload of the lane's wakeups: a resend falls due (`due`), the probe's deadline
    (`probe`, with its token), the planned-stop flush budget (`flush`)."""

    kind: Literal["due", "probe", "flush"]
    token: int = 0


@attrs.frozen
class NotifyArgs:
    """What the lane reads: the store's policy, and this node's name and cluster id, which every
    notification carries (`gateway_node`, `cluster_id`)."""

    policy: NotifyPolicy
    gateway_node: str
    cluster_id: str


# --- the lane -----------------------------------------------------------------------------------


@attrs.define(eq=False)
class _Out:
    """A send in flight: what its result needs (its breaker ticket, its notification for the
    lines) and, for the probe, its call (killed past its deadline) and that deadline's timer."""

    ticket: Ticket
    note: Notification
    task: asyncio.Task[Any] | None = None
    timer: asyncio.TimerHandle | None = None


@attrs.define(eq=False)
class _Flush:
    waiters: list[Address]
    deadline: float
    timer: asyncio.TimerHandle | None


class NotifyLane:
    """The held store and the workers, timers and metrics around it. Owned by the `upstream`
    actor; everything here runs inside its `receiveMessage`. Every send but the probe takes
    `rpc_timeout_s` (upstream_rpc_timeout_ms)."""

    def __init__(
        self,
        host: LaneHost,
        args: NotifyArgs,
        rpc_timeout_s: float,
        metrics: NotifyMetrics,
        hold: NotifyHold | None,
    ) -> None:
        self.host = host
        self.rpc_timeout_s = rpc_timeout_s
        self.gateway_node = args.gateway_node
        self.cluster_id = args.cluster_id
        self.metrics = metrics
        # The store lives in the node's notification hold, so a restarted actor sends what its
        # predecessor held (`adopt`, below); without a hold it is this actor's own.
        adopted = hold is not None and hold.store is not None
        if hold is not None and hold.store is not None:
            self.store = hold.store
        else:
            self.store = NotifyStore(args.policy, uniform=random.Random().uniform)
            if hold is not None:
                hold.store = self.store
        self.replays_armed = 0
        # The replay lane's hooks (actors/upstream/replay.py), set by the `upstream` actor.
        self.replay_active: Callable[[], bool] = lambda: False
        self.arm_replay: Callable[[float], None] = lambda _now: None
        # The owner-recovery lane's hook (actors/upstream/recovery.py), set by the actor.
        self.on_settled: Callable[[Settled], None] = lambda _settled: None
        self._limiter = WarnLimiter()
        # token -> the send in flight, until its result or its probe deadline
        self._out: dict[int, _Out] = {}
        self._due_timer: asyncio.TimerHandle | None = None
        self._due_at = 0.0
        self._draining = False
        self._again = False
        self._flush: _Flush | None = None
        self._last_flush = FlushDone(0, 0)
        # Every slot held is the `notify` lane's saturation (the slow-server sampler, CB-17).
        self._saturation = LaneFlag(SlowLane.NOTIFY, host.table.insert)
        metrics.watch(lambda: self.store.gauges(host.now()))
        if adopted:
            now = host.now()
            self._carry_out(self.store.adopt(now), now)

    def detach(self) -> None:
        """The actor is ending: the gauges describe a running actor's store only. After a
        planned-stop flush, a send still out never gets its result: it is counted as a failed
        send of the stop (lost{shutdown}), so a frozen server's notices are all counted. Any
        other send out is left to the next actor's `adopt`."""
        if self.store.mode is Mode.STOPPED:
            now = self.host.now()
            for token in list(self.store.in_flight()):
                self._carry_out(self.store.sent_failed(token, now), now)
        self.metrics.watch(None)

    # -- messages ------------------------------------------------------------------------------

    def on_notify(self, msg: Notify) -> None:
        self.offer(
            Notification(msg.agent_id, msg.session_id, msg.stream_home_id, msg.event, msg.peer_addr)
        )

    def offer(self, note: Notification) -> None:
        """Hold `note` and drain: an owner's `Notify`, or a replay's CONNECTED (the replay lane
        offers its notification directly, with no message in between)."""
        now = self.host.now()
        store = self.store
        self._carry_out(store.offer(note, now), now)
        # With every slot taken the drain would start nothing (its due resends and expiries
        # wait for the next result's drain, which comes first): a mass offer skips it.
        if store.mode is not Mode.RUNNING or store.slots_free:
            self._pump()

    def on_raise_cap(self, msg: RaiseNotifyCap) -> None:
        self.store.set_cap(self.store.cap + msg.extra)
        self.store.widen_for_stop()
        self._pump()

    def cancel_resends(self, agent_id: str, session_id: str) -> None:
        """End every resend of one session (an owner recovering it)."""
        now = self.host.now()
        self._carry_out(self.store.cancel_resends(agent_id, session_id), now)

    def on_timer(self, timer: NotifyTimer) -> None:
        if timer.kind == "due":
            self._due_timer = None
            self._pump()
        elif timer.kind == "probe":
            self._probe_deadline(timer.token)
        elif self._flush is not None:
            self._flush.timer = None
            self._finish_flush()

    def on_flush(self, msg: FlushNotifications, sender: Address) -> None:
        if self.store.mode is Mode.STOPPED:
            self.host.send(sender, self._last_flush)
            return
        now = self.host.now()
        if self._flush is None:
            budget = max(0.0, msg.budget_s)
            timer = self.host.wakeupAfter(budget, NotifyTimer("flush"))
            self._flush = _Flush([sender], now + budget, timer)
            if self._due_timer is not None:
                # The flush sends waiting resends whatever their backoff: no due timer needed.
                self.host.cancel_wakeup(self._due_timer)
                self._due_timer = None
            self._carry_out(self.store.begin_flush(now), now)
        else:
            self._flush.waiters.append(sender)
        self._pump()

    def on_done(self, done: WorkerDone) -> None:
        token: int = done.tag.token
        out = self._out.pop(token, None)
        if out is None:
            return  # already ended by the probe deadline
        if out.timer is not None:
            self.host.cancel_wakeup(out.timer)
        note = out.note
        now = self.host.now()
        result = result_of(done)
        if result is None:
            name = type(done.error).__name__
            result = CallResult(ResultKind.EXCEPTION, detail=name)
            effects = self.store.crashed(token, now)
            self._failed(note, f"worker crashed ({name})", "not retried")
        elif result.kind is ResultKind.OK:
            if getattr(result.response, "acknowledged", False):
                effects = self.store.sent_ok(token, now)
            else:
                result = CallResult(ResultKind.UNACKNOWLEDGED)
                effects = self.store.unacknowledged(token, now)
        elif result.kind is ResultKind.ENCODE or (
            result.kind is ResultKind.STATUS and result.status in REQUEST_FAULT_STATUSES
        ):
            why = class_and_why(result.kind, result.detail or result.status)
            effects = self.store.rejected(
                token, now, encode_error=why if result.kind is ResultKind.ENCODE else None
            )
            self._failed(note, why, "not retried")
        else:
            effects = self.store.sent_failed(token, now)
            then = "held again" if self.store.mode is Mode.RUNNING else "not retried (stopping)"
            self._failed(note, _why(result), then)
        self._carry_out(effects, now)
        self.host.record(out.ticket, Lane.NOTIFY, NOTIFY_STREAM_STATUS, result)
        self._pump()

    # -- the drain -----------------------------------------------------------------------------

    def drain(self) -> None:
        """Start what may start now. Re-entrant calls (a breaker transition performed while a
        drain runs) run one more round instead of nesting. Ends with the lane's saturation
        published: a result that frees a slot the drain takes again changes nothing there."""
        if self.store.mode is not Mode.RUNNING:
            self._pump()
            return
        if self._draining:
            self._again = True
            return
        self._draining = True
        try:
            while True:
                self._again = False
                now = self.host.now()
                breaker = self.host.breaker
                self.host.perform(breaker.poll(now))
                effects = self.store.drain(
                    now,
                    breaker.state,
                    breaker.epoch,
                    replay_active=self.replay_active(),
                    holds_session=self._holds_session,
                )
                self._carry_out(effects, now)
                if not self._again:
                    break
        finally:
            self._draining = False
        self._arm_due(self.host.now())
        self._publish_saturation()

    def _pump(self) -> None:
        mode = self.store.mode
        if mode is Mode.RUNNING:
            self.drain()
            return
        if mode is Mode.FLUSHING:
            now = self.host.now()
            self._carry_out(self.store.flush(now), now)
            if self.store.flush_done:
                self._finish_flush()
        self._publish_saturation()

    def _publish_saturation(self) -> None:
        # After every drain, flush and result: the sends out only change there.
        self._saturation.update(not self.store.slots_free)

    def _holds_session(self, note: Notification) -> bool:
        table = self.host.runtime.table(OWNERS_TABLE)
        if table is None:
            return False
        try:
            row = table.get(note.session_id)
        except TableGone:
            return False
        if row is None or getattr(row, "agent_id", note.agent_id) != note.agent_id:
            return False
        return getattr(row, "state", None) in HELD_STATES

    def _arm_due(self, now: float) -> None:
        deadline = self.store.next_deadline()
        # A deadline already past means entries are due but cannot go now (the breaker is not
        # closed, or the slots are taken): a result or a breaker transition drains again, and a
        # timer for the past would only spin.
        if deadline is None or deadline <= now:
            return
        if self._due_timer is not None:
            if self._due_at <= deadline:
                return
            self.host.cancel_wakeup(self._due_timer)
        self._due_at = deadline
        self._due_timer = self.host.wakeupAfter(deadline - now, NotifyTimer("due"))

    # -- effects ---------------------------------------------------------------------------------

    def _carry_out(self, effects: Iterable[NotifyEffect], now: float) -> None:
        for effect in effects:
            match effect:
                case Send():
                    self._start(effect, now)
                case ArmFullReplay():
                    self._replay_armed(now)
                case Settled():
                    self.on_settled(effect)  # an owner recovering its session waits for it
                case _:
                    carry_out(effect, log, self.metrics)

    def _start(self, send: Send, now: float) -> None:
        breaker = self.host.breaker
        timeout = self.rpc_timeout_s
        if self.store.mode is Mode.RUNNING:
            admission = breaker.admit_notification(now)
            self.host.perform(list(admission.effects))
            if not admission.allowed or admission.ticket is None:
                # The store and the breaker disagree about the probe slot (a defect): hold the
                # notification again rather than send past the breaker or lose it.
                log.debug("Stream status send held again: %s", admission.refusal)
                self._carry_out(self.store.sent_failed(send.token, now), now)
                return
            ticket = admission.ticket
            if send.probe:
                timeout = self.store.policy.probe_timeout_s
        else:
            # The planned-stop flush sends whatever the breaker; its results still feed it.
            ticket = Ticket(breaker.epoch, probe=False)
            if self._flush is not None:
                timeout = max(0.001, min(timeout, self._flush.deadline - now))
        token = send.token
        out = self._out[token] = _Out(ticket, send.note)
        call = (
            self.host,
            NotifyWork(token),
            NOTIFY_STREAM_STATUS,
            functools.partial(self._request, send.note),
            gateway_pb2.StreamStatusAck,
        )
        if send.deadline is None:
            start_call(*call, timeout=timeout)
            return
        # The probe: killed at its deadline, so its call is a task this lane can cancel.
        out.task = start_killable_call(*call, timeout=timeout)
        delay = max(0.0, send.deadline - now)
        out.timer = self.host.wakeupAfter(delay, NotifyTimer("probe", token))

    def _request(self, note: Notification) -> gateway_pb2.StreamStatusNotification:
        return gateway_pb2.StreamStatusNotification(
            agent_id=note.agent_id,
            session_id=note.session_id,
            event=_EVENTS[note.event],
            peer_addr=note.peer_addr,
            gateway_node=self.gateway_node,
            wire_capabilities=WIRE_CAPABILITIES,
            cluster_id=self.cluster_id,
            stream_home_id=note.stream_home_id,
        )

    def _probe_deadline(self, token: int) -> None:
        out = self._out.pop(token, None)
        if out is None:
            return  # its result came first
        if out.task is not None:
            out.task.cancel()  # "killed": no WorkerDone follows
        now = self.host.now()
        self._carry_out(self.store.probe_timed_out(token, now), now)
        killed = CallResult(ResultKind.PROBE_KILLED, detail="notify_probe_timeout_ms")
        self.host.record(out.ticket, Lane.NOTIFY, NOTIFY_STREAM_STATUS, killed)
        self._pump()

    def _finish_flush(self) -> None:
        flush, self._flush = self._flush, None
        if flush is None:
            return
        if flush.timer is not None:
            self.host.cancel_wakeup(flush.timer)
        now = self.host.now()
        report = self.store.finish_flush(now)
        self._carry_out(report.effects, now)
        self._last_flush = FlushDone(report.sent, report.left)
        for waiter in flush.waiters:
            self.host.send(waiter, self._last_flush)

    # -- lines -----------------------------------------------------------------------------------

    def _failed(self, note: Notification, why: str, then: str) -> None:
        text = FAILED_LINE.format(
            event=note.event.name, agent=log_text(note.agent_id), why=why, then=then
        )
        log.warning("%s", text)

    def _replay_armed(self, now: float) -> None:
        self.replays_armed += 1
        self.arm_replay(now)
        suffix = self._limiter.admit("replay_armed", now)
        if suffix is not None:
            log.info("%s%s", REPLAY_ARMED_LINE, suffix)

    # -- status ----------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Counts only: held notifications carry agent and session ids."""
        store = self.store
        return {
            "notify_mode": store.mode.value,
            "notify_pending": store.pending,
            "notify_inflight": store.inflight,
            "notify_probe_held": store.probe_out,
            "notify_unacked_keys": store.gauges(self.host.now()).unacked_keys,
            "notify_pending_max": store.cap,
            "notify_sent": store.sent,
            "notify_resent": store.resent,
            "notify_replays_armed": self.replays_armed,
        }


def _why(result: CallResult) -> str:
    if result.kind is ResultKind.STATUS:
        try:
            return Status(result.status).name if result.status is not None else "UNKNOWN"
        except ValueError:
            return f"status {result.status}"
    return f"{result.kind.value} {result.detail}".rstrip()
