"""The one-line-per-second-per-kind limiter (seed "Known limits", warn_limited)."""

from __future__ import annotations

from actors.core.warn_limit import WarnLimiter


def test_first_line_passes_then_one_per_interval_with_the_suppressed_count() -> None:
    limiter = WarnLimiter(interval_s=1.0)
    assert limiter.admit("a", 0.0) == ""
    assert limiter.admit("a", 0.2) is None
    assert limiter.admit("a", 0.9) is None
    assert limiter.admit("b", 0.9) == ""  # kinds are independent
    assert limiter.admit("a", 1.0) == " (2 similar line(s) suppressed since the last)"
    assert limiter.admit("a", 2.5) == ""


def test_kinds_are_bounded() -> None:
    limiter = WarnLimiter()
    for i in range(5000):
        limiter.admit(i, 0.0)
    assert len(limiter._kinds) <= 1024
