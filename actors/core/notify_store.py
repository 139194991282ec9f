"""The held stream-status notification store: the core of the upstream actor's notify lane.

Rules of this file: which NotifyStreamStatus is sent when, which waits, which is lost, and what is
counted. Nothing here does I/O, reads a clock or holds the circuit breaker: the breaker's state
(and its epoch, to tell half-open periods apart) comes in as values, time as `now` (seconds,
monotonic), randomness as an injected `uniform(a, b)`. Every method returns effects (`Send`,
`Count`, `Settled`, `ArmFullReplay`, `LogLine`) for the actor to carry out.

Theory of operation (seed: "Stream Status Notification", "When the server does not record a
notification", "Planned stop" step 5; SPEC_INDEX NS-01..NS-23, CB-04..CB-12, PS-06, PS-07):

* Held, not dropped. A notification is keyed by (agent id, session id, stream home id). A newer
  one for a held key replaces it where it stands in the queue (`coalesced`), so a CONNECTED then
  a DISCONNECTED of one session sends only the DISCONNECTED, and a repeated CONNECTED is sent once.
* Drain (`drain`): first in first out, at most 10 in flight, each `Send` run by the actor on its
  own worker. A key with a send in flight is skipped until that send ends, so one session's
  notifications cannot overtake each other. Nothing leaves while the breaker is open; in half
  open exactly one leaves, as the probe, with its own deadline (notify_probe_timeout_ms), and
  nothing else while it is out in that half-open period. Closed: the drain resumes at once, even
  with the probe still out.
* Results. OK: delivered. An RPC error (any breaker state): held again at the head (`requeued`),
  unless a newer notification for the key is held by then, which supersedes it (`coalesced`).
  A request-fault status or an encode failure: lost (`rejected`); a worker that died: lost
  (`crashed`). acknowledged=false: to the retry set (`resend.py`).
* Cap (`notify_pending_max`): held keys plus keys with a fresh send in flight (whose notification
  comes back if the send fails) stay at or below it. A newer notification for a key that is held
  or has a fresh send in flight is always taken. A new key at the cap: a DISCONNECTED evicts the
  oldest held CONNECTED whose key has no send in flight (lost `evicted`) and is held instead; a
  CONNECTED, or a DISCONNECTED with no such CONNECTED, is refused (`dropped{at_capacity}` and lost
  `at_capacity`). A CONNECTED lost at the cap arms a full registration replay (`ArmFullReplay`):
  a live agent the server cannot dispatch to is the loss the gateway can repair.
* Resends (the retry set). Fresh notifications are sent first; resends fill what is left, at most
  5 at once. Held while the breaker is open like the rest. A resend's own key is never held or in
  flight elsewhere: a newer notification for it ends the resend (`unacked_ended{superseded}`),
  at once if it waits, at its result if it is out.
* Planned stop: from its step 1 (`widen_for_stop`) the drain keeps up to 64 in flight, since no
  registration or replay is admitted any more; then (`begin_flush`, `flush`, `finish_flush`)
  every held notification is sent whatever the breaker, 64 in flight at a time; a waiting
  refused DISCONNECTED is sent too, a waiting refused CONNECTED is dropped (lost `shutdown`). A
  failed send is not retried and a refusal is not resent. What is left at the deadline is lost
  (`shutdown`); later notifications are counted, not sent.

Every offered notification is `Settled` exactly once: delivered, refused (its first
acknowledged=false; any resend after that is the retry set's), superseded by a newer one, or lost.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from typing import Literal, get_args

import attrs

from actors.core import Count, LogLine
from actors.core.breaker import State
from actors.core.resend import ResendPolicy, RetryEntry, RetrySet, Uniform

__all__ = [
    "COALESCED",
    "DROPPED",
    "EVICTED_UNENCODABLE",
    "FLUSH_BATCH",
    "FLUSH_DONE",
    "HWM_WINDOW_S",
    "INITIAL_SERIES",
    "LOST",
    "MAX_INFLIGHT",
    "PEER_ADDR_MAX_BYTES",
    "PENDING_MAX_FLOOR",
    "PENDING_PER_CONNECTION",
    "PROBE_DID_NOT_ANSWER",
    "PROBE_TIMEOUT_S",
    "REQUEUED",
    "UNACKED_ENDED",
    "UNACKNOWLEDGED",
    "UNACKNOWLEDGED_WARN",
    "ArmFullReplay",
    "Count",
    "Event",
    "FlushReport",
    "Gauges",
    "HighWater",
    "Mode",
    "Notification",
    "NotifyEffect",
    "NotifyPolicy",
    "NotifyStore",
    "Send",
    "Settled",
    "log_text",
    "pending_max_for",
    "sanitise_peer_addr",
]


# --- numbers ------------------------------------------------------------------------------------

# At most 10 in flight (MAX_NOTIFY_INFLIGHT, K14): the streams the permit sizing sets aside for
# this lane, so notifications never compete with registrations for the server's stream limit.
MAX_INFLIGHT = 10
# 15 s (notify_probe_timeout_ms): above the upstream client's own 5 s connect and call bounds,
# which usually end an unresponsive probe first; the gateway's deadline does not depend on them.
PROBE_TIMEOUT_S = 15.0
# The planned-stop flush sends 64 at a time: 5,000 sessions at 50 ms per call fit in about 4 s of
# the 20 s shutdown_flush_budget_ms.
FLUSH_BATCH = 64
# notify_pending_max: three held keys per agent connection the listeners admit (a DISCONNECTED of
# the old session plus a CONNECTED of the new one for a whole-fleet flap, and room for a second
# flap), and never below 15,000.
PENDING_PER_CONNECTION = 3
PENDING_MAX_FLOOR = 15_000
# The high-water mark keeps two alternating 60 s windows: the most keys held over the last one to
# two minutes, so a spike between two scrapes is still seen.
HWM_WINDOW_S = 60.0
# The acknowledged=false WARN: at most one a second.
UNACKED_WARN_INTERVAL_S = 1.0
# The peer address is agent-controlled: at most 255 bytes, cut at a character boundary.
PEER_ADDR_MAX_BYTES = 255
# A log copy of an agent-controlled value (the seed's log_text): 128 bytes, controls -> "?".
LOG_TEXT_MAX_BYTES = 128


def pending_max_for(max_connections: Iterable[int]) -> int:
    """notify_pending_max from the agent listeners' limits.max_connections (C55): 3 x their sum,
    at least 15,000. The shipped 60,000 connections give 180,000."""
    return max(PENDING_MAX_FLOOR, PENDING_PER_CONNECTION * sum(max_connections))


def _at_least(lo: float) -> Callable[[object, attrs.Attribute[float], float], None]:
    def check(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
        if not value >= lo:
            raise ValueError(f"{attribute.name} must be >= {lo}, got {value!r}")

    return check


@attrs.frozen
class NotifyPolicy:
    """The store's numbers; the reasons are at the constants above."""

    pending_max: int = attrs.field(default=PENDING_MAX_FLOOR, validator=_at_least(1))
    max_inflight: int = attrs.field(default=MAX_INFLIGHT, validator=_at_least(2))
    probe_timeout_s: float = attrs.field(default=PROBE_TIMEOUT_S, validator=_at_least(0.001))
    flush_batch: int = attrs.field(default=FLUSH_BATCH, validator=_at_least(1))
    hwm_window_s: float = attrs.field(default=HWM_WINDOW_S, validator=_at_least(0.001))
    unacked_warn_interval_s: float = UNACKED_WARN_INTERVAL_S
    resend: ResendPolicy = attrs.field(factory=ResendPolicy)

    def __attrs_post_init__(self) -> None:
        if self.resend.slots >= self.max_inflight:
            # Resends must leave fresh notifications a slot, or a refused crowd blocks them.
            raise ValueError(f"resend slots {self.resend.slots} >= {self.max_inflight}")


