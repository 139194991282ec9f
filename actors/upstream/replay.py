"""The registration replay lane of the `upstream` actor: the shell around the replay core.

The rules (which session is replayed when, the full replay's triggers, spacing and walk) live in
the pure core actors/core/replay_queue.py; the operator's view is docs/registration-replay.md.
This shell turns the actor's messages into calls on the core and carries out what it returns:

* `HeartbeatVerdict` (cast by the heartbeat buffer, actors/core/verdicts.py) -> `offer`, with the
  breaker's state, the number of agents the registry holds and whether this node holds a session
  (its owner-table row is `live` and carries the stored RegisterRequest).
* A lost CONNECTED (the notification lane's `ArmFullReplay`) -> `arm_notify_loss`; the core
  starts it once the breaker is closed and the notification store has drained below half.
* Launching: while the breaker is not open, each session `launch` returns is replayed by a
  worker: `Calls.call(Caller.REPLAY, ProxyRegister, <the stored request>)` (actors/upstream/
  api.py; the call path of gateway/upstream/calls.py, which `ReplayArgs.calls` builds) with the
  session id in the `x-yuzu-session-id` metadata (WIRE.md), so the server adopts that session.
  The call path takes a `replay` permit (at most 24 at once, behind live registrations), the
  breaker's admission, upstream_rpc_timeout_ms, and tells this actor the outcome (`Lane.REPLAY`:
  FAILED_PRECONDITION counts as a success there). The lane keeps no more replays in flight than
  the replay permits allow.
* Answers. accepted: CONNECTED is announced again with the owner's stream home id, through the
  notification lane, if the owner still holds the session. accepted=false: that owner is told
  `EndSession` (it sends its DISCONNECTED once and closes the stream; the agent registers
  again) and the session is not announced; the line carries the server's reason cut to 128
  bytes and no session id. FAILED_PRECONDITION: superseded, logged, the owner ended the same
  way. A stored request that cannot be encoded is skipped with a WARN. Refused before it was
  sent (no permit, the circuit open): the session is first again, and launching waits a second
  (or for the breaker). Any other failure: that replay is over; later verdicts name the session
  again.
* The walk of a full replay reads the registry's `agents` table (absent: the registry is
  unavailable, and the replay is aborted).
* Timers: the core's `next_deadline` (a start jitter, an armed replay's spacing), a retry
  second while an armed replay waits for the breaker or the store, or after a refusal.

Metrics (actors/upstream/replay_metrics.py): `yuzu_gw_registration_replay_total` per attempt, the
core's `Count`s, the queue depth read at scrape time; the core's `Count`s and `LogLine`s are
carried out by actors/effects.py. `status` shows counts only.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import attrs
from grpclib.const import Status

from actors.core import Count
from actors.core.breaker import ResultKind, State
from actors.core.notify_store import Event, Notification, log_text
from actors.core.permits import Caller
from actors.core.replay_queue import REPLAYS, ReplayEffect, ReplayPolicy, ReplayQueue
from actors.core.verdicts import HeartbeatVerdict
from actors.effects import carry_out
from actors.registry.api import AGENTS_TABLE
from actors.upstream.api import (
    PROXY_REGISTER,
    SESSION_ID_METADATA,
    Calls,
    EndSession,
    StoredSession,
    UpstreamCallError,
    UpstreamRefused,
    stored_session,
)
from actors.upstream.lane import LaneHost
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.errors import TableGone
from supervisors.messages import WorkerDone

if TYPE_CHECKING:
    from actors.upstream.notify import NotifyLane
    from actors.upstream.replay_metrics import ReplayMetrics
    from supervisors.address import Address
    from supervisors.runtime import LoopSystemBase
    from supervisors.table import Table

__all__ = [
    "ENCODE_LINE",
    "NOT_ACCEPTED_DETAILS",
    "NOT_ACCEPTED_LINE",
    "RETRY_S",
    "SUPERSEDED_DETAILS",
    "SUPERSEDED_LINE",
    "ReplayArgs",
    "ReplayLane",
    "ReplayTimer",
    "ReplayWork",
]

log = logging.getLogger("yuzu_gw.upstream")

# How long launching waits after a replay was refused before it was sent (no permit in time, the
# regulator restarting), and how often an armed replay looks again at the breaker and the store:
# a second is short against a replay of thousands and long against a spin.
RETRY_S: Final = 1.0
_FAILED_PRECONDITION: Final = int(Status.FAILED_PRECONDITION.value)

# L27, quoted; the reason is the server's text, cut to 128 bytes.
NOT_ACCEPTED_LINE: Final = (
    "Registration replay: {agent} was not accepted by the server ({reason}); disconnecting so"
    " the agent follows its own registration path"
)
# L28, quoted.
SUPERSEDED_LINE: Final = "Registration replay: {agent}'s presented session was superseded"
# RP-16: the seed says "skipped with a WARN"; the words are this rebuild's.
ENCODE_LINE: Final = (
    "Registration replay: {agent}'s stored registration cannot be encoded ({why}); skipped"
)
# L23 ends "(adopted session ...)": the session id stays out of the log here.
REPROXIED_LINE: Final = "Registration replay: re-proxied {agent}"
FAILED_LINE: Final = "Registration replay: {agent} failed ({why}); a later verdict names it again"
# What the agent's stream ends with (UNAVAILABLE): it registers again.
NOT_ACCEPTED_DETAILS: Final = "session not accepted by the server; register again"
SUPERSEDED_DETAILS: Final = "session superseded; register again"


@attrs.frozen
class ReplayArgs:
    """What the lane reads: the core's policy, and how to build the call path its replays take
    on the actor's runtime (`calls(runtime)`; the owner-recovery lane presents sessions on it
    too)."""

    policy: ReplayPolicy
    calls: Callable[[LoopSystemBase], Calls]


@attrs.frozen
class ReplayWork:
    """The tag of a replay worker's `WorkerDone`."""

    token: int


