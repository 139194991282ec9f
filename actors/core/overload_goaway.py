"""The overload go-away of an agent listener: who is sent away, when, and when their
connections are closed (seed 001: "OVERLOADED every 5 seconds while its inbound connections are
at the high watermark, for as many members at random as take it back to the low watermark ...
closes their connections after a 5 second grace, which also covers a member that does not speak
the protocol"; issue 7). No I/O, no clock, no randomness of its own: time and the random source
are passed in, and every method returns effects for the listener actor to carry out.

Theory of operation.

- `Watermarks.of(high, low)` resolves the two marks. The low one defaults to 15% below the high
  one (seed 001: "the low watermark now follows the high one at 15% below it unless set"); a low
  mark at or above the high one is refused (`WatermarksRefused`), since the policy would then
  send connections away without ever bringing the count below the mark that triggers it.
- `OverloadGoAway.tick(now, live, rng)` is called with the listener's established connections.
  Those already sent away are leaving and are not counted. At most once every `TICK_S`, if the
  connections counted are at or above the high mark, exactly `counted - low` of them, distinct
  and chosen uniformly at random among those counted, are sent away (`SendAway`): afterwards
  exactly `low` are counted. Between the marks nothing is sent (the hysteresis): the count has
  to climb back to the high mark first.
- A connection sent away is closed (`Close`, once) when `GRACE_S` has passed since, if it is
  still there: the client was told to go and did not (or does not read GOAWAY debug data).
  One that closed by itself is forgotten at the next tick.
- `wakeup_in(now)` says when the next tick has something to do (the next check, or the
  earliest grace to end), so the actor needs one timer.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Set
from typing import Final

import attrs

__all__ = [
    "GRACE_S",
    "LOW_PERCENT",
    "TICK_S",
    "Close",
    "ConnKey",
    "Effect",
    "OverloadGoAway",
    "SendAway",
    "Watermarks",
    "WatermarksRefused",
]

# Seed 001: the go-away is sent "every 5 seconds while its inbound connections are at the high
# watermark".
TICK_S: Final = 5.0
# Seed 001: "closes their connections after a 5 second grace".
GRACE_S: Final = 5.0
# Seed 001: the low watermark follows the high one "at 15% below it unless set".
LOW_PERCENT: Final = 85

ConnKey = Hashable


class WatermarksRefused(ValueError):
    """The marks cannot work; the message names both values."""


@attrs.frozen
class Watermarks:
    """Connection counts: sending away starts at `high` and brings the count to `low`."""

    high: int
    low: int

    @classmethod
    def of(cls, high: int, low: int | None = None) -> Watermarks:
        """The marks, the low one defaulting to 15% below the high one (rounded down)."""
        if high < 1:
            raise WatermarksRefused(f"the high watermark {high} is below 1")
        if low is None:
            low = high * LOW_PERCENT // 100
        if low < 0:
            raise WatermarksRefused(f"the low watermark {low} is negative")
        if low >= high:
            raise WatermarksRefused(
                f"the low watermark {low} is not below the high watermark {high}"
            )
        return cls(high, low)


@attrs.frozen
class SendAway:
    """Send each connection the graceful GOAWAY `overloaded` and end its streams with a retry
    time; `counted` is how many connections were counted at the high mark (for the log line)."""

    connections: tuple[ConnKey, ...]
    counted: int


@attrs.frozen
class Close:
    """The grace of these connections has passed: close them."""

    connections: tuple[ConnKey, ...]


Effect = SendAway | Close


@attrs.define
class OverloadGoAway:
    """The policy of one listener (module doc). No clock inside: every method takes `now`."""

    marks: Watermarks
    # Connections sent away and still there -> when their grace ends (inf once closed).
    _leaving: dict[ConnKey, float] = attrs.field(init=False, factory=dict)
    _next_check: float = attrs.field(init=False, default=-math.inf)

    @property
    def leaving(self) -> int:
        """Connections sent away that have not gone yet."""
        return len(self._leaving)

    def tick(self, now: float, live: Set[ConnKey], rng: random.Random) -> list[Effect]:
        """`live`: the listener's established connections (set-like, so membership is O(1))."""
        effects: list[Effect] = []
        leaving = self._leaving
        for key in [key for key in leaving if key not in live]:
            del leaving[key]
        due = tuple(key for key, ends in leaving.items() if ends <= now)
        if due:
            for key in due:
                leaving[key] = math.inf
            effects.append(Close(due))
        if now >= self._next_check:
            self._next_check = now + TICK_S
            counted = len(live) - len(leaving)
            if counted >= self.marks.high:
                candidates = [key for key in live if key not in leaving]
                chosen = tuple(rng.sample(candidates, counted - self.marks.low))
                ends = now + GRACE_S
                for key in chosen:
                    leaving[key] = ends
                effects.append(SendAway(chosen, counted))
        return effects

    def wakeup_in(self, now: float) -> float:
        """Seconds until `tick` next has something to do (never negative)."""
        soonest = min(self._next_check, *self._leaving.values(), math.inf)
        return max(0.0, soonest - now)
