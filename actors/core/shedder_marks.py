"""The memory shedder's policy: the marks it resolves at boot, and the hysteresis and retry rules
it follows while the node runs (seed, "Node-wide memory load shedding", "When a suspend or
resume fails"; SPEC_INDEX MS-02..MS-10). No I/O, no clock: time is passed in.

Theory of operation.

- `resolve_marks` turns the settings and the memory limit into two byte marks or refuses. A
  mark is bytes when set as bytes, else a fraction of the limit. Setting only one byte mark
  derives the other from it with the ratio of the default fractions (0.65 / 0.75); a derived
  high mark that would reach the limit is put halfway between the low mark and the limit. A
  fraction set explicitly is never replaced by a derivation. `None` means a mark needs the limit
  and the limit is unknown (the shedder then runs inactive); `MarksRefused` means the marks could
  never work: not positive, at or above the limit, or the low mark not below the high mark.
- `Shedder.sample` is the hysteresis: shedding starts when memory in use is at or above the high
  mark and ends when it is at or below the low mark; a sample between the marks changes nothing.
  The sample (RssAnon) keeps what Python freed until a collection and a trim give it back, so
  mem_reclaim runs passes while the node sheds (actors/core/reclaim.py, `RunPass("shedding")`).
- The listeners' state is level-triggered: `reconcile` compares each agent listener's published
  state with the one shedding wants (`suspended` while shedding, else `running`) and asks for a
  `Command` for each one that differs and has no command in flight. So a listener that restarts
  mid-shedding is suspended again, and a shedder that restarts finds suspended listeners shed.
- `result` takes each command's answer. A listener that did not move is a failed attempt: counted,
  kept in the failing set of its action, and logged the first time, then at most once a minute
  while the failure lasts, then once when every listener of the action has moved.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Final, Literal

import attrs

from actors.core import Count, LogLine

__all__ = [
    "DEFAULT_HIGH_FRACTION",
    "DEFAULT_LOW_FRACTION",
    "FAILURE_LOG_INTERVAL_S",
    "RESUME",
    "RUNNING",
    "SUSPEND",
    "SUSPENDED",
    "SUSPENSIONS",
    "TRANSITION_FAILURES",
    "Action",
    "Command",
    "Effect",
    "Mark",
    "MarkSettings",
    "Marks",
    "MarksRefused",
    "Shedder",
    "resolve_marks",
]

# Seed, "Node-wide memory load shedding": the marks default to 0.75 and 0.65 of the limit, and
# the ratio of the two derives an unset mark from a byte mark.
DEFAULT_HIGH_FRACTION: Final = 0.75
DEFAULT_LOW_FRACTION: Final = 0.65
# Seed, "When a suspend or resume fails": after the first failure line, at most one a minute.
FAILURE_LOG_INTERVAL_S: Final = 60.0

SUSPEND: Final = "suspend"
RESUME: Final = "resume"
Action = Literal["suspend", "resume"]
# A listener's published state (gateway/listeners/listener_actor.py uses the same words).
RUNNING: Final = "running"
SUSPENDED: Final = "suspended"

SUSPENSIONS: Final = "yuzu_gw_memory_shedding_suspensions_total"
TRANSITION_FAILURES: Final = "yuzu_gw_memory_shedding_transition_failures_total"


# -- marks ----------------------------------------------------------------------------------------


@attrs.frozen
class MarkSettings:
    """The marks as configured; None is unset (a fraction then takes its default)."""

    high_water_fraction: float | None = None
    low_water_fraction: float | None = None
    high_water_bytes: int | None = None
    low_water_bytes: int | None = None


@attrs.frozen
class Mark:
    """A resolved mark and how it was reached, for the start-up line and refusals."""

    bytes: int
    how: str
    derived: bool = False  # from the other mark, not from its own setting

    def describe(self) -> str:
        return f"{self.how} = {self.bytes} bytes"


@attrs.frozen
class Marks:
    high: Mark
    low: Mark


class MarksRefused(Exception):
    """The marks cannot work; `detail` names the settings and their values."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def resolve_marks(
    settings: MarkSettings, limit: int | None, limit_source: str = ""
) -> Marks | None:
    """The marks in bytes, or None when one needs the unknown limit; raises `MarksRefused`."""
    _refuse_not_positive(settings)
    high = _high(settings, limit)
    low = _low(settings, limit)
    if high is None or low is None:
        _refuse_fraction_order(settings)
        return None
    for name, mark in (("high", high), ("low", low)):
        if mark.bytes <= 0:
            raise MarksRefused(f"the {name}-water mark ({mark.describe()}) is not positive")
    if limit is not None:
        # A mark set by its own setting first: one derived from it is only too high because
        # that one is, and the refusal should name what the operator wrote.
        ordered = sorted((("high", high), ("low", low)), key=lambda pair: pair[1].derived)
        for name, mark in ordered:
            if mark.bytes >= limit:
                raise MarksRefused(
                    f"the {name}-water mark ({mark.describe()}) is at or above the memory limit"
                    f" {limit} bytes ({limit_source}): it could never act before the OOM killer"
                )
    if low.bytes >= high.bytes:
        raise MarksRefused(
            f"the low-water mark ({low.describe()}) is not below the high-water mark"
            f" ({high.describe()})"
        )
    return Marks(high, low)


