"""Garbage-collector settings for a node that holds many long-lived actors.

With the interpreter's defaults (700, 10, 10) a node spawning 100,000 actors runs several
full collections, each walking every actor: measured here, 0.35-0.73 s of a 0.7-1.7 s
spawn-and-exchange (tests/bench/runtime.py). A first-generation threshold of 50,000 keeps
young collections rare and cheap relative to the work between them; full collections
then happen only when the heap really grows. The cost: garbage held in reference cycles
lives longer, which the gateway avoids creating on its hot paths. The node also freezes
what boot allocated (`gc.freeze()`) so it is never walked again.
"""

from __future__ import annotations

import gc

NODE_GC_THRESHOLD = (50_000, 20, 20)


def tune(threshold: tuple[int, int, int] = NODE_GC_THRESHOLD) -> None:
    gc.set_threshold(*threshold)
