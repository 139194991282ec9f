"""How long the router waits for the answers to one SendCommand (seed: "Subscribe Stream Proxy").

Rules:

- A request's own `timeout_seconds` is used when it is an integer above zero, clamped to at most
  `MAX_TIMEOUT_S` (3600).
- Missing (0 on the wire), negative or not an integer: the configured default,
  `default_command_timeout_s`. That key is read only then, once per such command, so a changed
  value applies to the next command.
- A configured default outside 1..3600, or not an integer, is replaced by `FALLBACK_TIMEOUT_S`
  (300), with at most one warning a minute per router (a restarted router is a new limiter, so
  it can warn again at once, as the seed says).

No clock inside: `resolve` takes `now` for the warning limiter only.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from actors.core.warn_limit import WarnLimiter

__all__ = [
    "FALLBACK_TIMEOUT_S",
    "INVALID_DEFAULT_LOG",
    "MAX_TIMEOUT_S",
    "MIN_TIMEOUT_S",
    "TIMEOUT_WARN_INTERVAL_S",
    "CommandTimeouts",
    "Resolved",
    "clamp_timeout",
    "valid_default",
]

# Seed, "Subscribe Stream Proxy": a command's timeout is clamped to 1..3600 s, and the default
# is 300 s when default_command_timeout_s is unset or invalid.
MIN_TIMEOUT_S = 1
MAX_TIMEOUT_S = 3600
FALLBACK_TIMEOUT_S = 300
# Seed: an invalid default logs at most one warning per minute per router process.
TIMEOUT_WARN_INTERVAL_S = 60.0
# The value is not quoted: a mistyped setting could hold anything.
INVALID_DEFAULT_LOG = (
    "default_command_timeout_s is not an integer from 1 to 3600; commands without a timeout"
    " use 300 s"
)
_WARN_KIND = "invalid_default_command_timeout_s"


def _integer(value: object) -> int | None:
    # bool is an int in Python, and never a timeout.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def clamp_timeout(requested: object) -> int | None:
    """The request's own timeout, clamped; None when the configured default applies."""
    seconds = _integer(requested)
    if seconds is None or seconds < MIN_TIMEOUT_S:
        return None
    return min(seconds, MAX_TIMEOUT_S)


def valid_default(configured: object) -> int | None:
    """The configured default when it is an integer from 1 to 3600, else None."""
    seconds = _integer(configured)
    if seconds is None or not MIN_TIMEOUT_S <= seconds <= MAX_TIMEOUT_S:
        return None
    return seconds


@attrs.frozen
class Resolved:
    """`seconds` to wait; `warning` is the line to log (with the limiter's suffix) or None."""

    seconds: int
    warning: str | None = None


@attrs.define
class CommandTimeouts:
    """One per router: `read_default` reads default_command_timeout_s as configured now."""

    read_default: Callable[[], object]
    _limiter: WarnLimiter = attrs.field(
        init=False, factory=lambda: WarnLimiter(TIMEOUT_WARN_INTERVAL_S)
    )

    def resolve(self, requested: object, now: float) -> Resolved:
        own = clamp_timeout(requested)
        if own is not None:
            return Resolved(own)
        configured = valid_default(self.read_default())
        if configured is not None:
            return Resolved(configured)
        suffix = self._limiter.admit(_WARN_KIND, now)
        return Resolved(
            FALLBACK_TIMEOUT_S, None if suffix is None else INVALID_DEFAULT_LOG + suffix
        )