def _refuse_not_positive(settings: MarkSettings) -> None:
    for name, value in attrs.asdict(settings).items():
        if value is not None and value <= 0:
            raise MarksRefused(f"{name} {value} is not positive")


def _refuse_fraction_order(settings: MarkSettings) -> None:
    """With the limit unknown, two fraction marks can still be seen to be the wrong way round."""
    if settings.high_water_bytes is None and settings.low_water_bytes is None:
        high = _fraction(settings.high_water_fraction, DEFAULT_HIGH_FRACTION)
        low = _fraction(settings.low_water_fraction, DEFAULT_LOW_FRACTION)
        if low >= high:
            raise MarksRefused(f"low_water_fraction {low} is not below high_water_fraction {high}")


def _fraction(value: float | None, default: float) -> float:
    return default if value is None else value


def _of_limit(name: str, fraction: float, limit: int | None) -> Mark | None:
    if limit is None:
        return None
    return Mark(int(fraction * limit), f"{name} {fraction} of the limit")


def _high(settings: MarkSettings, limit: int | None) -> Mark | None:
    if settings.high_water_bytes is not None:
        return Mark(settings.high_water_bytes, f"high_water_bytes {settings.high_water_bytes}")
    low = settings.low_water_bytes
    if low is not None and settings.high_water_fraction is None:
        derived = int(low * DEFAULT_HIGH_FRACTION / DEFAULT_LOW_FRACTION)
        if limit is not None and derived >= limit:
            return Mark(
                (low + limit) // 2,
                f"halfway between low_water_bytes {low} and the memory limit {limit}",
                derived=True,
            )
        return Mark(derived, f"low_water_bytes {low} x 0.75/0.65", derived=True)
    fraction = _fraction(settings.high_water_fraction, DEFAULT_HIGH_FRACTION)
    return _of_limit("high_water_fraction", fraction, limit)


def _low(settings: MarkSettings, limit: int | None) -> Mark | None:
    if settings.low_water_bytes is not None:
        return Mark(settings.low_water_bytes, f"low_water_bytes {settings.low_water_bytes}")
    high = settings.high_water_bytes
    if high is not None and settings.low_water_fraction is None:
        derived = int(high * DEFAULT_LOW_FRACTION / DEFAULT_HIGH_FRACTION)
        return Mark(derived, f"high_water_bytes {high} x 0.65/0.75", derived=True)
    fraction = _fraction(settings.low_water_fraction, DEFAULT_LOW_FRACTION)
    return _of_limit("low_water_fraction", fraction, limit)


# -- hysteresis and retries -----------------------------------------------------------------------


@attrs.frozen
class Command:
    """Ask listener `listener` to `action` (suspend or resume)."""

    listener: str
    action: Action


Effect = LogLine | Count | Command


@attrs.define
class _Failure:
    """One action's failure episode: from the first failed attempt until every listener of the
    action has moved (or shedding turned the other way)."""

    since: float
    logged_at: float
    attempts: int = 0
    errors: dict[str, str] = attrs.Factory(dict)  # listener -> why its last attempt failed
    names: set[str] = attrs.Factory(set)  # every listener that failed in the episode


def _listing(errors: Mapping[str, str]) -> str:
    return ", ".join(f"{name} ({errors[name]})" for name in sorted(errors))


