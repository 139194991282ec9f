"""Admission of agent calls under a storm: how many Registers (or Subscribes) the node takes on
at once, and when a refused one should come back (issue 19; seed 003, "Admission and scale":
"a bound on pending registrations ... tells every refused client when to come back
(`grpc-retry-pushback-ms`), so a herd spreads by the gateway's measure rather than by each
daemon's doubling back-off"). No I/O, no clock, no randomness of its own: time and the random
draw are passed in.

Theory of operation, one `Admission` per kind of call (Register, Subscribe), per node:

- `pending` counts the calls admitted and not yet finished (`admit` ... `finish`).
- The drain rate is measured: completions over the last `RATE_WINDOW_S`, never below
  `MIN_RATE_PER_S` (a node that has finished nothing yet is assumed to have that rate, not an
  infinite one). A window in which nothing was refused measured what arrived, not what the
  node can do: it may raise the rate, never lower it. Only a window with refusals (the node at
  its bound) can lower it: else a herd told slots at a low rate comes back at that rate, the
  node finishes exactly that, and the rate never rises again (measured, issue 19: a node at
  half its CPU admitting 100 a second for a minute).
- A call is admitted while `pending` is below the bound: what the node finishes within
  `drain_target_s` at the measured rate, at least `FLOOR` (so a cold node still starts) and at
  most `pending_max` (the operator's hard bound).
- A refused call gets a slot: the refusals are queued, in the order they came, behind the
  calls already pending, one every `1 / rate` seconds; the hint is the time until the slot,
  drawn uniformly within the slot (`draw` in [0, 1)), so a herd refused together comes back
  spread at the rate the node drains, and no two refusals of one burst are told the same time.
  The queue (`horizon`) never reaches back before `now` and is capped at `hint_max_ms`: past
  it, hints are drawn over the cap's last quarter, not all given the cap.
"""

from __future__ import annotations

import collections
import enum
from typing import Final

import attrs

__all__ = [
    "FLOOR",
    "HINT_MIN_MS",
    "MIN_RATE_PER_S",
    "RATE_WINDOW_S",
    "Admission",
    "AdmissionLimits",
    "Admitted",
    "Call",
    "Refused",
]

# A node that has measured nothing still admits this many at once: the upstream permits'
# default (48 Registers in flight) with room for the Subscribes that follow them.
FLOOR: Final = 64
# The slowest drain rate assumed, calls per second, until (and unless) more is measured. A herd
# refused before anything is measured is slotted at this rate and comes back at it, so a low one
# costs the most: the node idles (a 10,000-agent wave on 2 cores: at 100, 49% of a core for a
# minute; at 200, 65 to 85%; at 300, 85 to 90%, about 3 ms of CPU a join once the herd is set
# up; at 10, hints of 45 to 60 s: issue 19). A high one costs a second refusal of the calls
# that come back early, on a connection already up, and a later slot.
MIN_RATE_PER_S: Final = 300.0
# How far back completions count towards the drain rate.
RATE_WINDOW_S: Final = 5.0
# Seed 003: the shortest hint of a bound refusal ("250 ms to 2 s").
HINT_MIN_MS: Final = 250
# The hints past the cap are drawn over its last quarter.
_CAP_SPREAD: Final = 0.25


class Call(enum.Enum):
    REGISTER = "register"
    SUBSCRIBE = "subscribe"


@attrs.frozen
class AdmissionLimits:
    """`pending_max`: the hard bound on calls in flight; `drain_target_s`: admit what the node
    finishes within this at its measured rate; `hint_max_ms`: the longest hint given."""

    pending_max: int
    drain_target_s: float
    hint_max_ms: int

    def __attrs_post_init__(self) -> None:
        if self.pending_max < 1:
            raise ValueError(f"pending_max {self.pending_max} is below 1")
        if self.drain_target_s <= 0:
            raise ValueError(f"drain_target_s {self.drain_target_s} is not positive")
        if self.hint_max_ms < HINT_MIN_MS:
            raise ValueError(f"hint_max_ms {self.hint_max_ms} is below {HINT_MIN_MS}")


@attrs.frozen
class Admitted:
    pending: int  # in flight, this one included


@attrs.frozen
class Refused:
    hint_ms: int
    pending: int
    bound: int


class Admission:
    """One kind of call's admission on one node (module doc)."""

    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        self.pending = 0
        self._done: collections.deque[float] = collections.deque()
        self._first_at: float | None = None  # when the rate started to be measured
        self._horizon = 0.0  # when the last refused call's slot ends
        self._rate = MIN_RATE_PER_S  # the rate believed (module doc)
        self._refused_at: float | None = None  # the last refusal

    def rate(self, now: float) -> float:
        """The drain rate believed now: completions per second over the last RATE_WINDOW_S,
        lowered only by a window with refusals (module doc)."""
        self._forget(now)
        if self._first_at is None:
            return self._rate
        span = min(RATE_WINDOW_S, max(now - self._first_at, 1.0))
        measured = max(MIN_RATE_PER_S, len(self._done) / span)
        at_bound = self._refused_at is not None and self._refused_at > now - RATE_WINDOW_S
        self._rate = measured if at_bound else max(self._rate, measured)
        return self._rate

    def bound(self, now: float) -> int:
        by_rate = int(self.rate(now) * self.limits.drain_target_s)
        return min(self.limits.pending_max, max(FLOOR, by_rate))

    def admit(self, now: float, draw: float) -> Admitted | Refused:
        bound = self.bound(now)
        if self.pending < bound:
            self.pending += 1
            return Admitted(self.pending)
        self._refused_at = now
        return Refused(self._hint_ms(now, draw), self.pending, bound)

    def finish(self, now: float) -> None:
        """An admitted call ended, however it ended."""
        if self.pending <= 0:
            raise ValueError("finish without an admitted call")
        self.pending -= 1
        if self._first_at is None:
            self._first_at = now
        self._done.append(now)
        self._forget(now)

    def _forget(self, now: float) -> None:
        while self._done and self._done[0] <= now - RATE_WINDOW_S:
            self._done.popleft()

    def _hint_ms(self, now: float, draw: float) -> int:
        rate = self.rate(now)
        slot = 1.0 / rate
        cap = self.limits.hint_max_ms / 1000.0
        # Behind what is pending (at least one slot's wait beyond it), then behind the refusals
        # already told.
        start = max(self._horizon, now + self.pending * slot)
        if start + slot - now > cap:
            seconds = cap * (1.0 - _CAP_SPREAD * draw)
        else:
            self._horizon = start + slot
            seconds = start - now + slot * draw
        return max(HINT_MIN_MS, min(self.limits.hint_max_ms, round(seconds * 1000.0)))