# --- records ------------------------------------------------------------------------------------


class Event(enum.Enum):
    """StreamStatusNotification.Event; the value is the metric label."""

    CONNECTED = "connected"
    DISCONNECTED = "disconnected"


NotifyKey = tuple[str, str, str]


def _cut_utf8(text: str, max_bytes: int) -> str:
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    # Only the last character can be split by the cut; "ignore" drops just that part.
    return raw[:max_bytes].decode("utf-8", errors="ignore")


def sanitise_peer_addr(value: str | bytes) -> str:
    """The peer address as kept and sent: not valid UTF-8 becomes "invalid", a longer one is cut
    to 255 bytes at a character boundary. Applied again here because the notification is admitted
    to the store from more than one place (seed: "Peer address")."""
    if isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            return "invalid"
    else:
        text = value
        try:
            text.encode("utf-8")  # a lone surrogate (from surrogateescape) is not UTF-8
        except UnicodeEncodeError:
            return "invalid"
    return _cut_utf8(text, PEER_ADDR_MAX_BYTES)


def log_text(value: str) -> str:
    """A log copy of an agent-controlled value: 128 bytes at most, control characters as "?"."""
    cleaned = "".join("?" if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 else c for c in value)
    return _cut_utf8(cleaned.encode("utf-8", "replace").decode("utf-8"), LOG_TEXT_MAX_BYTES)


@attrs.frozen
class Notification:
    """One NotifyStreamStatus to send. `payload` is opaque here: whatever the actor needs to build
    the request (gateway_node, cluster_id and wire_capabilities are the actor's to stamp)."""

    agent_id: str
    session_id: str
    stream_home_id: str
    event: Event
    peer_addr: str = attrs.field(default="unknown", converter=sanitise_peer_addr)
    payload: object = None

    @property
    def key(self) -> NotifyKey:
        return (self.agent_id, self.session_id, self.stream_home_id)

    @property
    def session(self) -> tuple[str, str]:
        return (self.agent_id, self.session_id)


