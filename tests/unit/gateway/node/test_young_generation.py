"""The bound on the young generation's real size (supervisors/gc_policy.py,
gateway/node/young_generation.py): CPython's count lets generation 0 grow past its threshold when
old
objects die, and the node collects it by its real size."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from gateway.node.young_generation import BOUNDED, YoungGenerationBound
from supervisors.gc_policy import collect_young_if_over

BOUND = 1_000


@pytest.fixture
def no_automatic_collection() -> Iterator[None]:
    """Only the code under test collects; everything older than the test starts out old."""
    was_enabled = gc.isenabled()
    gc.disable()
    gc.collect()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def young() -> int:
    return len(gc.get_objects(generation=0))


def grow_past_the_count(survivors: int, old: list[list[int]] | None = None) -> list[list[int]]:
    """`survivors` new objects while as many old ones die (of `old`, else made and aged here):
    generation 0 holds them all, yet the collector's count (allocations less deallocations)
    barely moves."""
    if old is None:
        old = [[n] for n in range(survivors)]
        gc.collect()  # `old` is old now
    new: list[list[int]] = []
    for n in range(survivors):
        new.append([n])
        old.pop()
    return new


@pytest.mark.usefixtures("no_automatic_collection")
def test_generation_0_past_the_bound_is_collected_though_its_count_is_low() -> None:
    kept = grow_past_the_count(3 * BOUND)
    assert gc.get_count()[0] < BOUND  # what the collector's own threshold would look at
    held = young()
    assert held >= 3 * BOUND
    assert collect_young_if_over(BOUND) == held
    assert young() < BOUND
    assert len(kept) == 3 * BOUND  # survivors are kept, only moved to generation 1


@pytest.mark.usefixtures("no_automatic_collection")
def test_generation_1_is_collected_with_it_once_its_own_count_is_over_its_threshold() -> None:
    """As the collector would: else bounded young collections let generation 1 grow unwalked."""
    threshold = gc.get_threshold()
    gc.set_threshold(threshold[0], 2, threshold[2])
    try:
        old = [[n] for n in range(8 * BOUND)]
        gc.collect()  # `old` is old now, and every generation's count 0
        kept = []
        for round_ in range(4):
            kept.append(grow_past_the_count(2 * BOUND, old))
            assert collect_young_if_over(BOUND) is not None
            # Rounds 1 to 3 add a young collection each to generation 1's count; round 4
            # finds it over 2 and collects generation 1 too, which resets that count.
            assert gc.get_count()[1] == (round_ + 1 if round_ < 3 else 0)
        assert len(gc.get_objects(generation=1)) < BOUND  # moved on to generation 2
    finally:
        gc.set_threshold(*threshold)
    assert sum(map(len, kept)) == 8 * BOUND


@pytest.mark.usefixtures("no_automatic_collection")
def test_within_the_bound_nothing_is_collected() -> None:
    kept = [[n] for n in range(BOUND // 2)]
    held = young()
    assert held >= len(kept)
    assert collect_young_if_over(BOUND) is None
    assert young() >= held


@pytest.mark.usefixtures("no_automatic_collection")
def test_the_node_task_collects_and_counts_then_stops() -> None:
    async def scenario() -> None:
        registry = CollectorRegistry()
        bound = YoungGenerationBound(registry, bound=BOUND, interval_s=0.01)
        bound.start()
        assert registry.get_sample_value(BOUNDED) == 0.0
        kept = grow_past_the_count(3 * BOUND)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if registry.get_sample_value(BOUNDED):
                break
        assert registry.get_sample_value(BOUNDED) == 1.0
        assert young() < 3 * BOUND
        await bound.stop()
        await bound.stop()  # a second stop is a no-op
        assert len(kept) == 3 * BOUND

    asyncio.run(scenario())
