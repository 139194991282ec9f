"""Memory reclaim: when a pass runs (the core), and what the actor does and logs for it (seed,
"Giving memory back after a drop", "Which builds trim"; SPEC_INDEX K62, MR-01..MR-04)."""

from __future__ import annotations

import asyncio
import logging
import platform
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.reclaim import (
    Reclaim,
    ReclaimPolicy,
    RunPass,
    RunTrim,
    dropped_enough,
)
from actors.memory import reclaim as mem_reclaim
from actors.memory.api import RECLAIM_NAME, SHEDDER_NAME, SHEDDING_ROW
from actors.memory.reclaim import MemReclaimActor, agent_count, load_malloc_trim
from actors.registry.api import AGENTS_TABLE
from gateway.config.config import Config
from gateway.config.context import NodeContext
from gateway.config.keys import SCHEMA
from gateway.config.keys.shedder import MEM_RECLAIM, MemReclaim
from gateway.config.vm_args import CookieSource, NodeArgs
from gateway.node.children.memory import reclaim_args
from tests.support.actors import Child, Harness, actor_test, run

POLICY = ReclaimPolicy(followup_s=30.0, trim_interval_s=300.0)


# -- the core --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("peak", "agents", "runs"),
    [
        (4000, 3000, True),  # a quarter and 1,000
        (4000, 3001, False),  # 999 down
        (3000, 2001, False),  # more than a quarter, 999 down
        (10_000, 9000, False),  # 1,000 down, a tenth
        (10_000, 7500, True),
        (1000, 0, True),
        (999, 0, False),
    ],
)
def test_a_pass_needs_a_quarter_of_the_peak_and_a_thousand(
    peak: int, agents: int, runs: bool
) -> None:
    assert dropped_enough(peak, agents) is runs
    core = Reclaim.started(POLICY, 0)
    assert core.observe(peak, 1) == []
    assert core.observe(agents, 2) == ([RunPass("drop", agents)] if runs else [])


def test_the_peak_restarts_after_a_pass() -> None:
    core = Reclaim.started(POLICY, 0)
    core.observe(8000, 0)
    assert core.observe(6000, 1) == [RunPass("drop", 6000)]
    core.finished()
    assert core.peak == 6000
    assert core.observe(5001, 2) == []  # 999 below the new peak
    assert core.observe(4500, 3) == [RunPass("drop", 4500)]


def test_a_followup_pass_after_followup_s() -> None:
    core = Reclaim.started(POLICY, 0)
    core.observe(4000, 0)
    core.observe(2000, 10)
    core.finished()
    assert core.observe(2000, 39) == []
    assert core.observe(1990, 40) == [RunPass("followup", 1990)]
    core.finished()
    assert core.observe(1990, 100) == []  # one followup per drop


def test_periodic_trims_and_a_pass_restarts_their_interval() -> None:
    core = Reclaim.started(POLICY, 0)
    assert core.observe(0, 299) == []
    assert core.observe(0, 300) == [RunTrim()]
    core.finished()
    core.observe(5000, 350)
    assert core.observe(0, 400) == [RunPass("drop", 0)]  # it trims too: next trim at 700
    core.finished()
    assert core.observe(0, 429) == []
    assert core.observe(0, 430) == [RunPass("followup", 0)]  # next trim at 730
    core.finished()
    assert core.observe(0, 729) == []
    assert core.observe(0, 730) == [RunTrim()]


def test_no_periodic_trim_when_the_interval_is_none() -> None:
    core = Reclaim.started(ReclaimPolicy(30.0, None), 0)
    assert core.observe(0, 10**9) == []


def test_nothing_starts_while_busy_and_what_came_due_runs_after() -> None:
    core = Reclaim.started(POLICY, 0)
    assert core.observe(0, 300) == [RunTrim()]
    core.observe(4000, 301)
    assert core.observe(1000, 302) == []  # busy: the peak is kept
    core.finished()
    assert core.observe(1000, 303) == [RunPass("drop", 1000)]


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 6000),
            st.floats(0, 120, allow_nan=False),
            st.booleans(),
            st.booleans(),
        ),
        max_size=80,
    )
)
def test_passes_and_trims_against_a_model(steps: list[tuple[int, float, bool, bool]]) -> None:
    """A drop pass exactly when (and as soon as) the count is down a quarter and 1,000 from
    the peak since the last one; a followup only `followup_s` after a drop; a shedding pass
    exactly when the shedder sheds and no pass ran for `followup_s`; trims at least
    `trim_interval_s` after the last trim or pass."""
    core = Reclaim.started(POLICY, 0)
    now, peak, busy = 0.0, 0, False
    last_drop: float | None = None
    last_pass: float | None = None
    followup_due = False
    last_trim = 0.0
    for agents, dt, finish, shedding in steps:
        now += dt
        peak = max(peak, agents)
        effects = core.observe(agents, now, shedding)
        assert len(effects) <= 1
        followup_now = (
            followup_due and last_drop is not None and now - last_drop >= POLICY.followup_s
        )
        if busy:
            assert effects == []
        elif dropped_enough(peak, agents):
            assert effects == [RunPass("drop", agents)]
            peak, last_drop, followup_due = agents, now, True
        elif followup_now:
            assert effects == [RunPass("followup", agents)]
            followup_due = False
        elif shedding and (last_pass is None or now - last_pass >= POLICY.followup_s):
            assert effects == [RunPass("shedding", agents)]
        elif effects:
            assert effects == [RunTrim()]
            assert POLICY.trim_interval_s is not None
            assert now - last_trim >= POLICY.trim_interval_s
        if effects:
            busy, last_trim = True, now
            if isinstance(effects[0], RunPass):
                last_pass = now
        if finish and busy:
            core.finished()
            busy = False