# --- effects ------------------------------------------------------------------------------------


@attrs.frozen
class Send:
    """Run NotifyStreamStatus for `note` on a worker of its own and report the result with
    `token`. `deadline` (the probe only): kill the worker then and call `probe_timed_out`."""

    note: Notification
    token: int
    probe: bool = False
    resend: bool = False
    deadline: float | None = None


@attrs.frozen
class ArmFullReplay:
    """A CONNECTED was lost: arm a full registration replay (run by the replay lane once the
    breaker is closed and the store has drained below half; replay_triggered{notify_loss})."""

    trigger: str = "notify_loss"


SettledOutcome = Literal["delivered", "refused", "superseded", "lost"]


@attrs.frozen
class Settled:
    """`note` reached its end here: delivered, refused by the server (acknowledged=false, first
    time), superseded by a newer notification for its key, or lost. An owner recovering its
    session waits for its DISCONNECTED to settle (seed: "When an agent's owner process crashes")."""

    note: Notification
    outcome: SettledOutcome


NotifyEffect = Send | Count | ArmFullReplay | Settled | LogLine


@attrs.frozen
class Gauges:
    """The notify gauges (SPEC_INDEX M19-M22, M28, M29)."""

    pending: int  # yuzu_gw_upstream_notify_pending: held keys
    inflight: int  # yuzu_gw_upstream_notify_inflight: sends out, resends and the probe included
    pending_hwm: int  # yuzu_gw_upstream_notify_pending_hwm
    pending_max: int  # yuzu_gw_upstream_notify_pending_max: the cap in force
    unacked_keys: int  # yuzu_gw_upstream_notify_unacked_keys
    unacked_slow_keys: int  # yuzu_gw_upstream_notify_unacked_slow_keys


@attrs.frozen
class FlushReport:
    """The end of the planned-stop flush: `sent` sends were started by it, `left` notifications
    were never sent (each counted lost{shutdown})."""

    sent: int
    left: int
    effects: tuple[NotifyEffect, ...]


# Metric families (SPEC_INDEX M23-M27, M30) and their label values.
COALESCED = "yuzu_gw_upstream_notify_coalesced_total"
REQUEUED = "yuzu_gw_upstream_notify_requeued_total"
DROPPED = "yuzu_gw_upstream_notify_dropped_total"  # reason: at_capacity (unknown: overflow)
LOST = "yuzu_gw_upstream_notify_lost_total"  # event, reason
UNACKNOWLEDGED = "yuzu_gw_upstream_notify_unacknowledged_total"  # event
UNACKED_ENDED = "yuzu_gw_upstream_notify_unacked_ended_total"  # outcome

LostReason = Literal["evicted", "at_capacity", "rejected", "crashed", "unacknowledged", "shutdown"]
# The seed names only "superseded"; the other outcomes are this rebuild's.
EndedOutcome = Literal["acknowledged", "superseded", "session_ended", "expired", "lost", "shutdown"]

# Series created at 0 when the actor starts, so an absent series never has to mean "none yet".
# The seed pre-creates dropped{at_capacity} and dropped{unknown}; the rest are ours.
INITIAL_SERIES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (COALESCED, ()),
    (REQUEUED, ()),
    (DROPPED, (("reason", "at_capacity"),)),
    (DROPPED, (("reason", "unknown"),)),
    *(
        (LOST, (("event", event.value), ("reason", reason)))
        for event in Event
        for reason in get_args(LostReason)
    ),
    *((UNACKNOWLEDGED, (("event", event.value),)) for event in Event),
    *((UNACKED_ENDED, (("outcome", outcome),)) for outcome in get_args(EndedOutcome)),
)

# A CONNECTED lost for these reasons arms a full replay. The seed ties the replay to the cap;
# a rejected CONNECTED would be rejected again, and a crash is a gateway defect (see the doc).
_REPLAY_ON: frozenset[str] = frozenset({"evicted", "at_capacity"})


# --- log lines ----------------------------------------------------------------------------------

# Quoted from the seed (L06), one a second at most.
UNACKNOWLEDGED_WARN = (
    "Server did not record the {event} stream status notice for {agent} (acknowledged=false; "
    "refused {n} time(s) over {elapsed_ms} ms); sending it again in {delay_ms} ms"
)
# Quoted from the seed (L11).
EVICTED_UNENCODABLE = (
    "Evicted held stream status notification for {agent}: it cannot be encoded ({why}); the "
    "circuit breaker is not affected"
)
# The seed says only that the probe-deadline WARN "did not answer" (L12); the rest is ours.
PROBE_DID_NOT_ANSWER = (
    "Stream status probe for {agent} did not answer within {ms} ms (notify_probe_timeout_ms); "
    "its worker is killed, the probe counts as failed and its notification is held again"
)
# Quoted from the seed (L31).
FLUSH_DONE = (
    "Planned stop: {sent} stream-status notification(s) sent, {left} not sent by the flush deadline"
)


