"""The registration replay: the core of the upstream actor's replay lane.

Rules of this file: which held sessions are presented to the server again (a ProxyRegister
carrying the session id), in which order, how many at once, and when every held session is.
Nothing here does I/O, reads a clock or a table: time comes in as `now` (seconds, monotonic),
randomness as an injected `uniform(a, b)`, what the node holds as callables the lane passes in
(`is_held`, `held_sessions`). Methods return effects (`Count`, `LogLine`) and, for `launch`, the
sessions to replay now; the lane (actors/upstream/replay.py) carries them out.

Theory of operation (seed: "What happens when the server restarts": "What starts a full replay",
"A full replay and the verdict drip", "What the reconcile promises", "Replay failures feed the
shared circuit breaker"; "Stream Status Notification" > "When the store is full"; SPEC_INDEX
RP-03..RP-12, RP-17, RP-19, C49, C51, C52, C54, K27..K29, M31..M34):

* Targeted (`offer`). A verdict's sessions are appended to the queue in the order given (the
  reader sorted them): a session the node does not hold is dropped `not_local`; one already
  queued or being replayed, or replayed within the guard window (`registration_replay_session_
  guard_ms`, 10 s: the stamp is taken when a replay is sent), is skipped and counted nowhere;
  past `registration_replay_queue_max` (10,000) it is dropped `queue_full`. A verdict that
  queued at least one session counts `trigger="heartbeat"`. While the breaker is open the whole
  verdict is dropped (`circuit_open` per id): later heartbeats list the sessions again.
* Full. A verdict that names at least half of the heartbeats of its batch AND at least one
  session per 64 held agents (64 rounded down, clamped to 1..16), or that the server marked
  truncated, means the server lost its state: every held session is replayed
  (`trigger="server_lost_state"`). So does a lost CONNECTED (`arm_notify_loss`,
  `trigger="notify_loss"`), but only once the breaker is closed and the notification store has
  drained below half; it stays armed until then. A full replay starts after a random delay of
  up to `registration_replay_start_jitter_ms` (1 s) and walks the held sessions in chunks of 500,
  each loaded when the queue has drained (so it follows the entries queued before it), skipping
  sessions queued, in flight or inside the guard window: each agent is replayed once. Chunks are
  not capped by the queue's cap. No full replay starts within 60 s of the end of the previous
  one (the named sessions are still replayed); one that would start while another runs is not
  needed. A breaker recovery starts nothing: nothing here hears of it.
* `launch`: at most `concurrency` (the replay permits, 24) replays in flight; the queue first in
  first out. A session no longer held when its turn comes is skipped. `finished` ends one;
  `unsent` puts one that was refused before it was sent back at the head, its stamp removed.
* A full replay ends when its walk is exhausted and nothing is queued or in flight; the end is
  what the 60 s spacing counts from. A walk whose registry is unavailable is aborted (WARN).

Bounded state: the queue (at most the cap plus one chunk, plus the replays refused before they
were sent, which go back whatever the depth), the in-flight set (`concurrency`),
the guard stamps (pruned once older than the window), a full replay's walk (the held sessions).
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Literal

import attrs

from actors.core import Count, LogLine
from actors.core.verdicts import VERDICT_DROPPED, DropReason, HeartbeatVerdict

__all__ = [
    "CIRCUIT_OPEN_LINE",
    "FULL_DONE_LINE",
    "FULL_REPLAY_SPACING_S",
    "NOTIFY_LOSS_LINE",
    "QUEUED_LINE",
    "REGISTRY_UNAVAILABLE_LINE",
    "REPLAYS",
    "SERVER_LOST_STATE_LINE",
    "TRIGGERED",
    "TRIGGERS",
    "WALK_CHUNK",
    "Phase",
    "ReplayEffect",
    "ReplayPolicy",
    "ReplayQueue",
    "Trigger",
    "full_threshold",
]

# --- numbers ------------------------------------------------------------------------------------

# C51: a session replayed this recently is not replayed again: a verdict computed before the
# replay landed can arrive up to the 5 s flush deadline plus the replay's RPC time after it.
GUARD_S = 10.0
# C52: one pending entry per agent is the bound the seed promises; this caps verdict appends.
QUEUE_MAX = 10_000
# C49: half of the register permits, so a replay storm never takes every permit from agents
# that register live; the lane keeps no more than this in flight.
CONCURRENCY = 24
# K29: a full replay walks the registry in chunks of 500, so the queue never holds every agent.
WALK_CHUNK = 500
# K27: a server that keeps answering "unknown" costs at most one full replay a minute.
FULL_REPLAY_SPACING_S = 60.0
# C54: a random start delay of up to 1 s, so gateways that read the same restart do not replay
# in step.
START_JITTER_S = 1.0
# K28: "at least one session per 64 agents this node holds (at least 1, at most 16)".
HELD_PER_NAMED = 64
MIN_NAMED = 1
MAX_NAMED = 16

# --- families and lines -------------------------------------------------------------------------

REPLAYS = "yuzu_gw_registration_replay_total"  # M32, counted by the lane per attempt
TRIGGERED = "yuzu_gw_registration_replay_triggered_total"  # M31, label trigger
Trigger = Literal["heartbeat", "server_lost_state", "notify_loss"]
TRIGGERS: tuple[Trigger, ...] = ("heartbeat", "server_lost_state", "notify_loss")

# L22, quoted (R1).
QUEUED_LINE = (
    "Registration replay: heartbeat verdict named {named} session(s); queued {queued},"
    " not local {not_local}, already queued {already}, within guard {guard},"
    " queue full {full}"
)
# L24, quoted (R2d).
CIRCUIT_OPEN_LINE = (
    "Registration replay: heartbeat verdict named {named} session(s) while the circuit is"
    " open; dropped"
)
# L25, quoted; the truncated variant is this rebuild's.
SERVER_LOST_STATE_LINE = (
    "Registration replay: the server does not know {named} of the {batch} session(s) of a"
    " heartbeat batch; replaying every agent"
)
TRUNCATED_LINE = (
    "Registration replay: the server listed more than 4096 unknown sessions in a heartbeat"
    " batch; replaying every agent"
)
NOTIFY_LOSS_LINE = "Registration replay: a CONNECTED notification was lost; replaying every agent"
SPACED_LINE = (
    "Registration replay: a full replay ended less than 60 s ago; replaying the named"
    " session(s) only"
)
# L26, quoted.
REGISTRY_UNAVAILABLE_LINE = "Registration replay aborted: registry unavailable"
FULL_DONE_LINE = "Registration replay: every agent replayed ({walked} session(s) walked)"


class Phase(enum.Enum):
    """Of the full replay."""

    IDLE = "idle"
    WAITING = "waiting"  # the start jitter
    WALKING = "walking"


ReplayEffect = Count | LogLine
Uniform = Callable[[float, float], float]


@attrs.frozen
class ReplayPolicy:
    """The replay's numbers; the reasons are at the constants above."""

    guard_s: float = attrs.field(default=GUARD_S, validator=attrs.validators.ge(0.0))
    queue_max: int = attrs.field(default=QUEUE_MAX, validator=attrs.validators.ge(1))
    concurrency: int = attrs.field(default=CONCURRENCY, validator=attrs.validators.ge(1))
    walk_chunk: int = attrs.field(default=WALK_CHUNK, validator=attrs.validators.ge(1))
    full_spacing_s: float = attrs.field(
        default=FULL_REPLAY_SPACING_S, validator=attrs.validators.ge(0.0)
    )
    start_jitter_s: float = attrs.field(default=START_JITTER_S, validator=attrs.validators.ge(0.0))


