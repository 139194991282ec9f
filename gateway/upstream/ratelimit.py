"""A log-line limiter: the first at once, then at most one per interval. No clock inside."""

from __future__ import annotations

import attrs

__all__ = ["Every"]


@attrs.define
class Every:
    interval_s: float
    last: float | None = None
    suppressed: int = 0

    def allow(self, now: float) -> bool:
        """True when a line may be written at `now`; otherwise it is counted as suppressed."""
        if self.last is None or now - self.last >= self.interval_s:
            self.last = now
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self) -> int:
        count, self.suppressed = self.suppressed, 0
        return count

    def reset(self) -> None:
        """Forget the last line: the next one is written at once (the condition cleared)."""
        self.last = None
        self.suppressed = 0
