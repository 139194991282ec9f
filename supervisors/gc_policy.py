"""Garbage-collector settings for a node that holds many long-lived actors.

With the interpreter's defaults (700, 10, 10) a node spawning 100,000 actors runs several
full collections, each walking every actor: measured here, 0.35-0.73 s of a 0.7-1.7 s
spawn-and-exchange (tests/bench/runtime.py). A first-generation threshold of 50,000 keeps
young collections rare and cheap relative to the work between them; full collections
then happen only when the heap really grows. The cost: garbage held in reference cycles
lives longer, which the gateway avoids creating on its hot paths. The node also freezes
what boot allocated (`gc.freeze()`) so it is never walked again.

The first threshold does not bound the young generation by itself: CPython counts tracked
allocations less EVERY tracked deallocation, old objects' included. In a wave of agents the
requests in flight survive a young collection and die old, so the young generation held
98,000 to 174,000 objects when the count read 20,000 to 36,000 (3,000 agents joining), and its
collection walked all of them: 0.3 to 1.2 us an object on a heap of 10,000 connections, a
100-250 ms stall. So the node also checks the young generation's real size every
`YOUNG_CHECK_S` and collects it past `YOUNG_GENERATION_BOUND` objects
(gateway/node/young_generation.py).
"""

from __future__ import annotations

import gc

NODE_GC_THRESHOLD = (50_000, 20, 20)
# A young collection of 30,000 objects, plus what a check interval of a cold wave adds (about
# 10,000), stays under the 50 ms stall target at this heap's 1.2 us an object at worst. A lower
# bound counts less but stalls more (docs/metrics.md): at 2,000 a cold wave's young collections
# came at every check, so generation 1 was collected every 5 s, 250 ms at 10,000 agents.
YOUNG_GENERATION_BOUND = 30_000
YOUNG_CHECK_S = 0.25


def tune(threshold: tuple[int, int, int] = NODE_GC_THRESHOLD) -> None:
    gc.set_threshold(*threshold)


def collect_young_if_over(bound: int = YOUNG_GENERATION_BOUND) -> int | None:
    """Collect generation 0 if it holds more than `bound` objects: the number it held, or None
    when it was within the bound. Counting builds a list of them: 15 ns an object on a fresh
    heap, 0.2 to 1 us in a node's, where they lie scattered among old ones.

    As the collector would, this collects generation 1 with it once generation 1's own count
    (young collections since its last) is over its threshold: else these collections, which
    the collector does not see as its own, would let generation 1 grow without end."""
    young = len(gc.get_objects(generation=0))
    if young <= bound:
        return None
    gc.collect(1 if gc.get_count()[1] > gc.get_threshold()[1] else 0)
    return young