# -- the actor -------------------------------------------------------------------------------------


def context(tmp_path: Path, reclaim: MemReclaim) -> NodeContext:
    config = Config({k.name: k.default_value for k in SCHEMA.keys}, {})
    config = Config({**config.values, MEM_RECLAIM.name: reclaim}, {})
    node = NodeArgs("gw@127.0.0.1", "test", "x" * 32, CookieSource.ENV, (), "vm.args")
    return NodeContext(config, node, tmp_path)


FAST = MemReclaim(interval_ms=100, followup_ms=1000, trim_interval_ms=0)


async def agents_table(h: Harness, rows: int) -> object:
    """A stand-in registry owning the `agents` table with `rows` sessions."""
    owner = h.spawn("registry")

    def make(actor: Child) -> None:
        table = actor.new_table(AGENTS_TABLE)
        for i in range(rows):
            table.insert(f"s{i}", object())

    await h.call(owner, make)
    return owner


async def until(predicate: object, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.02)


def reclaim_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "yuzu_gw.mem_reclaim"]


PASS_LINE = re.compile(
    r"gateway memory reclaim: #\{pass => (drop|followup|shedding), agents => (\d+),"
    r" gc_objects => \d+, trim => (true|false|unavailable), rss_anon_kb_before => \d+,"
    r" rss_anon_kb_after => \d+, ms => \d+\}"
)


@actor_test
async def test_a_drop_runs_a_pass_then_a_followup_with_one_line_each(
    h: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "yuzu_gw.mem_reclaim")
    owner = await agents_table(h, 1200)
    assert agent_count(h.base) == 1200
    h.create(MemReclaimActor, reclaim_args(context(tmp_path, FAST)), RECLAIM_NAME)
    await asyncio.sleep(0.25)  # the peak is read
    assert reclaim_lines(caplog) == []

    def drop(actor: Child) -> None:
        table = actor.runtime.table(AGENTS_TABLE)
        for i in range(1100):
            table.delete(f"s{i}")

    await h.call(owner, drop)
    await until(lambda: len(reclaim_lines(caplog)) >= 1)
    first = PASS_LINE.fullmatch(reclaim_lines(caplog)[0])
    assert first is not None and first.group(1, 2) == ("drop", "100")
    await until(lambda: len(reclaim_lines(caplog)) >= 2)
    second = PASS_LINE.fullmatch(reclaim_lines(caplog)[1])
    assert second is not None and second.group(1, 2) == ("followup", "100")
    expected_trim = "true|false" if load_malloc_trim()[0] is not None else "unavailable"
    assert re.fullmatch(expected_trim, first.group(3))


@actor_test
async def test_passes_run_while_the_shedder_sheds_and_stop_when_it_ends(
    h: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No drop at all: the shedder's published verdict alone brings a pass, then one every
    followup_ms while it lasts (issue 21 §2)."""
    caplog.set_level(logging.INFO, "yuzu_gw.mem_reclaim")
    await agents_table(h, 10)
    shedder = h.spawn("shedder")

    def shed(on: bool) -> Callable[[Child], None]:
        def publish(actor: Child) -> None:
            table = actor.runtime.table(SHEDDER_NAME)
            if table is None:
                table = actor.new_table(SHEDDER_NAME)
            table.insert(SHEDDING_ROW, on)

        return publish

    await h.call(shedder, shed(False))
    h.create(MemReclaimActor, reclaim_args(context(tmp_path, FAST)), RECLAIM_NAME)
    await asyncio.sleep(0.3)
    assert reclaim_lines(caplog) == []
    await h.call(shedder, shed(True))
    await until(lambda: len(reclaim_lines(caplog)) >= 1, timeout=1.0)  # at the next reading
    await until(lambda: len(reclaim_lines(caplog)) >= 2, timeout=2.0)  # followup_ms later
    passes = [PASS_LINE.fullmatch(line) for line in reclaim_lines(caplog)]
    assert [m.group(1, 2) if m else None for m in passes] == [("shedding", "10")] * 2
    await h.call(shedder, shed(False))
    seen = len(reclaim_lines(caplog))
    await asyncio.sleep(1.5)
    assert len(reclaim_lines(caplog)) == seen


@actor_test
async def test_without_malloc_trim_one_notice_and_garbage_collection_only(
    h: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, "yuzu_gw.mem_reclaim")
    monkeypatch.setattr(mem_reclaim, "load_malloc_trim", lambda: (None, "musl has none"))
    owner = await agents_table(h, 2000)
    h.create(MemReclaimActor, reclaim_args(context(tmp_path, FAST)), RECLAIM_NAME)
    await asyncio.sleep(0.25)

    def drop(actor: Child) -> None:
        table = actor.runtime.table(AGENTS_TABLE)
        for i in range(2000):
            table.delete(f"s{i}")

    await h.call(owner, drop)
    await until(lambda: len(reclaim_lines(caplog)) >= 3)
    lines = reclaim_lines(caplog)
    assert lines[0] == (
        "gateway memory reclaim: malloc_trim unavailable (musl has none); garbage collection only"
    )
    assert PASS_LINE.fullmatch(lines[1]) is not None and "trim => unavailable" in lines[1]
    assert PASS_LINE.fullmatch(lines[2]) is not None and "pass => followup" in lines[2]
    assert sum("unavailable (" in line for line in lines) == 1


def test_malloc_trim_is_found_on_glibc() -> None:
    trim, why = load_malloc_trim()
    if platform.libc_ver()[0] == "glibc":
        assert trim is not None and why == ""
        assert trim() in (0, 1)
    else:
        assert trim is None and why


def test_no_registry_table_is_no_reading() -> None:
    async def body(h: Harness) -> None:
        assert agent_count(h.base) is None

    run(body)