@attrs.define
class Shedder:
    """Hysteresis between `high` and `low` (bytes) and the failure rules of the transitions.
    `interval_ms` is the sampling interval, named in the failure lines ("retrying every N ms")."""

    high: int
    low: int
    interval_ms: int
    shedding: bool = False
    _failures: dict[Action, _Failure] = attrs.field(init=False, factory=dict)

    @property
    def action(self) -> Action:
        """What the listeners are being moved by now."""
        return SUSPEND if self.shedding else RESUME

    @property
    def target(self) -> str:
        """The state the agent listeners should be in now."""
        return SUSPENDED if self.shedding else RUNNING

    def failing(self, action: Action) -> int:
        """Listeners whose last `action` attempt failed and that have not moved since."""
        failure = self._failures.get(action)
        return 0 if failure is None else len(failure.errors)

    def sample(self, used: int, now: float) -> list[Effect]:
        """One sample of memory in use, in bytes."""
        if not self.shedding and used >= self.high:
            self.shedding = True
            return [
                Count(SUSPENSIONS),
                LogLine(
                    "warning",
                    f"gateway memory shedding: {used} bytes in use reached the high-water mark"
                    f" {self.high}; suspending the agent listener(s), new agent connections are"
                    " refused until memory falls to the low-water mark",
                ),
                *self._abandon(RESUME),
            ]
        if self.shedding and used <= self.low:
            self.shedding = False
            return [
                LogLine(
                    "info",
                    f"gateway memory shedding: {used} bytes in use is at or below the low-water"
                    f" mark {self.low}; resuming the agent listener(s)",
                ),
                *self._abandon(SUSPEND),
            ]
        return []

    def reconcile(
        self, states: Mapping[str, str | None], in_flight: Collection[str]
    ) -> list[Effect]:
        """`states`: each agent listener's published state, None while it is not up."""
        effects: list[Effect] = []
        for name, state in states.items():
            if state is None:
                continue
            if state == self.target:
                effects.extend(self._moved(name, self.action))
            elif name not in in_flight:
                effects.append(Command(name, self.action))
        return effects

    def result(
        self, name: str, action: Action, state: str | None, error: str | None, now: float
    ) -> list[Effect]:
        """The answer to a `Command`: the listener's state after it (None: no answer) and, when
        it did not move, why (`eaddrinuse`, `emfile`, `timeout`...)."""
        if action != self.action:
            return []  # asked before shedding turned; the next reconcile asks again
        if state == self.target:
            return self._moved(name, action)
        return self._failed(name, action, error or "unchanged", now)

    def _failed(self, name: str, action: Action, error: str, now: float) -> list[Effect]:
        effects: list[Effect] = [Count(TRANSITION_FAILURES, (("action", action),))]
        failure = self._failures.get(action)
        if failure is None:
            failure = self._failures[action] = _Failure(since=now, logged_at=now)
            failure.attempts, failure.errors[name] = 1, error
            failure.names.add(name)
            effects.append(
                LogLine(
                    "warning",
                    f"could not {action} agent listener(s) {_listing(failure.errors)}; retrying"
                    f" every {self.interval_ms} ms",
                )
            )
            return effects
        failure.attempts += 1
        failure.errors[name] = error
        failure.names.add(name)
        if now - failure.logged_at >= FAILURE_LOG_INTERVAL_S:
            failure.logged_at = now
            effects.append(
                LogLine(
                    "warning",
                    f"could not {action} agent listener(s) {_listing(failure.errors)} for"
                    f" {now - failure.since:.0f} s ({failure.attempts} failed attempt(s));"
                    f" retrying every {self.interval_ms} ms",
                )
            )
        return effects

    def _moved(self, name: str, action: Action) -> list[Effect]:
        failure = self._failures.get(action)
        if failure is None or name not in failure.errors:
            return []
        del failure.errors[name]
        if failure.errors:
            return []
        del self._failures[action]
        done = "suspended" if action == SUSPEND else "resumed"
        return [
            LogLine(
                "info",
                f"agent listener(s) {', '.join(sorted(failure.names))} {done} after"
                f" {failure.attempts} failed attempt(s)",
            )
        ]

    def _abandon(self, action: Action) -> list[Effect]:
        """Shedding turned: the listeners no longer need to `action`; end its episode."""
        failure = self._failures.pop(action, None)
        if failure is None:
            return []
        return [
            LogLine(
                "info",
                f"stopped trying to {action} agent listener(s) {', '.join(sorted(failure.names))}"
                f" after {failure.attempts} failed attempt(s): shedding turned",
            )
        ]
