"""Compact HTTP/2 SETTINGS bookkeeping for connections that live for days.

h2 keeps each setting of a connection as a `collections.deque` of values (the current one
first, then values sent but not yet acknowledged). An empty or one-value deque costs 760
bytes here, and a connection has about fifteen of them (its own settings and the peer's):
some 11 KB per agent connection, for values that change once, at the handshake. `compact`
swaps each deque for a one-slot list that answers the same four operations h2 uses on them
(`[0]`, `len`, `append`, `popleft`): 72 bytes each.

It is applied after every SETTINGS exchange (a new setting the peer sends arrives as a fresh
deque), and only to values that are deques, so an h2 that stores them otherwise is left alone.
"""

from __future__ import annotations

import collections
from typing import Any

from h2.settings import Settings

__all__ = ["SettingValues", "compact"]


class SettingValues(list[Any]):
    """A setting's values, current first: the part of deque's interface h2 uses."""

    __slots__ = ()

    def popleft(self) -> Any:
        return self.pop(0)


def compact(settings: Settings) -> None:
    values = getattr(settings, "_settings", None)
    if not isinstance(values, dict):
        return
    for key, value in values.items():
        if type(value) is collections.deque:
            values[key] = SettingValues(value)
