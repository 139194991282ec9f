"""The `memory_shedding` and `mem_reclaim` keys: strict shedder settings that refuse boot as
`{yuzu_gw,memory_shedding}`, marks resolved at boot against the memory limit, and reclaim
settings that only ever warn (SPEC_INDEX C43, C44, B21, B22, MS-07, MS-08, MR-05, L44, L49)."""

from __future__ import annotations

import logging

import attrs
import pytest

from actors.core import LogLine
from gateway.config.config import Config
from gateway.config.keys import SCHEMA, listeners
from gateway.config.keys.shedder import (
    MEM_RECLAIM,
    MEMORY_SHEDDING,
    MemReclaim,
    SheddingPlan,
    resolve_memory_shedding,
    shared_by,
)
from gateway.config.memory_limit import MemoryLimit
from gateway.config.refusal import BootRefused, log_refusal
from gateway.config.resolve import resolve_section
from gateway.config.terms import parse_term

GIB = 1024**3
# Without the listeners' refusal of a gateway with no agent listener, and without the memory
# check: each test runs the check itself with a limit of its choosing.
KEYS_ONLY = attrs.evolve(
    SCHEMA, checks=tuple(c for c in SCHEMA.checks if c is listeners.listener_port_overrides)
)


def config(text: str) -> Config:
    return resolve_section(KEYS_ONLY, parse_term(f"[{text}]."), {}, "test.config")


def limit_of(limit: MemoryLimit | None, lines: list[LogLine] | None = None) -> object:
    def read() -> tuple[MemoryLimit | None, list[LogLine]]:
        return limit, list(lines or [])

    return read


HOST_16 = limit_of(MemoryLimit(16 * GIB, "host"))


def checked(text: str, read: object = HOST_16) -> Config:
    return resolve_memory_shedding(config(text), {}, read)  # type: ignore[arg-type]


def refused(text: str, read: object = HOST_16) -> BootRefused:
    with pytest.raises(BootRefused) as caught:
        checked(text, read)
    assert caught.value.term == "{yuzu_gw,memory_shedding}"
    return caught.value


# -- memory_shedding ------------------------------------------------------------------------------


def test_nodes_sharing_a_host_take_fractions_of_their_share_and_bytes_as_written() -> None:
    # Four nodes of one host (rel/yuzu_gw start --nodes 4) share the 16 GiB: each sheds at
    # 0.75 of 4 GiB, so all four at their high marks stay under the limit.
    shared = shared_by(checked("")[MEMORY_SHEDDING], 4)
    assert shared.plan is not None and shared.plan.marks is not None
    assert shared.plan.nodes == 4 and shared.plan.limit == MemoryLimit(16 * GIB, "host")
    assert shared.plan.marks.high.bytes == 3 * GIB
    assert shared.plan.marks.low.bytes == int(0.65 * 4 * GIB)
    # A byte mark is per node already: nothing moves. One node: nothing moves either.
    written = checked("{memory_shedding, #{high_water_bytes => 2000000000}}")[MEMORY_SHEDDING]
    assert shared_by(written, 4) == written
    alone = checked("")[MEMORY_SHEDDING]
    assert shared_by(alone, 1) == alone


def test_defaults_resolve_to_fractions_of_the_limit() -> None:
    settings = checked("")[MEMORY_SHEDDING]
    assert settings.enabled and settings.interval_ms == 1000
    assert settings.plan is not None and settings.plan.marks is not None
    assert settings.plan.limit == MemoryLimit(16 * GIB, "host")
    assert settings.plan.marks.high.bytes == 12 * GIB
    assert settings.plan.marks.low.bytes == int(0.65 * 16 * GIB)


def test_the_real_schema_resolves_the_plan_at_boot() -> None:
    schema = attrs.evolve(
        SCHEMA, checks=tuple(c for c in SCHEMA.checks if c is not listeners.listeners_route_agents)
    )
    settings = resolve_section(schema, [], {})[MEMORY_SHEDDING]
    assert settings.plan is not None  # the limit is read once, by the schema's check


def test_all_entries_are_read() -> None:
    settings = checked(
        "{memory_shedding, #{enabled => true, interval_ms => 250, high_water_fraction => 0.8,"
        " low_water_fraction => 0.7, high_water_bytes => undefined, low_water_bytes => undefined}}"
    )[MEMORY_SHEDDING]
    assert settings.interval_ms == 250
    assert settings.plan is not None and settings.plan.marks is not None
    assert settings.plan.marks.high.bytes == int(0.8 * 16 * GIB)


def test_disabled_reads_no_limit() -> None:
    def never() -> tuple[MemoryLimit | None, list[LogLine]]:
        raise AssertionError("the limit is read only with shedding enabled")

    settings = checked("{memory_shedding, #{enabled => false, high_water_bytes => 0}}", never)[
        MEMORY_SHEDDING
    ]
    assert not settings.enabled and settings.plan is None


def test_no_limit_with_a_fraction_is_inactive_not_refused() -> None:
    settings = checked("", limit_of(None))[MEMORY_SHEDDING]
    assert settings.plan == SheddingPlan(None, None)


def test_no_limit_with_byte_marks_runs() -> None:
    plan = checked("{memory_shedding, #{high_water_bytes => 1000000}}", limit_of(None))[
        MEMORY_SHEDDING
    ].plan
    assert plan is not None and plan.marks is not None
    assert (plan.marks.high.bytes, plan.marks.low.bytes) == (1000000, 866666)


