"""The soak's fault schedule (tests/soak/schedule.py): a pure function of its seed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.soak import schedule as sched

seeds = st.integers(min_value=0, max_value=2**31)
durations = st.floats(min_value=120.0, max_value=900.0)
fleets = st.integers(min_value=1, max_value=20000)


@given(seeds, durations, fleets)
@settings(max_examples=50, deadline=None)
def test_the_same_seed_gives_the_same_schedule(seed: int, duration: float, agents: int) -> None:
    assert sched.build(seed, duration, agents) == sched.build(seed, duration, agents)


def test_another_seed_gives_another_schedule() -> None:
    assert sched.build(1, 120.0, 500) != sched.build(2, 120.0, 500)


@given(seeds, durations, fleets)
@settings(max_examples=100, deadline=None)
def test_faults_are_apart_inside_the_window_and_respect_the_root(
    seed: int, duration: float, agents: int
) -> None:
    plan = sched.build(seed, duration, agents)
    times = [f.at_s for f in plan.faults]
    assert times == sorted(times)
    assert times[0] >= sched.WARMUP_S and times[-1] <= duration - sched.TAIL_S
    for before, after in zip(plan.faults, plan.faults[1:], strict=False):
        # one fault at a time: a drop or stall has ended before the next begins
        assert after.at_s - before.at_s >= sched.FAULT_GAP_S + before.hold_s - 0.002
    root = [f.at_s for f in plan.faults if f.kind in sched.ROOT_KILLS]
    for t in root:
        in_window = [u for u in root if t <= u < t + sched.ROOT_WINDOW_S]
        assert len(in_window) <= sched.ROOT_KILLS_PER_WINDOW
    for f in plan.faults:
        if f.kind == sched.OWNER_MASS_KILL:
            assert 1 <= f.size <= min(sched.MASS_KILL_MAX, max(1, agents))
        if f.kind in sched.HELD:
            assert sched.HOLD_S[0] <= f.hold_s <= sched.HOLD_S[1]


@given(seeds, fleets)
@settings(max_examples=50, deadline=None)
def test_a_two_minute_run_meets_every_fault(seed: int, agents: int) -> None:
    plan = sched.build(seed, 120.0, agents)
    first_cycle = {f.kind for f in plan.faults if f.cycle == 0}
    assert first_cycle == set(sched.FAULT_KINDS)


@given(seeds, durations, fleets)
@settings(max_examples=50, deadline=None)
def test_commands_run_throughout_and_name_real_agents(
    seed: int, duration: float, agents: int
) -> None:
    plan = sched.build(seed, duration, agents)
    assert plan.commands and plan.commands[-1].at_s <= duration - sched.TAIL_S
    assert {c.kind for c in plan.commands} <= {sched.COMMAND, sched.BROADCAST}
    assert all(
        1 <= c.size <= min(agents, sched.COMMAND_TARGETS_MAX)
        for c in plan.commands
        if c.kind == sched.COMMAND
    )
    assert [e.at_s for e in plan.events] == sorted(e.at_s for e in plan.events)


def test_a_run_too_short_is_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        sched.build(1, sched.WARMUP_S + sched.TAIL_S - 1, 10)


@given(seeds, fleets)
@settings(max_examples=50, deadline=None)
def test_the_cluster_faults_come_only_with_two_nodes(seed: int, agents: int) -> None:
    one = {f.kind for f in sched.build(seed, 600.0, agents).faults}
    assert not one & set(sched.CLUSTER_KINDS)
    # A three-minute two-node run meets every kind, the cluster's included, each held 2-5 s.
    plan = sched.build(seed, 180.0, agents, nodes=2)
    assert {f.kind for f in plan.faults if f.cycle == 0} == set(sched.kinds(2))
    assert all(
        sched.HOLD_S[0] <= f.hold_s <= sched.HOLD_S[1]
        for f in plan.faults
        if f.kind in sched.CLUSTER_KINDS
    )


def test_a_single_node_schedule_does_not_depend_on_the_cluster_kinds() -> None:
    # The same seed replays the same single-node run it did before there were two nodes.
    assert sched.build(21, 120.0, 500) == sched.build(21, 120.0, 500, nodes=1)
    assert sched.build(21, 120.0, 500) != sched.build(21, 120.0, 500, nodes=2)
    with pytest.raises(ValueError, match="one node or two"):
        sched.build(21, 120.0, 500, nodes=3)
