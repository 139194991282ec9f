"""Keys with a due time, cheapest first: the timer book of the registry's cores.

A heap with lazy deletion: `set` and `discard` are O(log n) and O(1), `pop_due` pops only what is
due. Each `set` gets a sequence number, so a key set again leaves its old heap entry stale rather
than searched for; stale entries are skipped when met and compacted in bulk, so a key that is set
and discarded on every Register (a reservation) cannot grow the heap without bound.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["Deadlines"]

K = TypeVar("K", bound=Hashable)

# Past this many stale entries beyond twice the live ones, the heap is rebuilt.
_COMPACT_SLACK = 64


class Deadlines(Generic[K]):
    __slots__ = ("_at", "_heap", "_seq")

    def __init__(self) -> None:
        self._at: dict[K, tuple[float, int]] = {}
        # (due, seq, key): seq is unique, so keys are never compared.
        self._heap: list[tuple[float, int, K]] = []
        self._seq = 0

    def set(self, key: K, due: float) -> None:
        """Make `key` due at `due` (replacing any earlier due time of it)."""
        self._seq += 1
        self._at[key] = (due, self._seq)
        heapq.heappush(self._heap, (due, self._seq, key))
        self._compact()

    def discard(self, key: K) -> None:
        if self._at.pop(key, None) is not None:
            self._compact()

    def get(self, key: K) -> float | None:
        entry = self._at.get(key)
        return None if entry is None else entry[0]

    def __contains__(self, key: object) -> bool:
        return key in self._at

    def __len__(self) -> int:
        return len(self._at)

    def next(self) -> float | None:
        """The earliest due time, or None when nothing is due ever."""
        self._drop_stale_head()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[K]:
        """Remove and return every key due at or before `now`, earliest first."""
        due: list[K] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, seq, key = heapq.heappop(heap)
            if self._at.get(key) == (at, seq):
                del self._at[key]
                due.append(key)
        return due

    def _drop_stale_head(self) -> None:
        heap = self._heap
        while heap:
            at, seq, key = heap[0]
            if self._at.get(key) == (at, seq):
                return
            heapq.heappop(heap)

    def _compact(self) -> None:
        if len(self._heap) > 2 * len(self._at) + _COMPACT_SLACK:
            self._heap = [(at, seq, key) for key, (at, seq) in self._at.items()]
            heapq.heapify(self._heap)