@attrs.frozen
class ReplayTimer:
    """The payload of the lane's wakeups."""


@attrs.frozen(repr=False)
class _Out:
    """A replay in flight: what its answer needs."""

    session_id: str
    agent_id: str
    owner: Address
    stream_home_id: str


def _stored_request(row: StoredSession) -> agent_pb2.RegisterRequest | None:
    request = row.register
    return request if isinstance(request, agent_pb2.RegisterRequest) else None


async def _replay(calls: Calls, request: Any, session_id: str) -> agent_pb2.RegisterResponse:
    return await calls.call(
        Caller.REPLAY,
        PROXY_REGISTER,
        request,
        agent_pb2.RegisterResponse,
        grpc_timeout_s=None,
        metadata={SESSION_ID_METADATA: session_id},
    )


class ReplayLane:
    """The replay core and the workers, timer and metrics around it. Owned by the `upstream`
    actor; everything here runs inside its `receiveMessage`."""

    def __init__(
        self,
        host: LaneHost,
        args: ReplayArgs,
        metrics: ReplayMetrics,
        notify: NotifyLane,
    ) -> None:
        self.host = host
        self.metrics = metrics
        self.core = ReplayQueue(args.policy, uniform=random.Random().uniform)
        self.calls = args.calls(host.runtime)
        # Adopted sessions are announced again through it; an armed replay waits for its store.
        self.notify = notify
        self._out: dict[int, _Out] = {}
        self._token = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._resume_at = 0.0  # no launching before this (after a refusal)
        self._pumping = False
        self.attempts = 0
        self.adopted = 0
        self.refused = 0
        self.superseded = 0
        self.failed = 0
        core = self.core
        metrics.watch(lambda: core.depth)

    def detach(self) -> None:
        """The actor is ending: the queue dies with it; the gauge reads 0 until a new one."""
        self.metrics.watch(None)

    @property
    def active(self) -> bool:
        return self.core.active

    # -- messages ------------------------------------------------------------------------------

    def on_verdict(self, verdict: HeartbeatVerdict) -> None:
        now = self.host.now()
        agents = self._agents()
        effects = self.core.offer(
            verdict,
            now,
            breaker_open=self.host.breaker.state is State.OPEN,
            held=0 if agents is None else len(agents),
            is_held=self._is_held,
        )
        self._carry_out(effects)
        self.pump()

    def arm_notify_loss(self, _now: float) -> None:
        self.core.arm_notify_loss()
        self.pump()

    def on_timer(self) -> None:
        self._timer = None
        self.pump()

    def on_done(self, done: WorkerDone) -> None:
        out = self._out.pop(done.tag.token, None)
        if out is None:
            return
        now = self.host.now()
        error = done.error
        if error is None:
            self._answered(out, done.result)
        elif isinstance(error, UpstreamCallError):
            self._failed(out, error)
        elif isinstance(error, UpstreamRefused):
            # Not sent: the server never saw it, so it keeps its place and no guard stamp.
            self.core.unsent(out.session_id)
            self._resume_at = now + RETRY_S
            log.debug("Registration replay of %s not sent: %s", log_text(out.agent_id), error)
        else:
            # A defect in the gateway: the class only (its text may hold the request).
            self.failed += 1
            text = FAILED_LINE.format(agent=log_text(out.agent_id), why=type(error).__name__)
            log.warning("%s", text)
        self._carry_out(self.core.finished(out.session_id, now))
        self.pump()

    # -- launching -----------------------------------------------------------------------------

    def pump(self) -> None:
        """Start what may start now; arm the timer for what waits. Re-entrant calls (a breaker
        transition performed while a pump runs) are absorbed: this one covers them."""
        if self._pumping:
            return
        self._pumping = True
        try:
            now = self.host.now()
            state = self.host.breaker.state
            store = self.notify.store
            self._carry_out(
                self.core.poll(
                    now,
                    breaker_closed=state is State.CLOSED,
                    notify_below_half=store.pending * 2 < store.cap,
                    held_sessions=self._held_sessions,
                )
            )
            if state is not State.OPEN and now >= self._resume_at:
                sessions, effects = self.core.launch(now, self._is_held)
                for session_id in sessions:
                    self._start(session_id, now)
                self._carry_out(effects)
            self._arm(now, state)
        finally:
            self._pumping = False

    def _start(self, session_id: str, now: float) -> None:
        row = self._row(session_id)
        request = None if row is None else _stored_request(row)
        if row is None or request is None:
            # `launch` asked a moment ago; only a defect gets here.
            self._carry_out(self.core.finished(session_id, now))
            return
        self._token += 1
        self._out[self._token] = _Out(session_id, row.agent_id, row.owner, row.stream_home_id)
        self.attempts += 1
        self.metrics.count(Count(REPLAYS))
        self.host.run_worker(_replay(self.calls, request, session_id), ReplayWork(self._token))

    def _arm(self, now: float, state: State) -> None:
        deadline = self.core.next_deadline()
        if self.core.armed and deadline is None and state is not State.OPEN:
            deadline = now + RETRY_S  # waiting for a closed breaker or a store below half
        if self._resume_at > now and self.core.depth:
            deadline = self._resume_at if deadline is None else min(deadline, self._resume_at)
        if deadline is None:
            return
        if self._timer is not None:
            if self._timer_at <= deadline:
                return
            self.host.cancel_wakeup(self._timer)
        self._timer_at = deadline
        self._timer = self.host.wakeupAfter(max(0.0, deadline - now), ReplayTimer())

    # -- answers -------------------------------------------------------------------------------

    def _answered(self, out: _Out, response: agent_pb2.RegisterResponse) -> None:
        if not response.accepted:
            self.refused += 1
            agent, reason = log_text(out.agent_id), log_text(response.reject_reason)
            log.warning("%s", NOT_ACCEPTED_LINE.format(agent=agent, reason=reason))
            self._end_session(out, NOT_ACCEPTED_DETAILS)
            return
        self.adopted += 1
        if log.isEnabledFor(logging.DEBUG):  # one per replay: thousands in a full replay
            log.debug("%s", REPROXIED_LINE.format(agent=log_text(out.agent_id)))
        row = self._row(out.session_id)
        if row is None or row.owner != out.owner or row.stream_home_id != out.stream_home_id:
            return  # the owner ended meanwhile: its DISCONNECTED is the last word
        self.notify.offer(
            Notification(
                out.agent_id, out.session_id, out.stream_home_id, Event.CONNECTED, self._peer(out)
            )
        )

    def _failed(self, out: _Out, error: UpstreamCallError) -> None:
        agent = log_text(out.agent_id)
        if error.kind is ResultKind.ENCODE:
            self.failed += 1
            log.warning("%s", ENCODE_LINE.format(agent=agent, why=error.detail or "encode"))
        elif error.kind is ResultKind.STATUS and error.status == _FAILED_PRECONDITION:
            self.superseded += 1
            log.warning("%s", SUPERSEDED_LINE.format(agent=agent))
            self._end_session(out, SUPERSEDED_DETAILS)
        else:
            self.failed += 1
            log.debug("%s", FAILED_LINE.format(agent=agent, why=error))

    def _end_session(self, out: _Out, details: str) -> None:
        row = self._row(out.session_id)
        if row is not None and row.owner == out.owner:
            self.host.send(out.owner, EndSession(out.session_id, details))

    # -- reading the node's tables -------------------------------------------------------------

    def _agents(self) -> Table[str, Any] | None:
        """The registry's `agents` table, None while the registry is down."""
        table = self.host.runtime.table(AGENTS_TABLE)
        if table is None or not table.alive:
            return None
        return table

    def _held_sessions(self) -> Iterable[str] | None:
        agents = self._agents()
        if agents is None:
            return None
        try:
            return list(agents.keys())
        except TableGone:
            return None

    def _row(self, session_id: str) -> StoredSession | None:
        row = stored_session(self.host.runtime, session_id)
        return row if row is not None and row.state == "live" else None

    def _is_held(self, session_id: str) -> bool:
        row = self._row(session_id)
        return row is not None and _stored_request(row) is not None

    def _peer(self, out: _Out) -> str:
        agents = self._agents()
        try:
            agent = None if agents is None else agents.get(out.session_id)
        except TableGone:
            agent = None
        return getattr(agent, "peer", "") if agent is not None else ""

    # -- effects ---------------------------------------------------------------------------------

    def _carry_out(self, effects: list[ReplayEffect]) -> None:
        for effect in effects:
            carry_out(effect, log, self.metrics)

    # -- status ----------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Counts only: the queue, the stamps and the workers hold session ids and requests."""
        return {
            **self.core.status(),
            "replay_attempts": self.attempts,
            "replay_adopted": self.adopted,
            "replay_not_accepted": self.refused,
            "replay_superseded": self.superseded,
            "replay_failed": self.failed,
        }
