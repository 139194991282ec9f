"""Restart intensity: OTP's rule that a supervisor may restart its children at most
`intensity` times within any `period` seconds; one more means something is wrong that
restarting does not fix, so the supervisor gives up and its own supervisor decides."""

from __future__ import annotations

from collections import deque

import attrs


@attrs.define
class RestartIntensity:
    intensity: int
    period: float
    restarts: deque[float] = attrs.field(factory=deque)

    def add_restart(self, now: float) -> bool:
        """Record a restart at `now`; False when it exceeds the intensity."""
        self.restarts.append(now)
        while self.restarts and now - self.restarts[0] >= self.period:
            self.restarts.popleft()
        return len(self.restarts) <= self.intensity

    def in_window(self, now: float) -> int:
        return sum(1 for t in self.restarts if now - t < self.period)
