"""`upstream_regulator` (`REGULATOR_NAME`, actors/upstream/api.py): the actor that hands out
upstream call permits.

The Erlang gateway's yuzu_gw_upstream_regulator. It owns the `PermitPool` core
(actors/core/permits.py) and publishes a `PermitGate` in its public table
`upstream_regulator_state`, through which request processes take and give back permits with a
plain call on the loop, not a message (ARCHITECTURE.md: a hot path must not cost a round trip
through a mailbox; in OTP terms, a public ETS table owned by the regulator, written by its
callers, gone with it):

- `acquire`: granted at once, refused at once (`queue_full`, `deadline`, `stopping`), or a
  future the caller awaits, answered when a permit frees or its deadline passes;
- `release`: the call is done, or it hands its permit back after too_many_streams;
- `cancel`: the caller went away (its coroutine was cancelled); its permit or its place in the
  queue is freed at once (seed: "its permit or its place in the queue is freed by its exit").

Every gate operation runs to completion on the loop's thread between two other steps, as a
message would inside `receiveMessage`, and carries out the core's effects the same way. The
actor's own messages: `ServerMaxStreams` (the upstream channel's total of
SETTINGS_MAX_CONCURRENT_STREAMS changed; the permits in force follow it, `limits_for`), its
timers, `GetPermits`, and the planned stop.

OTP's crash semantics hold for the gate: an exception out of the core in a gate operation ends
the regulator with that crash (its supervisor restarts it), as one in `receiveMessage` would. A
regulator that ends, however it ends, answers every waiter `unavailable` (the callers' `ask`
used to learn that from its monitor), and its gate then refuses everything: a caller still
holding a permit of it releases into a pool nobody uses, and a restarted regulator starts with
an empty pool of its own, so no permit is leaked into it.

It arms one timer at the earliest waiter deadline so a request whose deadline passes is refused
on time (and never sent), and it carries out the core's effects: the answers, the metrics
(held, waiting, wait time, refusals, dropped calls, limits) and the sizing log lines. Whether a
live request waits (the `permits` lane's saturation) is published in the same table, which the
slow-server sampler reads without a message.

It finds the channel in the `upstream_channels` table the channel actor publishes
(`upstream_channel`, actors/upstream/api.py), subscribes
to its settings changes, and looks at the table again every second: when the channel is gone
(its actor ended) the limit is unknown (0, so the configured sizes apply) until a new channel
is found. A channel that closes tells its listeners 0 itself, so that is usually immediate.

A planned stop (`StopAdmitting`, then `ActorExitRequest`) refuses every waiter with `stopping`,
so no caller waits out its deadline for an answer that cannot come, and after `StopAdmitting`
every new request too. Each of those refusals is counted
`yuzu_gw_upstream_permit_refused_total{reason="stopping"}`, like the core's own refusals.

It starts with `RegulatorArgs`: the permit policy the Config resolves to and the lines that
resolution logs (gateway/node/children/upstream.py), and the metric registry.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Hashable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import attrs
from prometheus_client import CollectorRegistry
from thespian.actors import ActorExitRequest, WakeupMessage

from actors.core import LogLine
from actors.core.permits import (
    Caller,
    Granted,
    LimitsChanged,
    PermitEffect,
    PermitPolicy,
    PermitPool,
    Pool,
    Queued,
    Refused,
)
from actors.core.slow_server import LaneFlag, SlowLane
from actors.effects import carry_out, log_line
from actors.node.api import StopAdmitting
from actors.upstream.api import REGULATOR_NAME, Channel, upstream_channel
from actors.upstream.metrics import REFUSAL_REASONS, UpstreamMetrics, upstream_metrics
from supervisors.address import Address
from supervisors.process import Process
from supervisors.reason import SHUTDOWN, ExitReason

if TYPE_CHECKING:
    from supervisors.runtime import LoopSystemBase

__all__ = [
    "GATE_KEY",
    "STATE_TABLE",
    "Answer",
    "GetPermits",
    "PermitGate",
    "PermitSnapshot",
    "RefusalReason",
    "Regulator",
    "RegulatorArgs",
    "ServerMaxStreams",
    "permit_gate",
]

log = logging.getLogger("yuzu_gw.upstream_regulator")
# The runtime's crash logger: a gate operation's crash is logged as one in receiveMessage is.
crash_log = logging.getLogger("supervisors.crash")

STATE_TABLE = "upstream_regulator_state"
GATE_KEY = "gate"
# How often to look at the published channel (none yet, a channel restart, a test node with
# allow_no_upstream): a table read, so cheap; one second bounds how long the permits run on
# stale sizes after a channel actor was replaced without telling anyone (a brutal kill).
ATTACH_RETRY_S = 1.0
_EXPIRE = "expire"
_ATTACH = "attach"

RefusalReason = Literal["queue_full", "deadline", "stopping", "unavailable"]
STOPPING: RefusalReason = "stopping"
# The regulator ended (a crash, a kill, a stop) while the request waited or before it asked.
UNAVAILABLE: RefusalReason = "unavailable"
# A permit request's answer: None when it is granted, else why it is refused.
Answer = RefusalReason | None


# --- arguments, messages and the gate -------------------------------------------------------------


@attrs.frozen
class RegulatorArgs:
    """The permit policy in force at start, the lines its resolution logs (each regulator that
    starts logs them), and the registry of the permit metrics (actors/upstream/metrics.py)."""

    policy: PermitPolicy
    lines: tuple[LogLine, ...]
    registry: CollectorRegistry


@attrs.frozen
class ServerMaxStreams:
    total: int


@attrs.frozen
class PermitGate:
    """What a request process may do with the running regulator's permits (see the module
    docstring). `acquire(request_id, caller, deadline)`, `deadline` on the loop's clock, returns
    the answer, or a future of it when the request waits; `release` and `cancel` free what
    `request_id` holds (ids it does not know are ignored)."""

    acquire: Callable[[Hashable, Caller, float], Answer | asyncio.Future[Answer]]
    release: Callable[[Hashable], None]
    cancel: Callable[[Hashable], None]


def permit_gate(runtime: LoopSystemBase) -> PermitGate | None:
    """The running regulator's gate (a table read, no message), or None while none runs."""
    table = runtime.table(STATE_TABLE)
    return None if table is None else table.get(GATE_KEY)


