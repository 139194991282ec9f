"""When to give memory back after the agent count drops (seed, "Giving memory back after a
drop", "Which builds trim"; SPEC_INDEX K62, MR-01..MR-04). No I/O, no clock.

The actor reads the agent count every `interval_ms` and hands it to `observe`, which answers
with at most one thing to do:

- `RunPass("drop")` when the count has fallen from its peak by a quarter of the peak AND by at
  least 1,000 agents. The peak then restarts from the current count, so a further drop of the
  same size is needed for another pass;
- `RunPass("followup")` at the first reading `followup_s` after a drop pass: the count falls
  before the closed connections' buffers and objects have gone;
- `RunPass("shedding")` while the memory shedder sheds, at the first reading and then whenever
  no pass has run for `followup_s`. The shedder samples RssAnon, and what Python frees does not
  lower it by itself (garbage in reference cycles until a full collection, glibc's free pages
  until malloc_trim; measured, issue 21 §2), so without these passes a node whose memory in use
  fell under the low-water mark could stay shedding for as long as its agent count held;
- `RunTrim()` (give the C allocator's free pages back, no collection) every `trim_interval_s`
  (None: never). A pass trims too, so it restarts that interval.

One thing runs at a time: between an effect and `finished()` the count is still read (the peak
follows it) but nothing new starts; what came due meanwhile runs at the next reading.
"""

from __future__ import annotations

from typing import Final, Literal

import attrs

__all__ = ["MIN_DROP", "Effect", "Reclaim", "ReclaimPolicy", "RunPass", "RunTrim", "dropped_enough"]

# Seed, "Giving memory back after a drop": a pass needs a fall of a quarter of the peak (the
# comparison is `4 * drop >= peak`, exact in integers) and of at least 1,000 agents.
MIN_DROP: Final = 1000
DROP_DENOMINATOR: Final = 4


def dropped_enough(peak: int, agents: int) -> bool:
    drop = peak - agents
    return drop >= MIN_DROP and DROP_DENOMINATOR * drop >= peak


@attrs.frozen
class ReclaimPolicy:
    followup_s: float
    trim_interval_s: float | None  # None: no periodic trim


@attrs.frozen
class RunPass:
    """Collect garbage, then trim; log one line. `agents` is the count that triggered it."""

    kind: Literal["drop", "followup", "shedding"]
    agents: int


@attrs.frozen
class RunTrim:
    """Trim the C allocator only (no collection, no notice line)."""


Effect = RunPass | RunTrim


def _trim_after(policy: ReclaimPolicy, now: float) -> float | None:
    return None if policy.trim_interval_s is None else now + policy.trim_interval_s


@attrs.define
class Reclaim:
    policy: ReclaimPolicy
    next_trim_at: float | None
    peak: int = 0
    followup_at: float | None = None
    last_pass_at: float | None = None
    busy: bool = False

    @classmethod
    def started(cls, policy: ReclaimPolicy, now: float) -> Reclaim:
        """The first periodic trim is due one interval after the start."""
        return cls(policy, _trim_after(policy, now))

    def observe(self, agents: int, now: float, shedding: bool = False) -> list[Effect]:
        """`shedding`: the memory shedder's published verdict at this reading."""
        self.peak = max(self.peak, agents)
        if self.busy:
            return []
        if dropped_enough(self.peak, agents):
            self.peak = agents
            self.followup_at = now + self.policy.followup_s
            return self._start(RunPass("drop", agents), now)
        if self.followup_at is not None and now >= self.followup_at:
            self.followup_at = None
            return self._start(RunPass("followup", agents), now)
        if shedding and (
            self.last_pass_at is None or now - self.last_pass_at >= self.policy.followup_s
        ):
            return self._start(RunPass("shedding", agents), now)
        if self.next_trim_at is not None and now >= self.next_trim_at:
            return self._start(RunTrim(), now)
        return []

    def _start(self, effect: Effect, now: float) -> list[Effect]:
        self.busy = True
        if isinstance(effect, RunPass):
            self.last_pass_at = now
        self.next_trim_at = _trim_after(self.policy, now)
        return [effect]

    def finished(self) -> None:
        """The pass or trim the last effect started is over."""
        self.busy = False
