"""`upstream_regulator`: the actor that hands out upstream call permits.

The Erlang gateway's yuzu_gw_upstream_regulator. It owns the `PermitPool` core
(actors/core/permits.py) and turns messages into calls on it:

- `Acquire` (ask): answered at once with `PermitGranted` or `PermitRefused`, or later when the
  request waited in the queue; the asker's coroutine simply awaits the answer;
- `Release` (tell): the call is done, or it hands its permit back after too_many_streams;
- `Cancel` (tell): the caller went away (its coroutine was cancelled); its permit or its place in
  the queue is freed at once (seed: "its permit or its place in the queue is freed by its exit");
- `ServerMaxStreams` (tell): the upstream channel's total of SETTINGS_MAX_CONCURRENT_STREAMS
  changed; the permits in force follow it (`limits_for`).

It arms one timer at the earliest waiter deadline so a request whose deadline passes is refused
on time (and never sent), and it carries out the core's effects: the answers, the metrics
(held, waiting, wait time, refusals, dropped calls, limits) and the sizing log lines. Whether a
live request waits (the `permits` lane's saturation) is published in its protected table
`upstream_regulator_state`, which the slow-server sampler reads without a message.

It finds the channel in the `upstream_channels` table the channel actor publishes, subscribes
to its settings changes, and looks at the table again every second: when the channel is gone
(its actor ended) the limit is unknown (0, so the configured sizes apply) until a new channel
is found. A channel that closes tells its listeners 0 itself, so that is usually immediate.

A planned stop (`StopAdmitting`, then `ActorExitRequest`) refuses every waiter with `stopping`,
so no caller waits out its deadline for an answer that cannot come, and after `StopAdmitting`
every new request too. Each of those refusals is counted
`yuzu_gw_upstream_permit_refused_total{reason="stopping"}`, like the core's own refusals.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import attrs
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
    policy_from_settings,
)
from actors.core.slow_server import LaneFlag, SlowLane
from actors.stop_messages import StopAdmitting
from gateway.config.keys.upstream import (
    UPSTREAM_CALL_TIMEOUT_MS,
    UPSTREAM_INVENTORY_CONCURRENCY,
    UPSTREAM_PERMIT_QUEUE_MAX,
    UPSTREAM_REGISTER_CONCURRENCY,
    UPSTREAM_REPLAY_CONCURRENCY,
    UPSTREAM_RPC_TIMEOUT_MS,
)
from gateway.upstream.channel_actor import TABLE as CHANNELS_TABLE
from gateway.upstream.client_config import DEFAULT_CHANNEL
from gateway.upstream.metrics import UpstreamMetrics, upstream_metrics
from supervisors.address import Address
from supervisors.process import Process
from supervisors.reason import SHUTDOWN, ExitReason

if TYPE_CHECKING:
    from gateway.config import Config
    from gateway.context import NodeContext
    from gateway.upstream.api import Channel

__all__ = [
    "CHANNELS_TABLE",
    "DEFAULT_CHANNEL",
    "NAME",
    "STATE_TABLE",
    "Acquire",
    "Cancel",
    "GetPermits",
    "PermitGranted",
    "PermitRefused",
    "PermitSnapshot",
    "Regulator",
    "Release",
    "ServerMaxStreams",
]

log = logging.getLogger("yuzu_gw.upstream_regulator")

NAME = "upstream_regulator"
STATE_TABLE = "upstream_regulator_state"
# How often to look at the published channel (none yet, a channel restart, a test node with
# allow_no_upstream): a table read, so cheap; one second bounds how long the permits run on
# stale sizes after a channel actor was replaced without telling anyone (a brutal kill).
ATTACH_RETRY_S = 1.0
_EXPIRE = "expire"
_ATTACH = "attach"
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

RefusalReason = Literal["queue_full", "deadline", "stopping"]
STOPPING: RefusalReason = "stopping"


# --- messages ------------------------------------------------------------------------------------


@attrs.frozen
class Acquire:
    """Ask for a permit. `deadline` is on the loop's clock (`loop.time()`)."""

    request_id: Hashable
    caller: Caller
    deadline: float


@attrs.frozen
class Release:
    request_id: Hashable


@attrs.frozen
class Cancel:
    request_id: Hashable


@attrs.frozen
class ServerMaxStreams:
    total: int


@attrs.frozen
class PermitGranted:
    request_id: Hashable
    waited_s: float


@attrs.frozen
class PermitRefused:
    request_id: Hashable
    reason: RefusalReason


@attrs.frozen
class GetPermits:
    """Ask: answered with a `PermitSnapshot` (tests, the console)."""


@attrs.frozen
class PermitSnapshot:
    held: Mapping[str, int]
    waiting: Mapping[str, int]
    limits: Mapping[str, int]
    server_max_streams: int


def permit_policy_of(config: Config) -> tuple[PermitPolicy, list[LogLine]]:
    """The permit policy the configuration asks for, and the lines its resolution logs (the
    regulator logs them; the replay lane reads the resolved replay cap)."""
    return policy_from_settings(
        register=config[UPSTREAM_REGISTER_CONCURRENCY],
        inventory=config[UPSTREAM_INVENTORY_CONCURRENCY],
        replay=config[UPSTREAM_REPLAY_CONCURRENCY],
        queue_max=config[UPSTREAM_PERMIT_QUEUE_MAX],
        call_timeout_ms=config[UPSTREAM_CALL_TIMEOUT_MS],
        rpc_timeout_ms=config[UPSTREAM_RPC_TIMEOUT_MS],
    )


