"""At most one warning line per kind per interval, with a count of what was held back.

Seed ("Known limits", the warn_limited entry): one line per second per kind; the next line
logged after the interval ends with "(N similar line(s) suppressed since the last)"; the first
line of a kind is never suppressed. A refused-registration storm must not flood the log, but
the operator still learns how many there were.

No clock inside: `admit` takes `now`.
"""

from __future__ import annotations

from collections.abc import Hashable

import attrs

__all__ = ["SUPPRESSED_SUFFIX", "WarnLimiter"]

SUPPRESSED_SUFFIX = " ({n} similar line(s) suppressed since the last)"

# Kinds are a closed, small set in practice (a method times a status class); past this many the
# oldest entries are forgotten so a bug that mints kinds cannot grow the map for ever.
_MAX_KINDS = 1024


@attrs.define
class WarnLimiter:
    interval_s: float = 1.0
    # kind -> (when the last line of the kind was let through, lines held back since)
    _kinds: dict[Hashable, tuple[float, int]] = attrs.field(init=False, factory=dict)

    def admit(self, kind: Hashable, now: float) -> str | None:
        """None to hold the line back; else the suffix to append ("" when none was held)."""
        last = self._kinds.get(kind)
        if last is not None and now - last[0] < self.interval_s:
            self._kinds[kind] = (last[0], last[1] + 1)
            return None
        suppressed = last[1] if last is not None else 0
        if last is None and len(self._kinds) >= _MAX_KINDS:
            del self._kinds[next(iter(self._kinds))]
        self._kinds[kind] = (now, 0)
        return SUPPRESSED_SUFFIX.format(n=suppressed) if suppressed else ""