def test_unreadable_cgroup_lines_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    checked("", limit_of(MemoryLimit(GIB, "host"), [LogLine("warning", "cgroup file skipped")]))
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("yuzu_gw.memory_shedder", "cgroup file skipped")
    ]


@pytest.mark.parametrize(
    ("entries", "detail"),
    [
        (
            "high_water_bytes => 17179869184",
            "the high-water mark (high_water_bytes 17179869184 = 17179869184 bytes) is at or"
            " above the memory limit 17179869184 bytes (host): it could never act before the"
            " OOM killer",
        ),
        ("low_water_fraction => 0", "low_water_fraction 0.0 is not positive"),
        ("high_water_bytes => -5", "high_water_bytes -5 is not positive"),
        (
            "high_water_fraction => 0.5, low_water_fraction => 0.6",
            "the low-water mark (low_water_fraction 0.6 of the limit = 10307921510 bytes) is not"
            " below the high-water mark (high_water_fraction 0.5 of the limit = 8589934592"
            " bytes)",
        ),
    ],
)
def test_marks_that_cannot_work_refuse(
    entries: str, detail: str, caplog: pytest.LogCaptureFixture
) -> None:
    refusal = refused(f"{{memory_shedding, #{{{entries}}}}}")
    assert refusal.detail == detail
    log_refusal(refusal)
    assert caplog.records[-1].getMessage() == (
        f"Refusing to start: {{yuzu_gw,memory_shedding}}: {detail}"
    )


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        ("[]", "memory_shedding is a list, not a map #{enabled, interval_ms,"),
        (
            "#{enabled => false, bogus => 1}",
            "memory_shedding has keys outside its closed set: bogus",
        ),
        ("#{hihg_water_bytes => 1}", "memory_shedding has keys outside its closed set: hihg_"),
        ('#{"enabled" => true}', "memory_shedding has keys outside its closed set: a list"),
        ("#{enabled => 1}", "memory_shedding enabled is 1, not true or false"),
        ("#{interval_ms => 5}", "memory_shedding interval_ms is 5, not an integer from 10 to"),
        ("#{interval_ms => 1.0}", "memory_shedding interval_ms is a float, not an integer"),
        ('#{high_water_fraction => "0.7"}', "memory_shedding high_water_fraction is a list,"),
        ("#{low_water_fraction => true}", "memory_shedding low_water_fraction is true, not a"),
        ("#{high_water_bytes => 1.0e9}", "memory_shedding high_water_bytes is a float, not an"),
        ("#{low_water_bytes => infinity}", "memory_shedding low_water_bytes is infinity, not"),
    ],
)
def test_a_malformed_map_refuses_even_disabled(value: str, detail: str) -> None:
    with pytest.raises(BootRefused) as caught:
        config(f"{{memory_shedding, {value}}}")
    assert caught.value.term == "{yuzu_gw,memory_shedding}"
    assert caught.value.detail.startswith(detail)


def test_an_integer_fraction_is_a_number() -> None:
    refusal = refused("{memory_shedding, #{high_water_fraction => 1}}")
    assert "high_water_fraction 1.0 of the limit" in refusal.detail


# -- mem_reclaim ----------------------------------------------------------------------------------


def reclaim_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "yuzu_gw.mem_reclaim" and r.levelno == logging.WARNING
    ]


def test_reclaim_defaults() -> None:
    assert checked("")[MEM_RECLAIM] == MemReclaim(
        interval_ms=10_000, followup_ms=30_000, trim_interval_ms=300_000
    )


def test_reclaim_entries_are_read_and_gc_min_bytes_is_accepted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = checked(
        "{mem_reclaim, #{interval_ms => 500, gc_min_bytes => 1048576, followup_ms => 2000,"
        " trim_interval_ms => 0}}"
    )[MEM_RECLAIM]
    assert settings == MemReclaim(interval_ms=500, followup_ms=2000, trim_interval_ms=0)
    assert reclaim_warnings(caplog) == []


def test_bad_reclaim_entries_warn_and_take_their_defaults(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = checked(
        '{mem_reclaim, #{interval_ms => 5, followup_ms => <<"x">>, bogus => 1,'
        " trim_interval_ms => 600000}}"
    )[MEM_RECLAIM]
    assert (settings.interval_ms, settings.followup_ms, settings.trim_interval_ms) == (
        10_000,
        30_000,
        600_000,
    )
    assert sorted(reclaim_warnings(caplog)) == [
        "gateway memory reclaim: ignoring followup_ms => a binary: not an integer from 1000 to"
        " 3600000; the default 30000 is used",
        "gateway memory reclaim: ignoring interval_ms => 5: not an integer from 100 to 3600000;"
        " the default 10000 is used",
        "gateway memory reclaim: ignoring the unknown key bogus",
    ]


def test_a_reclaim_value_that_is_not_a_map_never_refuses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = checked("{mem_reclaim, 42}")[MEM_RECLAIM]
    assert (settings.interval_ms, settings.followup_ms) == (10_000, 30_000)
    assert reclaim_warnings(caplog) == [
        "gateway memory reclaim: ignoring mem_reclaim 42: not a map; the defaults are used"
    ]