# --- the actor -----------------------------------------------------------------------------------


class Regulator(Process):
    trap_exit: ClassVar[bool] = True

    def init(self, args: NodeContext) -> None:
        policy, lines = permit_policy_of(args.config)
        for line in lines:
            self._log(line)
        self.pool = PermitPool(policy)
        # A planned stop's StopAdmitting: every Acquire is refused `stopping`.
        self.stopping = False
        self._saturation = LaneFlag(SlowLane.PERMITS, self.new_table(STATE_TABLE).insert)
        self.metrics: UpstreamMetrics = upstream_metrics(args.registry)
        # Who asked, for requests not yet answered (queued); answered ones are dropped.
        self.askers: dict[Hashable, Address] = {}
        self._expire_timer: Any = None
        self._expire_at: float | None = None
        self._attach_timer: Any = None
        self._channel: Channel | None = None
        self._listening: object | None = None  # token of the live settings listener
        self._ended = False
        self._publish_limits()
        self._publish_counts()
        self._check_channel()

    # -- messages --

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        now = self.now()
        match msg:
            case Acquire(request_id=request_id) if self.stopping:
                self._refuse_stopping(request_id, sender)
            case Acquire(request_id=request_id, caller=caller, deadline=deadline):
                self.askers[request_id] = sender
                self._perform(self.pool.acquire(request_id, caller, deadline, now))
            case Release(request_id=request_id):
                self.askers.pop(request_id, None)
                self._perform(self.pool.release(request_id, now))
            case Cancel(request_id=request_id):
                self.askers.pop(request_id, None)
                self._perform(self.pool.cancel(request_id, now))
            case ServerMaxStreams(total=total):
                self._perform(self.pool.set_server_max_streams(max(0, total), now))
            case WakeupMessage(payload=payload) if payload == _EXPIRE:
                self._expire_timer = self._expire_at = None
                self._perform(list(self.pool.expire(now)))
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

    def terminate(self, reason: ExitReason) -> None:
        self._listening = None  # the channel may call our listener after we are gone
        self._ended = True  # the gauges read 0 until a new regulator takes them over

    def format_status(self) -> Mapping[str, Any]:
        snapshot = self._snapshot()
        return {
            "held": dict(snapshot.held),
            "waiting": dict(snapshot.waiting),
            "limits": dict(snapshot.limits),
            "server_max_streams": snapshot.server_max_streams,
            "channel": "attached" if self._listening is not None else "none",
        }

    # -- effects --

    def _perform(self, effects: list[PermitEffect]) -> None:
        for effect in effects:
            match effect:
                case Granted(request_id=request_id, waited_s=waited_s):
                    self.metrics.permit_wait_seconds.observe(waited_s)
                    self._answer(request_id, PermitGranted(request_id, waited_s))
                case Refused(request_id=request_id, reason=reason):
                    self.metrics.permit_refused.labels(reason).inc()
                    if reason == "deadline":
                        # "the request is not sent: yuzu_gw_upstream_calls_dropped_total"
                        self.metrics.calls_dropped.inc()
                    self._answer(request_id, PermitRefused(request_id, reason))
                case Queued():
                    pass  # answered later, by a Granted or a Refused
                case LimitsChanged(line=line):
                    self._log(line)
                    self._publish_limits()
                case LogLine():
                    self._log(effect)
        self._arm_expire()
        self._saturation.update(self.pool.live_waiting)

    def _answer(self, request_id: Hashable, answer: PermitGranted | PermitRefused) -> None:
        asker = self.askers.pop(request_id, None)
        if asker is not None:
            self.send(asker, answer)

    def _publish_counts(self) -> None:
        """Held and waiting are read from the pool when /metrics is scraped, not set on every
        message: a grant is a hot path and a scrape is rare. A restarted regulator points the
        gauges at its own pool; one that ended (and ran terminate) reads 0 until then."""
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

    def _arm_expire(self) -> None:
        deadline = self.pool.next_deadline()
        if deadline == self._expire_at:
            return
        if self._expire_timer is not None:
            self.cancel_wakeup(self._expire_timer)
            self._expire_timer = None
        self._expire_at = deadline
        if deadline is not None:
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

    @staticmethod
    def _log(line: LogLine) -> None:
        log.log(_LEVELS[line.level], "%s", line.text)

    # -- the channel's stream limit --

    def _check_channel(self) -> None:
        """Follow the published channel: subscribe to a new one, drop one that is gone. Runs at
        start and every ATTACH_RETRY_S, so a channel actor that restarted (or was killed, with
        no chance to report) is found again without a monitor on it."""
        table = self.runtime.table(CHANNELS_TABLE)
        channel: Channel | None = table.get(DEFAULT_CHANNEL) if table is not None else None
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
        self.askers.clear()
        self.exit(SHUTDOWN)

    def _refuse_waiters(self) -> None:
        for request_id, asker in list(self.askers.items()):
            if self.pool.is_waiting(request_id):
                self.askers.pop(request_id)
                self._perform(self.pool.cancel(request_id, self.now()))
                self._refuse_stopping(request_id, asker)

    def _refuse_stopping(self, request_id: Hashable, asker: Address) -> None:
        self.metrics.permit_refused.labels(STOPPING).inc()
        self.send(asker, PermitRefused(request_id, STOPPING))