# Stale heap rows are dropped in bulk past this slack, as in permits.py.
_COMPACT_SLACK = 64


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


# --- the high-water mark ------------------------------------------------------------------------


@attrs.define
class HighWater:
    """The most keys held at once over the current window and the one before it: with 60 s
    windows, the last one to two minutes. `observe` after every change of the level."""

    window_s: float = HWM_WINDOW_S
    _index: int | None = attrs.field(init=False, default=None)
    _current: int = attrs.field(init=False, default=0)
    _previous: int = attrs.field(init=False, default=0)
    _level: int = attrs.field(init=False, default=0)

    def observe(self, level: int, now: float) -> None:
        self._roll(now)
        self._level = level
        self._current = max(self._current, level)

    def value(self, now: float) -> int:
        self._roll(now)
        return max(self._current, self._previous)

    def _roll(self, now: float) -> None:
        index = math.floor(now / self.window_s)
        if self._index is None:
            self._index = index
            return
        if index <= self._index:
            return
        # The level held since the last change lasted into every window in between.
        self._previous = self._current if index == self._index + 1 else self._level
        self._current = self._level
        self._index = index


# --- the store ----------------------------------------------------------------------------------


class Mode(enum.Enum):
    RUNNING = "running"
    FLUSHING = "flushing"  # the planned stop's step 5
    STOPPED = "stopped"  # after the flush deadline: later notifications are counted, not sent


@attrs.define
class _Out:
    note: Notification
    resend: bool
    probe_epoch: int | None  # the half-open period this send is the probe of


