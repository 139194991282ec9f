"""Capped doubling: the one backoff shape the upstream path uses.

The breaker's reset timeout (10 s doubling per failed probe up to 30 s) and the re-ask after a
local too_many_streams refusal (10 ms doubling up to 100 ms) are both "base, times two per step,
never above the cap". No jitter here: the seed gives none for either (the channel redial's 20 %
jitter belongs to the channel, not to these).
"""

from __future__ import annotations

import attrs

__all__ = ["TOO_MANY_STREAMS", "Doubling"]

# 2**64 times any sane base is past every cap; stopping there keeps the float maths finite for an
# attempt counter that has run away.
_MAX_EXPONENT = 64


def _positive(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


@attrs.frozen
class Doubling:
    """`base_s * 2**attempt`, capped at `cap_s` (a cap below the base is lifted to the base)."""

    base_s: float = attrs.field(validator=_positive)
    cap_s: float = attrs.field(validator=_positive)

    @property
    def effective_cap_s(self) -> float:
        return max(self.base_s, self.cap_s)

    def delay(self, attempt: int) -> float:
        """The wait before retry number `attempt` (0 is the first retry)."""
        if attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {attempt}")
        exponent = min(attempt, _MAX_EXPONENT)
        return min(self.base_s * 2.0**exponent, self.effective_cap_s)

    def after(self, current_s: float) -> float:
        """The step after `current_s`: doubled, within [base, cap]."""
        return min(max(current_s * 2.0, self.base_s), self.effective_cap_s)


# Seed, "How the gateway sizes its upstream calls": a call refused locally with too_many_streams
# "hands its permit back, waits 10 ms (doubling up to 100 ms), and asks for a permit again". Short,
# because the refusal is the gateway's own and the limit frees as soon as one stream ends.
TOO_MANY_STREAMS = Doubling(base_s=0.010, cap_s=0.100)
