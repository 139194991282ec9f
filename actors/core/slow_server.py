"""The slow-server duty cycle: the core of the `slow_server` sampler
(actors/upstream/slow_sampler.py).

Rules of this file (seed: "What happens when the server restarts > Slow server"; SPEC_INDEX M18,
K58, CB-17). "Slow" is defined from how often the lanes to the server are full, not from a
latency figure:

* A lane is saturated at an instant when work waits on it or would be refused. There are three
  (`SlowLane`): `permits`, a live Register or inventory report waits for a permit (a waiting
  replay does not count: it waits behind live registrations by design); `notify`, all 10
  stream-status notification slots are held; `guardian`, all 50 Guardian forward slots are held.
  Each lane's owner publishes whether it is saturated; the sampler only reads that.
* Backpressure is present at an instant when at least one lane is saturated. The sampler looks
  every 100 ms, and each sample's state is credited for the time until the next sample, but one
  step credits at most 1 s: a stalled loop (a long collection, a suspended VM) credits a second,
  not the whole gap; the rest of the gap counts as not saturated.
* The window is 60 one-second buckets, the current (partial) one included. The duty cycle is the
  saturated time in the window over 60 s, so until the gateway has run for a minute the missing
  seconds count as not saturated and the figure can only read low.
* Slow: a duty cycle of 0.5 or more (exactly 0.5 counts). Time is kept in whole milliseconds so
  that comparison is exact, whatever the sampling steps add up to.

It is a sampled estimate with a resolution of the sampling interval: a state that begins and ends
between two samples is missed. It changes nothing the gateway does and is not a readiness input.
No clock inside: `sample` takes `now` (seconds, monotonic).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Final

import attrs

__all__ = [
    "BUCKETS",
    "BUCKET_MS",
    "MAX_CREDIT_MS",
    "SAMPLE_INTERVAL_S",
    "SLOW_DUTY",
    "WINDOW_MS",
    "LaneFlag",
    "Reading",
    "SlowLane",
    "SlowServer",
]

# K58: the lanes are sampled every 100 ms, the resolution of the estimate.
SAMPLE_INTERVAL_S: Final = 0.1
# K58: a window of 60 one-second buckets ("the last 60 s").
BUCKETS: Final = 60
BUCKET_MS: Final = 1000
WINDOW_MS: Final = BUCKETS * BUCKET_MS
# K58: one step credits at most 1 s, so a stalled VM does not credit a minute.
MAX_CREDIT_MS: Final = 1000
# M18, CB-17: yuzu_gw_upstream_slow is 1 at a duty cycle of 0.5 or more.
SLOW_DUTY: Final = 0.5


class SlowLane(enum.Enum):
    """A lane whose saturation is backpressure. Its owner publishes a bool under this key."""

    PERMITS = "permits"
    NOTIFY = "notify"
    GUARDIAN = "guardian"


@attrs.define
class LaneFlag:
    """Whether one lane is saturated, as its owner last published it. The owner calls `update`
    after whatever may change it; `publish` (a write to the owner's table) runs only on a change,
    so the hot paths pay a comparison, and the sampler reads the table without a message."""

    lane: SlowLane
    publish: Callable[[SlowLane, bool], None]
    saturated: bool = False

    def update(self, saturated: bool) -> None:
        if saturated != self.saturated:
            self.saturated = saturated
            self.publish(self.lane, saturated)


@attrs.frozen
class Reading:
    """The window after a sample: the duty cycle (0 to 1) and whether the server is slow."""

    duty_cycle: float
    slow: bool


def _to_ms(now: float) -> int:
    # Rounded, not truncated: a time of whole milliseconds in float (4.35) must not lose one.
    return round(now * 1000)


@attrs.define
class SlowServer:
    """Backpressure samples folded into 60 one-second buckets. No clock inside."""

    # Saturated milliseconds per bucket, a ring indexed by bucket number modulo BUCKETS.
    _buckets: list[int] = attrs.field(init=False, factory=lambda: [0] * BUCKETS)
    _total_ms: int = attrs.field(init=False, default=0)
    # The bucket number (ms // BUCKET_MS) of the newest bucket; None before the first sample.
    _head: int | None = attrs.field(init=False, default=None)
    _last_ms: int = attrs.field(init=False, default=0)
    _last_saturated: bool = attrs.field(init=False, default=False)

    @property
    def duty_cycle(self) -> float:
        return self._total_ms / WINDOW_MS

    @property
    def slow(self) -> bool:
        return self._total_ms >= SLOW_DUTY * WINDOW_MS

    def reading(self) -> Reading:
        return Reading(self.duty_cycle, self.slow)

    def sample(self, now: float, saturated: bool) -> Reading:
        """Credit the previous sample's state up to `now` (at most MAX_CREDIT_MS), move the
        window to `now`, and remember `saturated` for the next step. A clock that went back
        is read as no time passing."""
        now_ms = _to_ms(now)
        if self._head is None:
            self._head = now_ms // BUCKET_MS
        else:
            now_ms = max(now_ms, self._last_ms)
            self._advance(now_ms // BUCKET_MS)
            if self._last_saturated:
                self._credit(self._last_ms, min(now_ms, self._last_ms + MAX_CREDIT_MS))
        self._last_ms = now_ms
        self._last_saturated = saturated
        return self.reading()

    def _advance(self, head: int) -> None:
        """Make `head` the newest bucket: the buckets it passes are emptied for reuse."""
        assert self._head is not None
        steps = head - self._head
        if steps <= 0:
            return
        if steps >= BUCKETS:
            self._buckets = [0] * BUCKETS
            self._total_ms = 0
        else:
            for number in range(self._head + 1, head + 1):
                slot = number % BUCKETS
                self._total_ms -= self._buckets[slot]
                self._buckets[slot] = 0
        self._head = head

    def _credit(self, start_ms: int, end_ms: int) -> None:
        """Add [start_ms, end_ms) as saturated, split at bucket edges; time that fell out of
        the window already is not counted."""
        assert self._head is not None
        oldest = self._head - BUCKETS + 1
        while start_ms < end_ms:
            number = start_ms // BUCKET_MS
            stop = min(end_ms, (number + 1) * BUCKET_MS)
            if number >= oldest:
                self._buckets[number % BUCKETS] += stop - start_ms
                self._total_ms += stop - start_ms
            start_ms = stop