def full_threshold(held: int) -> int:
    """The fewest named sessions that, with half the batch, mean the server lost its state."""
    return min(max(held // HELD_PER_NAMED, MIN_NAMED), MAX_NAMED)


def _dropped(reason: DropReason, n: int) -> Count:
    return Count(VERDICT_DROPPED, (("reason", reason),), n)


def _triggered(trigger: Trigger) -> Count:
    return Count(TRIGGERED, (("trigger", trigger),))


class ReplayQueue:
    """The replay queue, the guard stamps and the full replay. Owned by the replay lane."""

    def __init__(self, policy: ReplayPolicy, *, uniform: Uniform) -> None:
        self.policy = policy
        self._uniform = uniform
        self._queue: OrderedDict[str, None] = OrderedDict()
        self._inflight: set[str] = set()
        # session id -> when its replay was sent, oldest first (stamps only move forward).
        self._stamps: OrderedDict[str, float] = OrderedDict()
        self.phase = Phase.IDLE
        self._start_at = 0.0
        self._walk: deque[str] = deque()
        self._walked = 0
        self._last_end: float | None = None
        self.armed = False  # a lost CONNECTED waits for its full replay
        # Counts for the actor's status.
        self.launched = 0
        self.full_replays = 0

    # -- reading -----------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """yuzu_gw_registration_replay_queue_depth."""
        return len(self._queue)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    @property
    def active(self) -> bool:
        """A replay is running: the notification drain keeps one slot free meanwhile."""
        return self.phase is not Phase.IDLE or bool(self._queue) or bool(self._inflight)

    def is_queued(self, session_id: str) -> bool:
        return session_id in self._queue or session_id in self._inflight

    def within_guard(self, session_id: str, now: float) -> bool:
        stamp = self._stamps.get(session_id)
        return stamp is not None and now - stamp < self.policy.guard_s

    def next_deadline(self) -> float | None:
        """When `poll` has something to do by the clock alone: a start jitter ending, or an
        armed replay's 60 s spacing ending."""
        if self.phase is Phase.WAITING:
            return self._start_at
        if self.armed and self.phase is Phase.IDLE and self._last_end is not None:
            return self._last_end + self.policy.full_spacing_s
        return None

    def status(self) -> dict[str, int | str | bool]:
        """Counts only: the queue holds session ids."""
        return {
            "replay_queue": len(self._queue),
            "replay_inflight": len(self._inflight),
            "replay_guard_stamps": len(self._stamps),
            "replay_full": self.phase.value,
            "replay_walk_left": len(self._walk),
            "replay_armed": self.armed,
            "replay_launched": self.launched,
            "replay_full_replays": self.full_replays,
        }

    # -- events ------------------------------------------------------------------------------

    def offer(
        self,
        verdict: HeartbeatVerdict,
        now: float,
        *,
        breaker_open: bool,
        held: int,
        is_held: Callable[[str], bool],
    ) -> list[ReplayEffect]:
        """A heartbeat verdict. `held`: the agents the node holds (for the full threshold)."""
        named = len(verdict.session_ids)
        if breaker_open:
            if not named:
                return []
            return [
                _dropped("circuit_open", named),
                LogLine("info", CIRCUIT_OPEN_LINE.format(named=named)),
            ]
        self._prune(now)
        queued = not_local = already = guard = full = 0
        for session_id in verdict.session_ids:
            if not is_held(session_id):
                not_local += 1
            elif self.is_queued(session_id):
                already += 1
            elif self.within_guard(session_id, now):
                guard += 1
            elif len(self._queue) >= self.policy.queue_max:
                full += 1
            else:
                self._queue[session_id] = None
                queued += 1
        effects: list[ReplayEffect] = []
        if not_local:
            effects.append(_dropped("not_local", not_local))
        if full:
            effects.append(_dropped("queue_full", full))
        if queued:
            effects.append(_triggered("heartbeat"))
        if named:
            text = QUEUED_LINE.format(
                named=named,
                queued=queued,
                not_local=not_local,
                already=already,
                guard=guard,
                full=full,
            )
            # Once the drip has queued everything, later verdicts that only repeat it are routine.
            effects.append(LogLine("info" if queued or not_local or full else "debug", text))
        lost_state = named * 2 >= verdict.batch and named >= full_threshold(held)
        if held and (verdict.truncated or lost_state):
            line = (
                TRUNCATED_LINE
                if verdict.truncated
                else SERVER_LOST_STATE_LINE.format(named=named, batch=verdict.batch)
            )
            effects.extend(self._request_full("server_lost_state", line, now))
        return effects

    def arm_notify_loss(self) -> None:
        """A CONNECTED was lost at the notification store's cap: arm a full replay."""
        self.armed = True

    def poll(
        self,
        now: float,
        *,
        breaker_closed: bool,
        notify_below_half: bool,
        held_sessions: Callable[[], Iterable[str] | None],
    ) -> list[ReplayEffect]:
        """Start what the clock and the state allow: an armed notify-loss replay, a walk whose
        start jitter has passed. `held_sessions()`: the held session ids, None when the
        registry is unavailable."""
        effects: list[ReplayEffect] = []
        if (
            self.armed
            and self.phase is Phase.IDLE
            and breaker_closed
            and notify_below_half
            and not self._spaced(now)
        ):
            self.armed = False
            effects.extend(self._request_full("notify_loss", NOTIFY_LOSS_LINE, now))
        if self.phase is Phase.WAITING and now >= self._start_at:
            sessions = held_sessions()
            if sessions is None:
                self.phase = Phase.IDLE
                effects.append(LogLine("warning", REGISTRY_UNAVAILABLE_LINE))
            else:
                self._walk = deque(sessions)
                self._walked = 0
                self.phase = Phase.WALKING
                effects.extend(self._maybe_end(now))
        return effects

    def launch(
        self, now: float, is_held: Callable[[str], bool]
    ) -> tuple[list[str], list[ReplayEffect]]:
        """The sessions to replay now, stamped and counted in flight; and the end of a walk
        whose last sessions were all skipped."""
        self._prune(now)
        out: list[str] = []
        while len(self._inflight) < self.policy.concurrency:
            if not self._queue and not self._load_chunk(now):
                break
            session_id, _ = self._queue.popitem(last=False)
            if not is_held(session_id):
                continue  # gone since it was queued
            self._stamp(session_id, now)
            self._inflight.add(session_id)
            out.append(session_id)
        self.launched += len(out)
        return out, self._maybe_end(now)

    def finished(self, session_id: str, now: float) -> list[ReplayEffect]:
        """A replay ended (any answer, any failure)."""
        self._inflight.discard(session_id)
        return self._maybe_end(now)

    def unsent(self, session_id: str) -> None:
        """A replay refused before it was sent (circuit open, no permit): first again, with no
        guard stamp, since the server never saw it."""
        if session_id not in self._inflight:
            return
        self._inflight.discard(session_id)
        self._stamps.pop(session_id, None)
        self._queue[session_id] = None
        self._queue.move_to_end(session_id, last=False)

    # -- inside ------------------------------------------------------------------------------

    def _spaced(self, now: float) -> bool:
        """Within 60 s of the end of the previous full replay."""
        return self._last_end is not None and now - self._last_end < self.policy.full_spacing_s

    def _request_full(self, trigger: Trigger, line: str, now: float) -> list[ReplayEffect]:
        if self.phase is not Phase.IDLE:
            return []  # the one under way replays every agent already
        if self._spaced(now):
            # (`poll` starts an armed notify-loss replay only once the spacing has passed.)
            return [LogLine("info", SPACED_LINE)]
        self.phase = Phase.WAITING
        self._start_at = now + self._uniform(0.0, self.policy.start_jitter_s)
        self.full_replays += 1
        return [_triggered(trigger), LogLine("info", line)]

    def _load_chunk(self, now: float) -> bool:
        """Queue the next chunk of the walk; False when nothing was queued and none is left."""
        while self.phase is Phase.WALKING and self._walk:
            for _ in range(min(self.policy.walk_chunk, len(self._walk))):
                session_id = self._walk.popleft()
                self._walked += 1
                if self.is_queued(session_id) or self.within_guard(session_id, now):
                    continue
                self._queue[session_id] = None
            if self._queue:
                return True
        return False

    def _maybe_end(self, now: float) -> list[ReplayEffect]:
        if self.phase is not Phase.WALKING or self._walk or self._queue or self._inflight:
            return []
        self.phase = Phase.IDLE
        self._last_end = now
        return [LogLine("info", FULL_DONE_LINE.format(walked=self._walked))]

    def _stamp(self, session_id: str, now: float) -> None:
        self._stamps.pop(session_id, None)
        self._stamps[session_id] = now

    def _prune(self, now: float) -> None:
        stamps, guard = self._stamps, self.policy.guard_s
        while stamps:
            session_id, stamp = next(iter(stamps.items()))
            if now - stamp < guard:
                break
            del stamps[session_id]
