"""The acknowledged=false retry set: notifications the server answered OK but did not record.

Rules of this file: when a refused notification is sent again, and when it stops being sent.
Nothing here does I/O, reads a clock or owns a random source: time comes in as `now` (seconds,
monotonic) and randomness as an injected `uniform(a, b)`. Which resend may use a slot, and what a
result means for the held-notification store, is `notify_store.py`'s business.

Theory of operation (seed: "When the server does not record a notification"; SPEC_INDEX
NS-14..NS-22, PS-07):

* One entry per key (agent id, session id, stream home id), holding the refused notification and
  its refusal history: when it was first refused, how many times, the last delay.
* Backoff: decorrelated jitter. The next delay is `min(max, uniform(base, 3 x previous))`, the
  previous delay of the first resend being the base, so the first resend comes 1 to 3 s after the
  refusal and the delay averages about 34 s once refusals go on (the seed's simulated figure,
  which this formula reproduces; drawing below the cap instead would average about 20 s).
* Slow phase: a CONNECTED refused since `slow_after` (15 min) ago or longer (time spent waiting
  for a slot or for the breaker counts too, because the clock is the first refusal) is resent
  every 0.8 to 1 x `slow_max` (600 s). The threshold is time, not a number of refusals: the
  normal backoff reaches 10 refusals in as little as 33 s, which slowed sessions of a server that
  was only briefly degraded (#6077).
* A CONNECTED has no time limit. A DISCONNECTED is resent only inside its window (120 s from its
  first refusal): a refusal whose next resend would fall after the window ends is not scheduled,
  and a waiting DISCONNECTED whose window ends before it gets a slot is expired. It is never
  slowed: the window bounds it already.
* The set holds at most `capacity` entries (notify_pending_max); a new refusal past that is not
  scheduled.
* A newer notification for the key ends the entry: a waiting entry is removed at once, an entry
  whose resend is out is marked, so its result ends it instead of rescheduling it (the resend on
  its way is waited for, so the two reach the server in order).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Generic, Literal, Protocol, TypeVar

import attrs

__all__ = [
    "BASE_KEY",
    "DISCONNECTED_WINDOW_KEY",
    "MAX_KEY",
    "SLOW_AFTER_KEY",
    "SLOW_MAX_KEY",
    "Refusals",
    "ResendPolicy",
    "RetryEntry",
    "RetrySet",
    "Uniform",
    "after_refusal",
    "next_delay",
    "slow_delay",
]

N = TypeVar("N")
Key = Hashable


class Uniform(Protocol):
    """A random float in [a, b]: `random.Random(...).uniform`, injected so tests can drive it."""

    def __call__(self, a: float, b: float, /) -> float: ...


def _positive(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


def _fraction(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{attribute.name} must be in (0, 1], got {value!r}")


# The seed's configuration keys (SPEC_INDEX C57..C61), all in milliseconds. They are validated by
# gateway/config/keys/replay.py; `ResendPolicy.from_config` only converts them.
BASE_KEY = "notify_unacked_retry_base_ms"
MAX_KEY = "notify_unacked_retry_max_ms"
SLOW_AFTER_KEY = "notify_unacked_slow_after_ms"
SLOW_MAX_KEY = "notify_unacked_slow_max_ms"
DISCONNECTED_WINDOW_KEY = "notify_unacked_disconnected_window_ms"


@attrs.frozen
class ResendPolicy:
    """The retry set's numbers, each with the seed's reason."""

    # 1 s: the first resend comes 1 to 3 s after the refusal, so a refusal the server takes back
    # seconds later costs the session seconds.
    base_s: float = attrs.field(default=1.0, validator=_positive)
    # 60 s: a server that starts accepting again has every refused notification within about a
    # minute; 5,000 refused sessions cost about 150 resends a second.
    max_s: float = attrs.field(default=60.0, validator=_positive)
    # 15 min: well past a typical degraded-route-store outage, so a refusal that ends before then
    # slows no one.
    slow_after_s: float = attrs.field(default=900.0, validator=_positive)
    # 600 s: a refusal the server will repeat for the session's life (stale_connected_session,
    # cluster_affinity_violation) costs about 9 resends a second for 5,000 sessions.
    slow_max_s: float = attrs.field(default=600.0, validator=_positive)
    # 0.8: "jittered down by up to 20%", so no slowed session is resent more than once every
    # 8 minutes and sessions slowed together are spread over 2 minutes.
    slow_floor: float = attrs.field(default=0.8, validator=_fraction)
    # 120 s: the server refuses a DISCONNECTED only for a session it does not know; its route row
    # stops being routable when the 90 s lease runs out anyway.
    disconnected_window_s: float = attrs.field(default=120.0, validator=_positive)
    # 5 of the 10 notification slots: a large refused population can never hold up a fresh
    # CONNECTED or DISCONNECTED.
    slots: int = attrs.field(default=5, validator=attrs.validators.ge(1))

    @property
    def effective_max_s(self) -> float:
        # A cap below the base is lifted to the base, as the breaker does with its own.
        return max(self.base_s, self.max_s)

    @classmethod
    def from_config(cls, values: Mapping[str, int]) -> ResendPolicy:
        """From validated configuration values in ms; a key that is absent keeps its default."""
        default = cls()

        def seconds(key: str, fallback: float) -> float:
            raw = values.get(key)
            return fallback if raw is None else raw / 1000.0

        return cls(
            base_s=seconds(BASE_KEY, default.base_s),
            max_s=seconds(MAX_KEY, default.max_s),
            slow_after_s=seconds(SLOW_AFTER_KEY, default.slow_after_s),
            slow_max_s=seconds(SLOW_MAX_KEY, default.slow_max_s),
            disconnected_window_s=seconds(DISCONNECTED_WINDOW_KEY, default.disconnected_window_s),
        )


# --- the backoff ----------------------------------------------------------------------------


def next_delay(policy: ResendPolicy, previous_s: float | None, uniform: Uniform) -> float:
    """Decorrelated jitter: `min(max, uniform(base, 3 x previous))`; no previous is the base."""
    previous = policy.base_s if previous_s is None else max(previous_s, policy.base_s)
    drawn = uniform(policy.base_s, 3.0 * previous)
    # Clamped as well as capped, so a random source that strays cannot leave the bounds.
    return min(policy.effective_max_s, max(policy.base_s, drawn))


def slow_delay(policy: ResendPolicy, uniform: Uniform) -> float:
    """The slow phase: 0.8 to 1 x slow_max. Not decorrelated jitter up to slow_max: its floor
    stays the base, so a third of its delays would still fall below the cap, down to 1 s."""
    low = policy.slow_floor * policy.slow_max_s
    return min(policy.slow_max_s, max(low, uniform(low, policy.slow_max_s)))


@attrs.frozen
class Refusals:
    """A key's refusal history since its first refusal (an acknowledgement forgets it, so a
    later refusal starts again from the base and from zero elapsed time)."""

    first_at: float
    count: int
    delay_s: float  # the delay before the next resend: the "previous" of the draw after it
    slow: bool


def after_refusal(
    policy: ResendPolicy,
    history: Refusals | None,
    connected: bool,
    now: float,
    uniform: Uniform,
) -> Refusals | None:
    """The history after one more refusal at `now`, or None for a DISCONNECTED whose next
    resend would fall outside its window (it is lost now rather than kept to no purpose)."""
    if history is None:
        first, count, previous = now, 1, None
    else:
        first, count, previous = history.first_at, history.count + 1, history.delay_s
    slow = connected and now - first >= policy.slow_after_s
    delay = slow_delay(policy, uniform) if slow else next_delay(policy, previous, uniform)
    if not connected and now + delay > first + policy.disconnected_window_s:
        return None
    return Refusals(first_at=first, count=count, delay_s=delay, slow=slow)


# --- the set ----------------------------------------------------------------------------------


@attrs.define
class RetryEntry(Generic[N]):
    """One refused notification. `out` while its resend is in flight; `superseded` once a newer
    notification for its key arrived while it was out."""

    key: Key
    session: Key
    note: N
    connected: bool
    refusals: Refusals
    due: float
    window_end: float  # math.inf for a CONNECTED
    seq: int = 0  # tells this schedule apart from the stale heap rows of earlier ones
    out: bool = False
    superseded: bool = False


Scheduled = Literal["scheduled", "window", "full"]
Cancelled = Literal["removed", "marked", "absent"]

# Stale heap rows are skipped when met and dropped in bulk past this slack, as in permits.py.
_COMPACT_SLACK = 64


@attrs.define
class RetrySet(Generic[N]):
    """Refused notifications waiting for a resend, ordered by when each is due."""

    policy: ResendPolicy
    uniform: Uniform
    capacity: int
    _entries: dict[Key, RetryEntry[N]] = attrs.field(init=False, factory=dict)
    # session -> its keys, in the order they were refused (a dict used as an ordered set)
    _by_session: dict[Key, dict[Key, None]] = attrs.field(init=False, factory=dict)
    # (due, order, seq, key): `order` breaks ties first in first out, and is negative for an
    # entry put back at the head after a failed resend.
    _due: list[tuple[float, int, int, Key]] = attrs.field(init=False, factory=list)
    _windows: list[tuple[float, int, Key]] = attrs.field(init=False, factory=list)
    _seq: Iterator[int] = attrs.field(init=False, factory=lambda: itertools.count(1))
    _order: int = attrs.field(init=False, default=0)
    _head_order: int = attrs.field(init=False, default=0)
    _slow: int = attrs.field(init=False, default=0)
    _out: int = attrs.field(init=False, default=0)

    # -- reading --

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Key) -> bool:
        return key in self._entries

    def get(self, key: Key) -> RetryEntry[N] | None:
        return self._entries.get(key)

    @property
    def slow_keys(self) -> int:
        return self._slow

    @property
    def out(self) -> int:
        return self._out

    @property
    def waiting(self) -> int:
        return len(self._entries) - self._out

    def entries(self) -> list[RetryEntry[N]]:
        return list(self._entries.values())

    def next_deadline(self) -> float | None:
        """When the next waiting entry falls due or a waiting DISCONNECTED's window ends."""
        if not self._due and not self._windows:
            return None  # nothing waits; the common case, asked after every drain
        self._clean_heads()
        times = [heap[0][0] for heap in (self._due, self._windows) if heap]
        finite = [t for t in times if math.isfinite(t)]
        return min(finite) if finite else None

    # -- refusals --

    def refuse(
        self, key: Key, session: Key, note: N, connected: bool, now: float
    ) -> tuple[Scheduled, Refusals | None]:
        """The server refused `note` (first time, or its resend that was out). Schedules the next
        resend and returns its history, or says why there is none ("window": a DISCONNECTED's
        next resend would fall after its window; "full": the set is at capacity). Either way an
        out entry for `key` leaves the out state."""
        entry = self._entries.get(key)
        if entry is None and len(self._entries) >= self.capacity:
            return "full", None
        history = None if entry is None else entry.refusals
        refusals = after_refusal(self.policy, history, connected, now, self.uniform)
        if refusals is None:
            if entry is not None:
                self.remove(key)
            return "window", None
        if entry is None:
            window = math.inf if connected else now + self.policy.disconnected_window_s
            entry = RetryEntry(key, session, note, connected, refusals, now, window)
            self._entries[key] = entry
            self._by_session.setdefault(session, {})[key] = None
            self._slow += refusals.slow
        else:
            self._set_out(entry, False)
            self._slow += refusals.slow - entry.refusals.slow
            entry.note, entry.refusals = note, refusals
        self._order += 1
        self._schedule(entry, now + refusals.delay_s, self._order)
        return "scheduled", refusals

    def requeue(self, key: Key) -> None:
        """A resend that failed (an RPC error) waits at the head, due at once: the same rule as a
        failed send in the store. Its refusal history is kept."""
        entry = self._entries[key]
        self._set_out(entry, False)
        self._head_order -= 1
        self._schedule(entry, -math.inf, self._head_order)

    # -- taking resends --

    def pop_due(self, now: float, *, ignore_due: bool = False) -> RetryEntry[N] | None:
        """The waiting entry due first, marked out; None when none is due (or, with
        `ignore_due`, when none waits at all: the planned-stop flush sends them regardless)."""
        self._clean_heads()
        if not self._due or (not ignore_due and self._due[0][0] > now):
            return None
        _, _, _, key = heapq.heappop(self._due)
        entry = self._entries[key]
        self._set_out(entry, True)
        return entry

    def expire(self, now: float) -> list[RetryEntry[N]]:
        """Remove and return the waiting DISCONNECTED entries whose window has ended."""
        expired: list[RetryEntry[N]] = []
        while self._windows and self._windows[0][0] <= now:
            _, seq, key = heapq.heappop(self._windows)
            entry = self._entries.get(key)
            if entry is None or entry.out or entry.seq != seq:
                continue
            self.remove(key)
            expired.append(entry)
        return expired

    def take_waiting(self, keep: Callable[[RetryEntry[N]], bool]) -> list[RetryEntry[N]]:
        """Remove and return every waiting entry for which `keep` is false (the planned stop
        drops the waiting CONNECTED resends and keeps the DISCONNECTED ones)."""
        gone = [e for e in self._entries.values() if not e.out and not keep(e)]
        for entry in gone:
            self.remove(entry.key)
        return gone

    # -- ending entries --

    def cancel(self, key: Key) -> Cancelled:
        """A newer notification for `key`: a waiting entry is removed, an out one is marked."""
        entry = self._entries.get(key)
        if entry is None:
            return "absent"
        if entry.out:
            entry.superseded = True
            return "marked"
        self.remove(key)
        return "removed"

    def cancel_session(self, session: Key) -> tuple[list[RetryEntry[N]], int]:
        """Every entry of one session (all its stream home ids): the waiting ones are removed
        and returned, the out ones marked (their number is returned)."""
        removed: list[RetryEntry[N]] = []
        marked = 0
        for key in list(self._by_session.get(session, ())):
            entry = self._entries[key]
            if entry.out:
                entry.superseded = True
                marked += 1
            else:
                self.remove(key)
                removed.append(entry)
        return removed, marked

    def remove(self, key: Key) -> RetryEntry[N]:
        """Forget `key` (acknowledged, superseded, expired, lost). Its heap rows go stale."""
        entry = self._entries.pop(key)
        self._slow -= entry.refusals.slow
        self._set_out(entry, False)
        keys = self._by_session[entry.session]
        del keys[key]
        if not keys:
            del self._by_session[entry.session]
        entry.seq = -1
        self._compact()
        return entry

    # -- internals --

    def _schedule(self, entry: RetryEntry[N], due: float, order: int) -> None:
        entry.seq = next(self._seq)
        entry.due = due
        heapq.heappush(self._due, (due, order, entry.seq, entry.key))
        if math.isfinite(entry.window_end):
            heapq.heappush(self._windows, (entry.window_end, entry.seq, entry.key))
        self._compact()

    def _set_out(self, entry: RetryEntry[N], out: bool) -> None:
        if entry.out != out:
            self._out += 1 if out else -1
            entry.out = out

    def _valid(self, seq: int, key: Key) -> bool:
        entry = self._entries.get(key)
        return entry is not None and not entry.out and entry.seq == seq

    def _clean_heads(self) -> None:
        while self._due and not self._valid(self._due[0][2], self._due[0][3]):
            heapq.heappop(self._due)
        while self._windows and not self._valid(self._windows[0][1], self._windows[0][2]):
            heapq.heappop(self._windows)

    def _compact(self) -> None:
        live = len(self._entries)
        if len(self._due) > 2 * live + _COMPACT_SLACK:
            self._due = [row for row in self._due if self._valid(row[2], row[3])]
            heapq.heapify(self._due)
        if len(self._windows) > 2 * live + _COMPACT_SLACK:
            self._windows = [row for row in self._windows if self._valid(row[1], row[2])]
            heapq.heapify(self._windows)
