"""Carrying out the effects every core shares: a `LogLine` to log and a `Count` to add.

The cores (actors/core/) return these as data; each actor shell hands the ones it does not
handle itself to `carry_out`, so the mapping of a core's level to a logging level and of a
family name to a counter is written once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final, Protocol

from prometheus_client import Counter

from actors.core import Count, LogLine

__all__ = ["LEVELS", "Counts", "carry_out", "count_into", "log_line"]

LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class Counts(Protocol):
    """A metrics module's side of `Count`: it knows which counter a family names."""

    def count(self, effect: Count) -> None: ...


def log_line(log: logging.Logger, line: LogLine) -> None:
    # The text is an argument, never the format: a core's text may hold a `%`.
    log.log(LEVELS[line.level], "%s", line.text)


def count_into(counters: Mapping[str, Counter], effect: Count) -> None:
    """Add `effect` to the counter its family names; labels by name, in any order."""
    counter = counters[effect.family]
    if effect.labels:
        counter.labels(**dict(effect.labels)).inc(effect.n)
    else:
        counter.inc(effect.n)


def carry_out(effect: object, log: logging.Logger, counts: Counts | None = None) -> bool:
    """Log a `LogLine`, count a `Count` (when `counts` is given); False for any other effect,
    which the caller handles."""
    if isinstance(effect, LogLine):
        log_line(log, effect)
        return True
    if isinstance(effect, Count) and counts is not None:
        counts.count(effect)
        return True
    return False
