"""Functional cores of the gateway's actors: pure policy, no I/O, no clock.

Each module here holds one policy of the specification (the circuit breaker, the upstream permit
pool, ...). Time is passed in as `now` (seconds, monotonic) and every method returns effects
(small frozen records) for the actor around it to carry out; see ARCHITECTURE.md, "Design inside
an actor: functional core, imperative shell".

This package module holds only the vocabulary the cores share: a log line to emit and the
range check every "bad value -> WARN naming the key, default used" setting goes through. It
imports no submodule, so `from actors.core import LogLine` inside a core cannot cycle.
"""

from __future__ import annotations

import re
from typing import Literal

import attrs

__all__ = ["Level", "LogLine", "range_checked"]

Level = Literal["debug", "info", "warning", "error"]

# A raw value printed in a warning is cut to this many characters: an environment variable can
# hold anything, and a warning must not become a way to push arbitrary text into the log.
_ECHO_MAX = 64
# ASCII digits only: str.isdigit() also accepts superscripts that int() then rejects.
_DECIMAL = re.compile(r"[+-]?[0-9]+")


@attrs.frozen
class LogLine:
    """A line for the actor to log. `text` is the operator-facing text, quoted from the
    specification where the specification quotes it."""

    level: Level
    text: str


@attrs.frozen
class Count:
    """Add `n` to the counter `family` with `labels` (pairs, in the family's label order)."""

    family: str
    labels: tuple[tuple[str, str], ...] = ()
    n: int = 1


def _echo(raw: object) -> str:
    shown = repr(raw) if isinstance(raw, str) else str(raw)
    return shown if len(shown) <= _ECHO_MAX else shown[: _ECHO_MAX - 3] + "..."


def range_checked(
    name: str, raw: object, default: int, lo: int, hi: int, *, where: str = ""
) -> tuple[int, LogLine | None]:
    """`raw` as an integer in `lo..hi`, or `default` and a WARN naming `name`.

    Accepts an int (a sys.config value) or a decimal string (an environment variable). A bool is
    refused although Python counts it as an int: `true` is not a number of milliseconds. `None`
    means unset and gives the default without a warning. `where` prefixes the warning with the
    part of the gateway that reads the setting (e.g. "Circuit breaker tuning: ").
    """
    if raw is None:
        return default, None
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and _DECIMAL.fullmatch(raw.strip()):
        value = int(raw.strip())
    if value is not None and lo <= value <= hi:
        return value, None
    text = (
        f"{where}{name} is {_echo(raw)}, not an integer from {lo} to {hi}; "
        f"the default {default} is used instead"
    )
    return default, LogLine("warning", text)
