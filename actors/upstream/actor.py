"""`upstream`: the actor that owns the circuit breaker every upstream lane shares.

The Erlang gateway's yuzu_gw_upstream. This module is the router: it owns the breaker shell and
hands every other message to the lane that owns it.

- The breaker (this module): the `Breaker` core (actors/core/breaker.py) fed with the outcome
  of every upstream call. Request processes do their RPCs themselves (gateway/upstream/calls.py)
  and `tell` their `Outcome`; the lanes below hand theirs to `record`, so the RPC error metric,
  the failure lines and the breaker see every lane the same way. The heartbeat buffer, which
  never feeds the breaker, tells its failed BatchHeartbeats as `CallFailed`: counted and logged
  the same way, the breaker untouched. A timer at the end of each open period moves the breaker
  to half open on time; the effects are the transition lines (never rate limited), the state
  published in the protected table `upstream_state` (key `breaker`, read by callers, `/readyz`
  and metrics without a message) and the breaker metrics.
- Stream-status notifications (actors/upstream/notify.py): `Notify` posted by the agent owners
  into the notification hold (taken on `NotificationsPosted` and at the start), the
  held store's workers and timers, the half-open probe (a transition to closed and the breaker's
  ProbeReady start a drain), and the planned-stop flush (`FlushNotifications`, `RaiseNotifyCap`).
- Guardian forwards (actors/upstream/guardian.py): `ForwardGuardian` from the agent owners.
- Owner recovery (actors/upstream/recovery.py): a restarted owner's `SettleDisconnected` and
  `PresentSession`, its workers, and the store's `Settled` effects.
- The registration replay (actors/upstream/replay.py): `HeartbeatVerdict` from the heartbeat
  buffer, a lost CONNECTED from the notification lane, its workers and timer; a breaker
  transition lets a paused replay go on (a recovery starts none).

The actor never waits on the server: every RPC runs as a worker and comes back as a `WorkerDone`
routed by its tag. It starts with `UpstreamArgs` (the breaker's and the lanes' policies, built
from the Config by gateway/node/children/upstream.py), registered as `UPSTREAM_NAME`
(actors/upstream/api.py).

Results are matched to the breaker period they were admitted in by the `epoch` of the view the
caller read; `incarnation` tells this actor's periods from a previous (crashed) one's, whose
late results must not count here.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from grpclib.const import Status
from prometheus_client import CollectorRegistry
from thespian.actors import WakeupMessage

from actors.core.breaker import (
    REQUEST_FAULT_STATUSES,
    Breaker,
    BreakerPolicy,
    Effect,
    Lane,
    ProbeReady,
    PublishState,
    ResultKind,
    State,
    Ticket,
    Transition,
    Verdict,
    classify,
)
from actors.core.verdicts import HeartbeatVerdict
from actors.core.warn_limit import WarnLimiter
from actors.effects import log_line
from actors.node.api import StopAdmitting
from actors.upstream.api import (
    UPSTREAM_NAME,
    CallFailed,
    ForwardGuardian,
    NotificationsPosted,
    Notify,
    PresentSession,
    SettleDisconnected,
    notify_hold,
)
from actors.upstream.guardian import GuardianLane, GuardianWork
from actors.upstream.lane import CallResult, class_and_why
from actors.upstream.metrics import UpstreamMetrics, rpc_name, upstream_metrics
from actors.upstream.notify import (
    FlushDone,
    FlushNotifications,
    NotifyArgs,
    NotifyLane,
    NotifyTimer,
    NotifyWork,
    RaiseNotifyCap,
)
from actors.upstream.recovery import PresentWork, RecoveryLane
from actors.upstream.replay import ReplayArgs, ReplayLane, ReplayTimer, ReplayWork
from actors.upstream.replay_metrics import replay_metrics
from supervisors.address import Address
from supervisors.messages import WorkerDone
from supervisors.process import Process
from supervisors.reason import ExitReason

if TYPE_CHECKING:
    from supervisors.runtime import LoopSystemBase

__all__ = [
    "BREAKER_KEY",
    "STATE_TABLE",
    "BreakerView",
    "FlushDone",
    "FlushNotifications",
    "GetBreaker",
    "Outcome",
    "RaiseNotifyCap",
    "Upstream",
    "UpstreamArgs",
    "breaker_view",
    "readiness_checks",
]

log = logging.getLogger("yuzu_gw.upstream")

STATE_TABLE = "upstream_state"
BREAKER_KEY = "breaker"
_POLL = "breaker_poll"
# The channel's detail for a stream the server reset (REFUSED_STREAM, ...): gateway/upstream/
# failures.py writes "stream_error (<code>)".
STREAM_ERROR = "stream_error"

# One per actor instance in this process: a restarted actor starts its epochs at 0 again, so the
# epoch alone cannot tell its periods from its predecessor's.
_incarnations = itertools.count(1)


# --- arguments, messages and the published view --------------------------------------------------


@attrs.frozen
class UpstreamArgs:
    """What the actor and its lanes read. `rpc_timeout_s` (upstream_rpc_timeout_ms) bounds every
    notification but the probe and every Guardian forward; `registry` holds the metric families
    (actors/upstream/metrics.py, actors/upstream/replay_metrics.py)."""

    breaker: BreakerPolicy
    notify: NotifyArgs
    replay: ReplayArgs
    rpc_timeout_s: float
    registry: CollectorRegistry


@attrs.frozen
class BreakerView:
    """What the actor publishes at every transition (table `upstream_state`, key `breaker`)."""

    state: State
    epoch: int
    reset_s: float
    incarnation: int

    @property
    def is_open(self) -> bool:
        return self.state is State.OPEN


@attrs.frozen
class Outcome:
    """How one upstream call ended (tell). `incarnation` and `epoch` are those of the view the
    caller read when it was admitted. `detail` is safe to log (UpstreamCallError.detail)."""

    incarnation: int
    epoch: int
    lane: Lane
    method: str
    kind: ResultKind
    status: int | None = None
    detail: str = ""


@attrs.frozen
class GetBreaker:
    """Ask: answered with the current `BreakerView` (tests and the console)."""


# --- reading the published state (no message) -----------------------------------------------------


def breaker_view(runtime: LoopSystemBase) -> BreakerView | None:
    """The state the upstream actor published, or None while it is not running."""
    table = runtime.table(STATE_TABLE)
    if table is None:
        return None
    view = table.get(BREAKER_KEY)
    return view if isinstance(view, BreakerView) else None


def readiness_checks(runtime: LoopSystemBase) -> dict[str, Callable[[], bool]]:
    """`upstream` (the actor is alive; it says nothing about the server, seed HL-05) and
    `circuit_breaker` (the published state is not open, read from the table, HL-04). While the
    actor is down there is no state: `circuit_breaker` then passes and `upstream` fails."""

    def upstream_alive() -> bool:
        return runtime.whereis(UPSTREAM_NAME) is not None

    def breaker_not_open() -> bool:
        view = breaker_view(runtime)
        return view is None or not view.is_open

    return {UPSTREAM_NAME: upstream_alive, "circuit_breaker": breaker_not_open}


# --- the actor -----------------------------------------------------------------------------------


def _status_name(status: int | None) -> str:
    try:
        return Status(status).name if status is not None else "UNKNOWN"
    except ValueError:
        return str(status)


def error_code(kind: ResultKind, status: int | None, detail: str = "") -> str:
    """The `code` label of yuzu_gw_upstream_rpc_errors_total: the gRPC status name in lower
    case (`unavailable`), `stream_error` for a stream the server reset (the seed's name for it),
    or the local kind (`timeout`, `transport`, `encode`, `exception`, `too_many_streams`, ...)."""
    if kind is ResultKind.STATUS:
        return _status_name(status).lower()
    if kind is ResultKind.TRANSPORT and detail.startswith(STREAM_ERROR):
        return STREAM_ERROR
    return kind.value


class Upstream(Process):
    def init(self, args: UpstreamArgs) -> None:
        policy = args.breaker
        # Callers admit themselves by reading the published state (no message per call), which
        # is only right when a half-open breaker admits call-path RPCs (the seed's observed
        # behaviour, the policy's default).
        assert policy.half_open_admits_calls
        self.breaker = Breaker(policy)
        self.incarnation = next(_incarnations)
        self.metrics: UpstreamMetrics = upstream_metrics(args.registry)
        self.table = self.new_table(STATE_TABLE)
        self.limiter = WarnLimiter()
        self._poll_timer: Any = None
        # The lanes before the first effects: a transition drains the notification lane.
        self.hold = notify_hold(self.runtime)
        self.notify = NotifyLane(
            self, args.notify, args.rpc_timeout_s, self.metrics.notify, self.hold
        )
        self.guardian = GuardianLane(self, args.rpc_timeout_s, self.metrics.guardian)
        self.replay = ReplayLane(self, args.replay, replay_metrics(args.registry), self.notify)
        self.notify.replay_active = lambda: self.replay.active
        self.notify.arm_replay = self.replay.arm_notify_loss
        self.recovery = RecoveryLane(self, self.notify, self.replay.calls)
        # A planned stop (StopAdmitting): no replay starts and no recovered session is presented.
        self.stopping = False
        self.notify.on_settled = self.recovery.on_settled
        self.perform([self.breaker.published()])
        # What the owners posted while no actor ran, then what a predecessor held.
        self._take_posts()
        self.notify.drain()

    def terminate(self, reason: ExitReason) -> None:
        # The store stays in the notification hold for the next actor; the gauges must not
        # report it while none runs.
        self.notify.detach()
        self.guardian.detach()
        self.replay.detach()

    # -- messages --

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        match msg:
            case Outcome():
                self._on_outcome(msg)
            case CallFailed(method=method, kind=kind, status=status, detail=detail):
                self._count_and_log(kind, method, status, detail)
            case NotificationsPosted():
                self._take_posts()
            case Notify():
                self.notify.on_notify(msg)
            case ForwardGuardian():
                self.guardian.on_forward(msg)
            case WorkerDone(tag=NotifyWork()):
                self.notify.on_done(msg)
            case WorkerDone(tag=GuardianWork()):
                self.guardian.on_done(msg)
            case HeartbeatVerdict() if not self.stopping:
                self.replay.on_verdict(msg)
            case WorkerDone(tag=ReplayWork()):
                self.replay.on_done(msg)
            case WakeupMessage(payload=ReplayTimer()) if not self.stopping:
                self.replay.on_timer()
            case WakeupMessage(payload=NotifyTimer() as timer):
                self.notify.on_timer(timer)
            case WakeupMessage(payload=payload) if payload == _POLL:
                self._poll_timer = None
                self.perform(self.breaker.poll(self.now()))
                self._arm_poll()  # a wakeup a little early moves nothing: poll again later
            case FlushNotifications():
                self.notify.on_flush(msg, sender)
            case RaiseNotifyCap():
                self.notify.on_raise_cap(msg)
            case GetBreaker():
                self.send(sender, self._view())
            case StopAdmitting():
                self.stopping = self.recovery.stopping = True
            case SettleDisconnected():
                self.recovery.on_settle(msg, sender)
            case PresentSession():
                self.recovery.on_present(msg, sender)
            case WorkerDone(tag=PresentWork()):
                self.recovery.on_done(msg)
            case _:
                pass

    def format_status(self) -> Mapping[str, Any]:
        # Counts and states only: the lanes hold agent and session ids, which must never show.
        breaker = self.breaker
        return {
            "breaker": breaker.state.value,
            "consecutive_failures": breaker.failures,
            "reset_ms": round(breaker.reset_s * 1000),
            "epoch": breaker.epoch,
            "probe_out": breaker.probe_out,
            **self.notify.status(),
            **self.guardian.status(),
            **self.replay.status(),
            **self.recovery.status(),
        }

    def _take_posts(self) -> None:
        """The owners' posts in the notification hold, in the order posted."""
        if self.hold is None:
            return
        for msg, sender in self.hold.take():
            if isinstance(msg, Notify):
                self.notify.on_notify(msg)
            else:
                self.recovery.on_settle(msg, sender)

    # -- the breaker shell --

    def _on_outcome(self, outcome: Outcome) -> None:
        if outcome.incarnation != self.incarnation or outcome.epoch > self.breaker.epoch:
            # Admitted under a previous actor: its periods are over. Still an RPC error.
            self._count_and_log(outcome.kind, outcome.method, outcome.status, outcome.detail)
            return
        result = CallResult(outcome.kind, outcome.status, outcome.detail)
        self.record(Ticket(outcome.epoch, probe=False), outcome.lane, outcome.method, result)

    def record(self, ticket: Ticket, lane: Lane, method: str, result: CallResult) -> None:
        """One upstream call's result, whichever lane made it: the RPC error metric and line,
        then the breaker, in the period `ticket` was admitted in."""
        now = self.now()
        kind, status, detail = result.kind, result.status, result.detail
        self._count_and_log(kind, method, status, detail, now)
        verdict = classify(kind, lane, status)
        reason = ""
        if verdict is Verdict.FAILURE:
            # For the reopen line: the status name, or the channel's word for a local failure
            # (econnrefused, closed, unknown_ca, ...), as the Erlang gateway printed it.
            reason = error_code(kind, status, detail)
            if kind is not ResultKind.STATUS and detail:
                reason = detail
        self.perform(self.breaker.record(ticket, verdict, now, reason))

    def perform(self, effects: list[Effect]) -> None:
        """Carry out breaker effects. A transition to closed, or a free probe slot, starts a
        notification drain: held notifications wait for exactly these moments. No effects:
        nothing moved (the breaker's deadline moves only with a transition), nothing to do; most
        results and admissions are that."""
        if not effects:
            return
        drain = moved = False
        for effect in effects:
            match effect:
                case Transition(previous=previous, current=current, line=line):
                    log_line(log, line)
                    self.metrics.breaker_transitions.labels(previous.value, current.value).inc()
                    drain = drain or current is State.CLOSED
                    moved = True
                case PublishState(state=state):
                    self.table.insert(BREAKER_KEY, self._view())
                    self.metrics.set_breaker_state(state)
                case ProbeReady():
                    drain = True
        self._arm_poll()
        if drain:
            self.notify.drain()
        if moved:
            self.replay.pump()  # a replay paused by an open breaker goes on

    def _view(self) -> BreakerView:
        b = self.breaker
        return BreakerView(b.state, b.epoch, b.reset_s, self.incarnation)

    def _arm_poll(self) -> None:
        deadline = self.breaker.next_deadline()
        if deadline is None or self._poll_timer is not None:
            return
        self._poll_timer = self.wakeupAfter(max(0.0, deadline - self.now()), _POLL)

    # -- errors: metric and log line --

    def _count_and_log(
        self,
        kind: ResultKind,
        method_path: str,
        status: int | None,
        detail_text: str,
        now: float | None = None,
    ) -> None:
        if kind in (ResultKind.OK, ResultKind.UNACKNOWLEDGED):
            return
        now = self.now() if now is None else now
        code = error_code(kind, status, detail_text)
        self.metrics.rpc_errors.labels(code, rpc_name(method_path)).inc()
        method = method_path.rsplit("/", 1)[-1]
        detail = f" {detail_text}" if detail_text else ""
        if kind is ResultKind.TOO_MANY_STREAMS:
            # The gateway's own HTTP/2 client refused it; the call re-asks for a permit.
            log.debug("Upstream RPC %s refused locally: too_many_streams", method)
        elif kind is ResultKind.STATUS:
            line = f"Upstream RPC {method} failed: {_status_name(status)}{detail}"
            # Seed: limited for the five request-fault statuses only; any other status is not.
            limited = status in REQUEST_FAULT_STATUSES
            self._warn(line, ("failed", method, status) if limited else None, now)
        elif kind in (ResultKind.ENCODE, ResultKind.EXCEPTION):
            line = f"Upstream RPC {method} raised {class_and_why(kind, detail_text or '-')}"
            self._warn(line, ("raised", method), now)
        else:
            # Transport, timeout, TLS, HTTP: a dead server fails every call at once, so one line
            # a second per method and code, with the suppressed count, as the raised line.
            self._warn(
                f"Upstream RPC {method} failed: {code}{detail}", ("failed", method, code), now
            )

    def _warn(self, line: str, kind: object, now: float) -> None:
        if kind is None:
            log.warning("%s", line)
            return
        suffix = self.limiter.admit(kind, now)
        if suffix is not None:
            log.warning("%s%s", line, suffix)