@attrs.define
class NotifyStore:
    """Held notifications, their drain, the cap and the retry set. No clock inside."""

    policy: NotifyPolicy = attrs.field(factory=NotifyPolicy)
    uniform: Uniform = attrs.field(kw_only=True)
    mode: Mode = attrs.field(init=False, default=Mode.RUNNING)
    # Plain counts for status and tests; the actor turns the `Count` effects into metrics.
    counts: Counter[tuple[str, tuple[tuple[str, str], ...]]] = attrs.field(
        init=False, factory=Counter
    )
    sent: int = attrs.field(init=False, default=0)  # sends started, resends included
    resent: int = attrs.field(init=False, default=0)  # resends started
    _cap: int = attrs.field(init=False, default=0)
    # The queue: OrderedDict order is queue order (head first); `_pos` numbers it so the oldest
    # held CONNECTED can be found through a heap without walking the queue.
    _held: OrderedDict[NotifyKey, Notification] = attrs.field(init=False, factory=OrderedDict)
    _pos: dict[NotifyKey, int] = attrs.field(init=False, factory=dict)
    _head: int = attrs.field(init=False, default=0)
    _tail: int = attrs.field(init=False, default=0)
    _connected: list[tuple[int, NotifyKey]] = attrs.field(init=False, factory=list)
    _connected_n: int = attrs.field(init=False, default=0)
    _out: dict[int, _Out] = attrs.field(init=False, factory=dict)
    _out_keys: dict[NotifyKey, int] = attrs.field(init=False, factory=dict)
    _token: int = attrs.field(init=False, default=0)
    _retry: RetrySet[Notification] = attrs.field(init=False)
    _hwm: HighWater = attrs.field(init=False)
    _warn_after: float = attrs.field(init=False, default=-math.inf)
    _flush_sent: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._cap = self.policy.pending_max
        self._retry = RetrySet(self.policy.resend, self.uniform, self._cap)
        self._hwm = HighWater(self.policy.hwm_window_s)

    # -- reading -----------------------------------------------------------------------------

    @property
    def cap(self) -> int:
        return self._cap

    @property
    def pending(self) -> int:
        return len(self._held)

    @property
    def inflight(self) -> int:
        return len(self._out)

    @property
    def slots_free(self) -> bool:
        """Fewer sends out than max_inflight. Without a free slot a drain starts nothing: it can
        only expire waiting DISCONNECTED resends, which the drain after the next result does."""
        return len(self._out) < self.policy.max_inflight

    @property
    def resends_out(self) -> int:
        return self._retry.out

    @property
    def probe_out(self) -> bool:
        """format_status's notify_probe_held."""
        return any(out.probe_epoch is not None for out in self._out.values())

    @property
    def occupancy(self) -> int:
        """What the cap bounds: held keys plus keys with a fresh send out that are not also
        held (a resend that fails goes back to the retry set, not here)."""
        extra = sum(
            1
            for key, token in self._out_keys.items()
            if not self._out[token].resend and key not in self._held
        )
        return len(self._held) + extra

    def held(self) -> list[Notification]:
        """The held notifications, head first."""
        return list(self._held.values())

    def in_flight(self) -> dict[int, Notification]:
        return {token: out.note for token, out in self._out.items()}

    def retry_entries(self) -> list[RetryEntry[Notification]]:
        return self._retry.entries()

    def next_deadline(self) -> float | None:
        """When the actor should call `drain` again even if nothing happens: a resend falls due
        or a waiting DISCONNECTED's window ends."""
        return self._retry.next_deadline()

    def gauges(self, now: float) -> Gauges:
        return Gauges(
            pending=len(self._held),
            inflight=len(self._out),
            pending_hwm=self._hwm.value(now),
            pending_max=self._cap,
            unacked_keys=len(self._retry),
            unacked_slow_keys=self._retry.slow_keys,
        )

    @property
    def flush_done(self) -> bool:
        """The flush has nothing left to send and nothing out: the stop need not wait."""
        return not self._held and not self._out and self._retry.waiting == 0

    # -- configuration -----------------------------------------------------------------------

    def set_cap(self, cap: int) -> None:
        """notify_pending_max in force (the planned stop raises it by 2 x the sessions held).
        A lower cap takes nothing held away; it only refuses new keys until below it."""
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self._cap = cap
        self._retry.capacity = cap

    def widen_for_stop(self) -> None:
        """A planned stop from step 1 on: up to `flush_batch` sends out at once. Nothing is
        admitted any more, so the streams the 10 keep free for registrations and replays are
        idle, and every session's DISCONNECTED (step 3) would otherwise wait 10 at a time."""
        policy = self.policy
        widest = max(policy.max_inflight, policy.flush_batch)
        self.policy = attrs.evolve(policy, max_inflight=widest)

    # -- admission ---------------------------------------------------------------------------

    def offer(self, note: Notification, now: float) -> list[NotifyEffect]:
        """A Subscribe stream connected or disconnected: hold `note` for the drain."""
        if self.mode is Mode.STOPPED:
            return self._lose(note, "shutdown")  # "Later notifications are counted, not sent."
        key = note.key
        effects = self._supersede_resend(key)
        old = self._held.get(key)
        if old is not None:
            self._replace(key, note)
            effects += [self._count(COALESCED), Settled(old, "superseded")]
        elif self._fresh_out(key) or self._below_cap():
            self._append(key, note)
        elif note.event is Event.DISCONNECTED and (victim := self._oldest_evictable()):
            # Losing a DISCONNECTED leaves the server listing a gone session as online until the
            # agent registers again, which nothing here can repair; a lost CONNECTED the replay
            # repairs. So the DISCONNECTED is the one kept.
            effects += self._lose(self._remove(victim), "evicted")
            self._append(key, note)
        else:
            effects.append(self._count(DROPPED, reason="at_capacity"))
            effects += self._lose(note, "at_capacity")
        self._observe(now)
        return effects

    def cancel_resends(self, agent_id: str, session_id: str) -> list[NotifyEffect]:
        """End every resend of one session (a restarted owner recovering it: a refused notice is
        not sent again, so none reaches the server after the session is presented again)."""
        removed, _marked = self._retry.cancel_session((agent_id, session_id))
        return [self._count(UNACKED_ENDED, outcome="superseded") for _ in removed]

    def adopt(self, now: float) -> list[NotifyEffect]:
        """A new `upstream` actor takes this store over from one that ended: the sends its
        predecessor had out will never report (their workers ended with it), so each is a failed
        send, held again in the order it went (during a stop's flush: lost{shutdown}). Nobody
        knows whether the server got them: a resend may repeat a notice, never lose one."""
        effects: list[NotifyEffect] = []
        for token in sorted(self._out, reverse=True):  # the oldest back at the head
            effects += self.sent_failed(token, now)
        return effects

    # -- the drain ---------------------------------------------------------------------------

    def drain(
        self,
        now: float,
        breaker: State,
        epoch: int = 0,
        *,
        replay_active: bool = False,
        holds_session: Callable[[Notification], bool] | None = None,
    ) -> list[NotifyEffect]:
        """The sends that may start now. Call it after every offer and result, and at
        `next_deadline()`. `breaker`/`epoch`: the breaker's state and epoch after its own
        `poll(now)`. `replay_active`: a registration replay is running, so one slot is kept free
        for it (NS-23). `holds_session`: whether the gateway still holds a CONNECTED's session,
        asked when its resend falls due (a CONNECTED is resent only while it does)."""
        if self.mode is not Mode.RUNNING:
            return []  # the planned stop's flush sends instead, waiting DISCONNECTEDs included
        effects = self._expire_resends(now)
        if breaker is State.OPEN:
            return effects
        limit = self.policy.max_inflight - (1 if replay_active else 0)
        if breaker is State.HALF_OPEN:
            probing = any(out.probe_epoch == epoch for out in self._out.values())
            if not probing and len(self._out) < limit:
                send = self._send_fresh(now, probe_epoch=epoch)
                if send is None:
                    # A resend may be the probe when no fresh notification can go: otherwise a
                    # half-open breaker with only refused sessions would never be probed.
                    send = self._send_resend(now, holds_session, effects, probe_epoch=epoch)
                if send is not None:
                    effects.append(send)
            return effects
        while len(self._out) < limit and (send := self._send_fresh(now)) is not None:
            effects.append(send)
        while (
            len(self._out) < limit
            and self._retry.out < self.policy.resend.slots
            and (send := self._send_resend(now, holds_session, effects)) is not None
        ):
            effects.append(send)
        return effects

    # -- results -----------------------------------------------------------------------------

    def sent_ok(self, token: int, now: float) -> list[NotifyEffect]:
        """The server answered OK with acknowledged=true."""
        out = self._take(token)
        if out is None:
            return []
        if out.resend:
            return [self._end_resend(out.note.key, "acknowledged")]
        return [Settled(out.note, "delivered")]

    def sent_failed(self, token: int, now: float) -> list[NotifyEffect]:
        """An RPC error, a timeout, a killed probe: requeued at the head in any breaker state
        (the breaker, which the actor feeds, decides when it goes out again)."""
        out = self._take(token)
        if out is None:
            return []
        note, key = out.note, out.note.key
        stopping = self.mode is not Mode.RUNNING
        if out.resend:
            entry = self._retry.get(key)
            if stopping:
                # "a failed send is not retried" during the flush
                return [self._end_resend(key, "shutdown"), *self._lost_count(note, "shutdown")]
            if (entry is not None and entry.superseded) or key in self._held:
                return [self._end_resend(key, "superseded")]
            self._retry.requeue(key)
            return [self._count(REQUEUED)]
        effects: list[NotifyEffect]
        if key in self._held:
            # The newer notification held for the key supersedes the one that came back, and
            # takes the head the failed one would have gone back to.
            effects = [self._count(COALESCED), Settled(note, "superseded")]
            if not stopping:
                self._to_head(key)
        elif stopping:
            effects = self._lose(note, "shutdown")
        else:
            self._insert_head(key, note)
            effects = [self._count(REQUEUED)]
        self._observe(now)
        return effects

    def probe_timed_out(self, token: int, now: float) -> list[NotifyEffect]:
        """The probe's deadline passed: the actor killed its worker (and records a failed probe
        in the breaker). One WARN per timeout, then the same as a failed send."""
        out = self._out.get(token)
        if out is None or out.probe_epoch is None:
            return []
        text = PROBE_DID_NOT_ANSWER.format(
            agent=log_text(out.note.agent_id), ms=_ms(self.policy.probe_timeout_s)
        )
        return [LogLine("warning", text), *self.sent_failed(token, now)]

    def unacknowledged(self, token: int, now: float) -> list[NotifyEffect]:
        """The server answered OK with acknowledged=false: it did not record the notification.
        Not a failure and not a recovery; the actor leaves the breaker alone."""
        out = self._take(token)
        if out is None:
            return []
        note, key = out.note, out.note.key
        effects: list[NotifyEffect] = [self._count(UNACKNOWLEDGED, event=note.event.value)]
        entry = self._retry.get(key) if out.resend else None
        if self.mode is not Mode.RUNNING:
            # "a refusal during the flush is not resent"
            if out.resend:
                effects.append(self._end_resend(key, "shutdown"))
                return effects + self._lost_count(note, "unacknowledged")
            return effects + self._lose(note, "unacknowledged")
        if key in self._held or (entry is not None and entry.superseded):
            # A newer notification wins; this one is not sent again.
            if out.resend:
                return [*effects, self._end_resend(key, "superseded")]
            return [*effects, Settled(note, "refused")]
        connected = note.event is Event.CONNECTED
        verdict, refusals = self._retry.refuse(key, note.session, note, connected, now)
        if verdict == "scheduled" and refusals is not None:
            if not out.resend:
                effects.append(Settled(note, "refused"))
            if now >= self._warn_after:
                self._warn_after = now + self.policy.unacked_warn_interval_s
                text = UNACKNOWLEDGED_WARN.format(
                    event=note.event.name,
                    agent=log_text(note.agent_id),
                    n=refusals.count,
                    elapsed_ms=_ms(now - refusals.first_at),
                    delay_ms=_ms(refusals.delay_s),
                )
                effects.append(LogLine("warning", text))
            return effects
        # "window": a DISCONNECTED past its window; "full": the set holds notify_pending_max.
        if out.resend:
            effects.append(self._count(UNACKED_ENDED, outcome="expired"))
            return effects + self._lost_count(note, "unacknowledged")
        return effects + self._lose(note, "unacknowledged")

    def rejected(
        self, token: int, now: float, *, encode_error: str | None = None
    ) -> list[NotifyEffect]:
        """A request-fault status (3, 5, 6, 9, 11), or the gateway's encoder refused the request
        (`encode_error` = "Class:Why"): retrying cannot help, so it is lost. A probe that cannot
        be encoded is evicted with the seed's WARN; the breaker does not move."""
        out = self._take(token)
        if out is None:
            return []
        effects: list[NotifyEffect] = []
        if out.probe_epoch is not None and encode_error is not None:
            text = EVICTED_UNENCODABLE.format(agent=log_text(out.note.agent_id), why=encode_error)
            effects.append(LogLine("warning", text))
        return effects + self._finish_lost(out, "rejected")

    def crashed(self, token: int, now: float) -> list[NotifyEffect]:
        """The worker died without a result: nobody knows whether the server got it."""
        out = self._take(token)
        if out is None:
            return []
        return self._finish_lost(out, "crashed")

    # -- the planned stop --------------------------------------------------------------------

    def begin_flush(self, now: float) -> list[NotifyEffect]:
        """Step 5 begins: from now on `drain` sends nothing and `flush` sends everything. A
        waiting refused CONNECTED is dropped (its session ends with the stop); a waiting refused
        DISCONNECTED stays, to be sent with the held notifications."""
        if self.mode is not Mode.RUNNING:
            return []
        self.mode = Mode.FLUSHING
        effects: list[NotifyEffect] = []
        for entry in self._retry.take_waiting(keep=lambda e: not e.connected):
            effects.append(self._count(UNACKED_ENDED, outcome="shutdown"))
            effects += self._lost_count(entry.note, "shutdown")
        return effects

    def flush(self, now: float) -> list[NotifyEffect]:
        """The sends that may start now in the flush: whatever the breaker, up to 64 out, held
        notifications first in first out (one send per key at a time still), then the waiting
        refused DISCONNECTEDs, whatever their backoff. Call it after every result."""
        effects: list[NotifyEffect] = []
        if self.mode is not Mode.FLUSHING:
            return effects
        while len(self._out) < self.policy.flush_batch:
            send = self._send_fresh(now)
            if send is None:
                entry = self._retry.pop_due(now, ignore_due=True)
                if entry is None:
                    break
                send = self._start(entry.note, resend=True, probe_epoch=None, now=now)
            self._flush_sent += 1
            effects.append(send)
        return effects

    def finish_flush(self, now: float) -> FlushReport:
        """The flush deadline (or nothing left): everything never sent is lost{shutdown}, and
        notifications offered from now on are counted, not sent. Sends still out were sent;
        their results are still taken (and not retried). A second call reports nothing new."""
        if self.mode is Mode.STOPPED:
            return FlushReport(sent=self._flush_sent, left=0, effects=())
        effects: list[NotifyEffect] = self.begin_flush(now)
        left = 0
        for key in list(self._held):
            left += 1
            effects += self._lose(self._remove(key), "shutdown")
        for entry in self._retry.take_waiting(keep=lambda _e: False):
            left += 1
            effects.append(self._count(UNACKED_ENDED, outcome="shutdown"))
            effects += self._lost_count(entry.note, "shutdown")
        self.mode = Mode.STOPPED
        self._observe(now)
        line = FLUSH_DONE.format(sent=self._flush_sent, left=left)
        # The WARN names what is left; a stop that sent everything has nothing to warn of.
        effects.append(LogLine("warning" if left else "info", line))
        return FlushReport(sent=self._flush_sent, left=left, effects=tuple(effects))

    # -- internals: the queue ----------------------------------------------------------------

    # Every held CONNECTED has a heap row (position, key) at its current position, so the oldest
    # is found without walking the queue; `_connected_n` counts the held CONNECTEDs exactly, and
    # rows of replaced, moved or removed entries go stale, to be skipped or compacted.

    def _append(self, key: NotifyKey, note: Notification) -> None:
        self._tail += 1
        self._held[key] = note
        self._pos[key] = self._tail
        if note.event is Event.CONNECTED:
            self._connected_n += 1
            self._push_connected(key)

    def _insert_head(self, key: NotifyKey, note: Notification) -> None:
        self._held[key] = note
        self._to_head(key)
        if note.event is Event.CONNECTED:
            self._connected_n += 1

    def _to_head(self, key: NotifyKey) -> None:
        self._held.move_to_end(key, last=False)
        self._head -= 1
        self._pos[key] = self._head
        if self._held[key].event is Event.CONNECTED:
            self._push_connected(key)

    def _replace(self, key: NotifyKey, note: Notification) -> None:
        old = self._held[key]
        self._held[key] = note  # an existing key keeps its place in an OrderedDict
        was_connected = old.event is Event.CONNECTED
        is_connected = note.event is Event.CONNECTED
        self._connected_n += is_connected - was_connected
        if is_connected and not was_connected:
            self._push_connected(key)

    def _remove(self, key: NotifyKey) -> Notification:
        note = self._held.pop(key)
        del self._pos[key]
        if note.event is Event.CONNECTED:
            self._connected_n -= 1
        return note

    def _push_connected(self, key: NotifyKey) -> None:
        heapq.heappush(self._connected, (self._pos[key], key))
        if len(self._connected) > 2 * self._connected_n + _COMPACT_SLACK:
            rows = [(self._pos[k], k) for k, n in self._held.items() if n.event is Event.CONNECTED]
            heapq.heapify(rows)
            self._connected = rows

    def _is_connected_row(self, pos: int, key: NotifyKey) -> bool:
        note = self._held.get(key)
        return note is not None and note.event is Event.CONNECTED and self._pos[key] == pos

    def _oldest_evictable(self) -> NotifyKey | None:
        """The held CONNECTED nearest the head whose key has no send out (evicting one with a
        send out would free no room: the send's key still counts)."""
        skipped: list[tuple[int, NotifyKey]] = []
        found: NotifyKey | None = None
        while self._connected:
            pos, key = self._connected[0]
            if not self._is_connected_row(pos, key):
                heapq.heappop(self._connected)
                continue
            if key in self._out_keys:
                skipped.append(heapq.heappop(self._connected))
                continue
            found = key
            break
        for row in skipped:
            heapq.heappush(self._connected, row)
        return found

    def _below_cap(self) -> bool:
        """`occupancy < cap`, without walking the sends out while held plus out is below it
        (the common case: the walk would run on every offer)."""
        if len(self._held) + len(self._out_keys) < self._cap:
            return True
        return self.occupancy < self._cap

    def _fresh_out(self, key: NotifyKey) -> bool:
        token = self._out_keys.get(key)
        return token is not None and not self._out[token].resend

    # -- internals: sending ------------------------------------------------------------------

    def _start(
        self, note: Notification, *, resend: bool, probe_epoch: int | None, now: float
    ) -> Send:
        self._token += 1
        token = self._token
        self._out[token] = _Out(note, resend, probe_epoch)
        self._out_keys[note.key] = token
        self.sent += 1
        self.resent += resend
        deadline = None if probe_epoch is None else now + self.policy.probe_timeout_s
        return Send(note, token, probe=probe_epoch is not None, resend=resend, deadline=deadline)

    def _send_fresh(self, now: float, probe_epoch: int | None = None) -> Send | None:
        """The held notification nearest the head whose key has no send out."""
        for key in self._held:
            if key not in self._out_keys:
                note = self._remove(key)
                self._observe(now)
                return self._start(note, resend=False, probe_epoch=probe_epoch, now=now)
        return None

    def _send_resend(
        self,
        now: float,
        holds_session: Callable[[Notification], bool] | None,
        effects: list[NotifyEffect],
        probe_epoch: int | None = None,
    ) -> Send | None:
        while (entry := self._retry.pop_due(now)) is not None:
            if entry.connected and holds_session is not None and not holds_session(entry.note):
                # The session is gone: its CONNECTED must not be recorded now.
                self._retry.remove(entry.key)
                effects.append(self._count(UNACKED_ENDED, outcome="session_ended"))
                continue
            return self._start(entry.note, resend=True, probe_epoch=probe_epoch, now=now)
        return None

    def _expire_resends(self, now: float) -> list[NotifyEffect]:
        effects: list[NotifyEffect] = []
        for entry in self._retry.expire(now):
            effects.append(self._count(UNACKED_ENDED, outcome="expired"))
            effects += self._lost_count(entry.note, "unacknowledged")
        return effects

    def _take(self, token: int) -> _Out | None:
        """The send behind `token`, no longer out; None for a token already answered (a result
        that races the probe deadline, or one from before the flush's end)."""
        out = self._out.pop(token, None)
        if out is not None:
            del self._out_keys[out.note.key]
        return out

    # -- internals: ends and counts ----------------------------------------------------------

    def _supersede_resend(self, key: NotifyKey) -> list[NotifyEffect]:
        if self._retry.cancel(key) == "removed":
            return [self._count(UNACKED_ENDED, outcome="superseded")]
        return []  # absent, or out: ended when its result comes back

    def _end_resend(self, key: NotifyKey, outcome: EndedOutcome) -> Count:
        if key in self._retry:
            self._retry.remove(key)
        return self._count(UNACKED_ENDED, outcome=outcome)

    def _finish_lost(self, out: _Out, reason: LostReason) -> list[NotifyEffect]:
        if out.resend:
            # Already settled as refused when it entered the retry set.
            end = self._end_resend(out.note.key, "lost")
            return [end, *self._lost_count(out.note, reason)]
        return self._lose(out.note, reason)

    def _lost_count(self, note: Notification, reason: LostReason) -> list[NotifyEffect]:
        effects: list[NotifyEffect] = [self._count(LOST, event=note.event.value, reason=reason)]
        if (
            note.event is Event.CONNECTED
            and reason in _REPLAY_ON
            and self.mode is Mode.RUNNING  # no registration replay runs during a planned stop
        ):
            effects.append(ArmFullReplay())
        return effects

    def _lose(self, note: Notification, reason: LostReason) -> list[NotifyEffect]:
        return [*self._lost_count(note, reason), Settled(note, "lost")]

    def _count(self, family: str, **labels: str) -> Count:
        pairs = tuple(labels.items())
        self.counts[(family, pairs)] += 1
        return Count(family, pairs)

    def _observe(self, now: float) -> None:
        self._hwm.observe(len(self._held), now)
