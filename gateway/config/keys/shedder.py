"""Keys of the memory shedder (`memory_shedding`) and of memory reclaim (`mem_reclaim`), and the
boot check that resolves the shedder's marks against the memory limit.

`memory_shedding` is strict (seed, "Marks that cannot work refuse to start"; SPEC_INDEX B21,
B22): an unknown key or a value of the wrong type refuses boot, and with shedding enabled the
check in `CHECKS` reads the memory limit (gateway/config/memory_limit.py) and refuses marks
that could never work, all as `Refusing to start: {yuzu_gw,memory_shedding}: ...`. The
resolved marks go back into the config (`MemoryShedding.plan`), so the limit is read once, at boot.

`mem_reclaim` never stops the gateway (seed, "Giving memory back after a drop"; MR-05): each bad
entry is logged `gateway memory reclaim: ignoring ...` and its default used. No `YUZU_GW_*`
variable maps to either key. docs/memory-shedding.md has every entry, default and log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from actors.core import LogLine
from actors.core.shedder_marks import (
    DEFAULT_HIGH_FRACTION,
    DEFAULT_LOW_FRACTION,
    Marks,
    MarkSettings,
    MarksRefused,
    resolve_marks,
)
from actors.effects import log_line
from actors.memory.api import RECLAIM_LOGGER, SHEDDER_LOGGER
from gateway.config.converters import BadValue, Boolean, IntRange
from gateway.config.memory_limit import MemoryLimit, read_memory_limit
from gateway.config.redact import shown_value
from gateway.config.refusal import BootRefused
from gateway.config.schema import Key
from gateway.config.section import Check
from gateway.config.terms import Atom, Term

if TYPE_CHECKING:
    from gateway.config.config import Config

__all__ = [
    "CHECKS",
    "KEYS",
    "MEMORY_SHEDDING",
    "MEM_RECLAIM",
    "MemReclaim",
    "MemoryShedding",
    "SheddingPlan",
    "plan_of",
    "resolve_memory_shedding",
    "shared_by",
]

AREA = "memory"
_UNDEFINED = Atom("undefined")

# -- memory_shedding ------------------------------------------------------------------------------

# The manual gives no default or range for interval_ms (SPEC_INDEX X5): one read of
# /proc/self/status a second costs nothing, and a backstop need not react faster.
_INTERVAL_MS = IntRange(10, 60_000)


@attrs.frozen
class SheddingPlan:
    """What the boot check resolved: the limit it read (None: none readable) and the marks
    (None: a mark is a fraction of that unknown limit, so the shedder runs inactive). `nodes`:
    the nodes of a host that share the limit, whose fractions are of 1/`nodes` of it."""

    limit: MemoryLimit | None
    marks: Marks | None
    nodes: int = 1


@attrs.frozen
class MemoryShedding:
    enabled: bool = True
    interval_ms: int = 1000
    marks: MarkSettings = attrs.field(factory=MarkSettings)
    # Set by the boot check when shedding is enabled; None before it runs or when disabled.
    plan: SheddingPlan | None = None


def _refuse(detail: str) -> BootRefused:
    # The seed's term: `Refusing to start: {yuzu_gw, memory_shedding}: ...`.
    return BootRefused("yuzu_gw", detail, context=("memory_shedding",))


def _number(term: Term) -> float | None:
    if isinstance(term, bool) or not isinstance(term, int | float):
        return None
    return float(term)


@attrs.frozen
class MemorySheddingMap:
    """The converter of `memory_shedding`: raises `BootRefused` itself (the seed's term)."""

    expected: str = (
        "a map #{enabled, interval_ms, high_water_fraction, low_water_fraction,"
        " high_water_bytes, low_water_bytes}"
    )

    def __call__(self, term: Term) -> MemoryShedding:
        if not isinstance(term, dict):
            raise _refuse(f"memory_shedding is {shown_value(term)}, not {self.expected}")
        fields = attrs.fields_dict(MarkSettings).keys() | {"enabled", "interval_ms"}
        unknown = [k for k in term if not (isinstance(k, Atom) and k.name in fields)]
        if unknown:
            names = ", ".join(sorted(shown_value(k) for k in unknown))
            raise _refuse(f"memory_shedding has keys outside its closed set: {names}")
        read = {k.name: v for k, v in term.items() if isinstance(k, Atom)}
        return MemoryShedding(
            enabled=_field(read, "enabled", Boolean(), True),
            interval_ms=_field(read, "interval_ms", _INTERVAL_MS, 1000),
            marks=MarkSettings(
                high_water_fraction=_fraction(read, "high_water_fraction"),
                low_water_fraction=_fraction(read, "low_water_fraction"),
                high_water_bytes=_bytes(read, "high_water_bytes"),
                low_water_bytes=_bytes(read, "low_water_bytes"),
            ),
        )


def _field(
    read: Mapping[str, Term], name: str, convert: Callable[[Term], Any], default: Any
) -> Any:
    if name not in read:
        return default
    try:
        return convert(read[name])
    except BadValue as bad:
        raise _refuse(
            f"memory_shedding {name} is {shown_value(read[name])}, not {bad.expected}"
        ) from None


def _fraction(read: Mapping[str, Term], name: str) -> float | None:
    # Positivity is the marks check's (it refuses only with shedding enabled); here the type.
    if read.get(name, _UNDEFINED) == _UNDEFINED:
        return None
    value = _number(read[name])
    if value is None:
        raise _refuse(f"memory_shedding {name} is {shown_value(read[name])}, not a number")
    return value


def _bytes(read: Mapping[str, Term], name: str) -> int | None:
    if read.get(name, _UNDEFINED) == _UNDEFINED:
        return None
    term = read[name]
    if isinstance(term, bool) or not isinstance(term, int):
        raise _refuse(f"memory_shedding {name} is {shown_value(term)}, not an integer of bytes")
    return term


MEMORY_SHEDDING: Key[MemoryShedding] = Key(
    name="memory_shedding",
    default={},
    convert=MemorySheddingMap(),
    read_when="boot (the memory limit is read once, then; a change needs a restart)",
    doc="The node-wide memory shedder: at or above the high-water mark the agent listeners are"
    " suspended (new agent connections refused), at or below the low-water mark resumed."
    f" Entries: enabled (true), interval_ms (1000), high_water_fraction ({DEFAULT_HIGH_FRACTION}),"
    f" low_water_fraction ({DEFAULT_LOW_FRACTION}), high_water_bytes, low_water_bytes (unset)."
    " docs/memory-shedding.md.",
    area=AREA,
    default_doc="`#{}` (enabled, marks 0.75 / 0.65 of the memory limit, sampled every 1000 ms)",
    bad_doc="refuse boot `{yuzu_gw,memory_shedding}`: an unknown key, a wrong type, or marks"
    " that cannot work (not positive, at or above the memory limit, low not below high)",
    our_choices=("default", "valid values"),
)


def plan_of(
    settings: MemoryShedding,
    read_limit: Callable[[], tuple[MemoryLimit | None, list[LogLine]]] = read_memory_limit,
) -> SheddingPlan:
    """The plan the boot check resolved, or resolve it now (a config built without the check);
    raises `BootRefused` for marks that cannot work."""
    if settings.plan is not None:
        return settings.plan
    limit, warnings = read_limit()
    _log(SHEDDER_LOGGER, warnings)
    try:
        marks = resolve_marks(
            settings.marks,
            None if limit is None else limit.limit_bytes,
            "" if limit is None else limit.source,
        )
    except MarksRefused as refused:
        raise _refuse(refused.detail) from None
    return SheddingPlan(limit, marks)


def shared_by(settings: MemoryShedding, nodes: int) -> MemoryShedding:
    """Node k of `nodes` on one host (gateway/node/multinode.py): all of them share the limit the
    boot check read, and each compares only its own memory with its marks, so marks that are
    both fractions are taken of the node's share, limit / `nodes`, and N nodes at their high
    marks stay under the limit as one node does. A byte mark is the operator's, per node, and
    stands as written. Raises `BootRefused` as the boot check does."""
    plan, marks = settings.plan, settings.marks
    per_node_bytes = marks.high_water_bytes is not None or marks.low_water_bytes is not None
    if nodes < 2 or plan is None or plan.limit is None or per_node_bytes:
        return settings
    share = plan.limit.limit_bytes // nodes
    try:
        resolved = resolve_marks(marks, share, f"{plan.limit.source}, 1/{nodes} a node")
    except MarksRefused as refused:
        raise _refuse(refused.detail) from None
    return attrs.evolve(settings, plan=attrs.evolve(plan, marks=resolved, nodes=nodes))


# -- mem_reclaim ----------------------------------------------------------------------------------


@attrs.frozen
class MemReclaim:
    interval_ms: int = 10_000
    followup_ms: int = 30_000
    trim_interval_ms: int = 300_000  # 0: no periodic trim
    # The `ignoring ...` lines for bad entries, logged once by the boot check.
    notes: tuple[LogLine, ...] = ()


# Entry -> its converter (defaults: `MemReclaim`; the manual states none). gc_min_bytes is the
# Erlang gateway's per-process threshold; Python has one heap and a collection covers all of it,
# so it is accepted and has no effect.
_RECLAIM_ENTRIES: dict[str, IntRange] = {
    "interval_ms": IntRange(100, 3_600_000),
    "followup_ms": IntRange(1000, 3_600_000),
    "trim_interval_ms": IntRange(0, 86_400_000, note="0: no periodic trim"),
}
_RECLAIM_NO_EFFECT = "gc_min_bytes"


def _ignoring(text: str) -> LogLine:
    return LogLine("warning", f"gateway memory reclaim: ignoring {text}")


@attrs.frozen
class MemReclaimMap:
    """The converter of `mem_reclaim`: never raises; each bad entry becomes a note."""

    expected: str = "a map #{interval_ms, gc_min_bytes, followup_ms, trim_interval_ms}"

    def __call__(self, term: Term) -> MemReclaim:
        if not isinstance(term, dict):
            return MemReclaim(
                notes=(
                    _ignoring(f"mem_reclaim {shown_value(term)}: not a map; the defaults are used"),
                )
            )
        defaults = MemReclaim()
        values: dict[str, int] = {}
        notes: list[LogLine] = []
        for key, value in term.items():
            name = key.name if isinstance(key, Atom) else None
            if name == _RECLAIM_NO_EFFECT:
                continue
            convert = _RECLAIM_ENTRIES.get(name or "")
            if name is None or convert is None:
                notes.append(_ignoring(f"the unknown key {shown_value(key)}"))
                continue
            try:
                values[name] = convert(value)
            except BadValue:
                default = getattr(defaults, name)
                notes.append(
                    _ignoring(
                        f"{name} => {shown_value(value)}: not {convert.expected}; the default"
                        f" {default} is used"
                    )
                )
        return MemReclaim(**values, notes=tuple(notes))


MEM_RECLAIM: Key[MemReclaim] = Key(
    name="mem_reclaim",
    default={},
    convert=MemReclaimMap(),
    read_when="once at start",
    doc="Giving memory back after the agent count drops: gc.collect() and malloc_trim(0) when"
    " the count has fallen by a quarter of its peak and by 1,000. Entries: interval_ms (10000),"
    " followup_ms (30000), trim_interval_ms (300000; 0 = none), gc_min_bytes (no effect here)."
    " docs/memory-shedding.md.",
    area=AREA,
    default_doc="`#{}` (every entry at its default)",
    bad_doc="WARN `gateway memory reclaim: ignoring ...` per bad entry, its default used; never"
    " refuses",
    our_choices=("default", "valid values"),
)


# -- the boot check -------------------------------------------------------------------------------


def _log(logger: str, lines: list[LogLine] | tuple[LogLine, ...]) -> None:
    target = logging.getLogger(logger)
    for line in lines:
        log_line(target, line)


def resolve_memory_shedding(
    config: Config,
    env: Mapping[str, str],
    read_limit: Callable[[], tuple[MemoryLimit | None, list[LogLine]]] = read_memory_limit,
) -> Config:
    """Log mem_reclaim's notes; with shedding enabled, read the memory limit, resolve the marks
    (refusing those that cannot work) and keep the plan in the config."""
    _log(RECLAIM_LOGGER, config[MEM_RECLAIM].notes)
    settings = config[MEMORY_SHEDDING]
    if not settings.enabled:
        return config
    resolved = attrs.evolve(settings, plan=plan_of(settings, read_limit))
    return config.with_value(MEMORY_SHEDDING, resolved, config.source_of(MEMORY_SHEDDING))


KEYS: tuple[Key[Any], ...] = (MEMORY_SHEDDING, MEM_RECLAIM)

CHECKS: tuple[Check, ...] = (resolve_memory_shedding,)