@attrs.frozen
class GetPermits:
    """Ask: answered with a `PermitSnapshot` (tests, the console)."""


@attrs.frozen
class PermitSnapshot:
    held: Mapping[str, int]
    waiting: Mapping[str, int]
    limits: Mapping[str, int]
    server_max_streams: int


# --- the actor -----------------------------------------------------------------------------------


class Regulator(Process):
    trap_exit: ClassVar[bool] = True

    def init(self, args: RegulatorArgs) -> None:
        for line in args.lines:
            log_line(log, line)
        self.pool = PermitPool(args.policy)
        # A planned stop's StopAdmitting: every request is refused `stopping`.
        self.stopping = False
        # Public: the gate's operations run in the callers' coroutines, outside this actor, and
        # write the saturation flag from there. Nothing else writes it.
        table = self.new_table(STATE_TABLE, "public")
        self._saturation = LaneFlag(SlowLane.PERMITS, table.insert)
        self.metrics: UpstreamMetrics = upstream_metrics(args.registry)
        # Bound once: a refusal, a grant and a dropped call are counted without a label lookup.
        refused = self.metrics.permit_refused
        self._refused = {reason: refused.labels(reason) for reason in REFUSAL_REASONS}
        self._observe_wait = self.metrics.permit_wait_seconds.observe
        # The futures of the requests that wait, answered when a permit frees or the wait ends.
        self.waiters: dict[Hashable, asyncio.Future[Answer]] = {}
        self._expire_timer: Any = None
        self._expire_at: float | None = None
        self._attach_timer: Any = None
        self._channel: Channel | None = None
        self._listening: object | None = None  # token of the live settings listener
        self._ended = False
        self._publish_limits()
        self._publish_counts()
        self._check_channel()
        # However this actor ends (a brutal kill too, when terminate does not run), its waiters
        # must hear of it: they wait on futures, not on messages a monitor would cut short.
        self.runtime.monitor_callback(self.myAddress, self._ended_with)
        table.insert(GATE_KEY, PermitGate(self._acquire, self._release, self._cancel))

    # -- messages --

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        now = self.now()
        match msg:
            case ServerMaxStreams(total=total):
                self._perform(self.pool.set_server_max_streams(max(0, total), now))
            case WakeupMessage(payload=payload) if payload == _EXPIRE:
                self._expire_timer = self._expire_at = None
                self._perform(list(self.pool.expire(now)))
                self._arm_expire(self.pool.next_deadline())
            case WakeupMessage(payload=payload) if payload == _ATTACH:
                self._check_channel()
            case GetPermits():
                self.send(sender, self._snapshot())
            case StopAdmitting():
                # The planned stop's step 1: no permit from now on (docs/planned-stop.md).
                self.stopping = True
                self._refuse_waiters()
            case ActorExitRequest():
                self._stop()
            case _:
                pass

    def format_status(self) -> Mapping[str, Any]:
        snapshot = self._snapshot()
        return {
            "held": dict(snapshot.held),
            "waiting": dict(snapshot.waiting),
            "limits": dict(snapshot.limits),
            "server_max_streams": snapshot.server_max_streams,
            "channel": "attached" if self._listening is not None else "none",
        }

    # -- the gate: called by request processes on the loop, never from receiveMessage --

    def _acquire(
        self, request_id: Hashable, caller: Caller, deadline: float
    ) -> Answer | asyncio.Future[Answer]:
        if self._ended:
            return UNAVAILABLE
        if self.stopping:
            self._refused[STOPPING].inc()
            return STOPPING
        try:
            effects = self.pool.acquire(request_id, caller, deadline, self.now())
            own = effects[-1]
            if isinstance(own, Queued):
                future: asyncio.Future[Answer] = self.loop.create_future()
                self.waiters[request_id] = future
                self._perform(effects)
                return future
            self._perform(effects)
        except Exception as exc:
            self._crash(exc)
            return UNAVAILABLE
        return own.reason if isinstance(own, Refused) else None

    def _release(self, request_id: Hashable) -> None:
        if not self._ended:
            self._free(self.pool.release, request_id)

    def _cancel(self, request_id: Hashable) -> None:
        if not self._ended:
            self.waiters.pop(request_id, None)
            self._free(self.pool.cancel, request_id)

    def _free(
        self, free: Callable[[Hashable, float], list[PermitEffect]], request_id: Hashable
    ) -> None:
        try:
            self._perform(free(request_id, self.now()))
        except Exception as exc:
            self._crash(exc)

    def _crash(self, exc: Exception) -> None:
        """A defect in a gate operation: end as a crash in receiveMessage would, with the
        runtime's crash line (class and top frame only, docs/runbook.md), so the supervisor
        restarts the regulator with a fresh pool."""
        reason = ExitReason.crash(exc)
        crash_log.error("actor %s %s crashed: %s", REGULATOR_NAME, self.myAddress, reason)
        self.exit(reason)

    def _ended_with(self, _reason: ExitReason) -> None:
        self._ended = True  # the gauges read 0 and the gate refuses until a new regulator runs
        self._listening = None  # the channel may call our listener after we are gone
        waiters, self.waiters = self.waiters, {}
        for future in waiters.values():
            if not future.done():
                future.set_result(UNAVAILABLE)

    # -- effects --

    def _perform(self, effects: list[PermitEffect]) -> None:
        for effect in effects:
            match effect:
                case Granted(request_id=request_id, waited_s=waited_s):
                    self._observe_wait(waited_s)
                    self._answer(request_id, None)
                case Refused(request_id=request_id, reason=reason):
                    self._refused[reason].inc()
                    if reason == "deadline":
                        # "the request is not sent: yuzu_gw_upstream_calls_dropped_total"
                        self.metrics.calls_dropped.inc()
                    self._answer(request_id, reason)
                case Queued(deadline=deadline):
                    # Answered later, by a Granted or a Refused; by its deadline at the latest.
                    if self._expire_at is None or deadline < self._expire_at:
                        self._arm_expire(deadline)
                case LimitsChanged(line=line):
                    log_line(log, line)
                    self._publish_limits()
                case _:
                    carry_out(effect, log)
        self._saturation.update(self.pool.live_waiting)

    def _answer(self, request_id: Hashable, answer: Answer) -> None:
        future = self.waiters.pop(request_id, None)
        # Done already: its caller was cancelled, and its cancel frees what this answer gave.
        if future is not None and not future.done():
            future.set_result(answer)

    def _publish_counts(self) -> None:
        """Held and waiting are read from the pool when /metrics is scraped, not set on every
        message: a grant is a hot path and a scrape is rare. A restarted regulator points the
        gauges at its own pool; one that ended reads 0 until then."""
        pool, metrics = self.pool, self.metrics

        def reader(count: Callable[[], int]) -> Callable[[], float]:
            return lambda: 0.0 if self._ended else float(count())

        for p in Pool:
            metrics.permits_held.labels(p.value).set_function(reader(partial(pool.held, p)))
        for c in Caller:
            count = partial(pool.waiting, c)
            metrics.permits_waiting.labels(c.value).set_function(reader(count))

    def _publish_limits(self) -> None:
        limits = self.pool.limits
        for cls, value in (
            ("register", limits.register),
            ("inventory", limits.inventory),
            ("replay", limits.replay),
        ):
            self.metrics.permit_limit.labels(cls).set(value)

    def _arm_expire(self, deadline: float | None) -> None:
        """The timer goes off at `deadline` (None or infinite: no timer). It is only ever moved
        earlier, by a waiter queued with an earlier deadline: one that goes off early (its waiter
        was granted or cancelled since) expires nothing and is armed at the next deadline, so
        the waiters that leave the queue, the common case, never touch it."""
        if self._expire_timer is not None:
            self.cancel_wakeup(self._expire_timer)
            self._expire_timer = self._expire_at = None
        if deadline is not None and not math.isinf(deadline):
            self._expire_at = deadline
            self._expire_timer = self.wakeupAfter(max(0.0, deadline - self.now()), _EXPIRE)

    def _snapshot(self) -> PermitSnapshot:
        pool, limits = self.pool, self.pool.limits
        return PermitSnapshot(
            held={p.value: pool.held(p) for p in Pool},
            waiting={c.value: pool.waiting(c) for c in Caller},
            limits={
                "register": limits.register,
                "inventory": limits.inventory,
                "replay": limits.replay,
            },
            server_max_streams=pool.server_max_streams,
        )

    # -- the channel's stream limit --

    def _check_channel(self) -> None:
        """Follow the published channel: subscribe to a new one, drop one that is gone. Runs at
        start and every ATTACH_RETRY_S, so a channel actor that restarted (or was killed, with
        no chance to report) is found again without a monitor on it."""
        channel = upstream_channel(self.runtime)
        if channel is not self._channel:
            if self._channel is not None:
                self._channel_gone()
            if channel is not None:
                self._subscribe(channel)
        self._attach_timer = self.wakeupAfter(ATTACH_RETRY_S, _ATTACH)

    def _subscribe(self, channel: Channel) -> None:
        token = object()
        self._channel, self._listening = channel, token
        runtime, me = self.runtime, self.myAddress

        def on_settings(total: int) -> None:
            # Runs in the channel's code: only a tell, never a call on the pool from there.
            if self._listening is token:
                runtime.tell(me, ServerMaxStreams(total))

        channel.add_settings_listener(on_settings)
        self._perform(self.pool.set_server_max_streams(channel.server_max_streams(), self.now()))

    def _channel_gone(self) -> None:
        # Its connections are gone with it: no limit is known until a new channel's SETTINGS
        # arrive, so the configured sizes apply (seed: "Keep one upstream connection").
        self._channel = self._listening = None
        self._perform(self.pool.set_server_max_streams(0, self.now()))

    # -- planned stop --

    def _stop(self) -> None:
        self._refuse_waiters()
        self.exit(SHUTDOWN)

    def _refuse_waiters(self) -> None:
        now = self.now()
        for request_id in list(self.waiters):
            # A waiter granted by an earlier cancel of this loop holds its permit and goes on.
            if self.pool.is_waiting(request_id):
                future = self.waiters.pop(request_id)
                self._perform(self.pool.cancel(request_id, now))
                self._refused[STOPPING].inc()
                if not future.done():
                    future.set_result(STOPPING)
