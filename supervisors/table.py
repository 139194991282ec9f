"""ETS-like tables: read by any code on the node without a message, written only by
their owner (`protected`) or by anyone on the node (`public`), gone with their owner.

Heartbeat admission reads node-local state on every heartbeat, so reads must not cost a
round trip through a mailbox. That a table dies with its owner is relied on: a restarted
registry starts with empty tables (seed: "Heartbeat admission").
"""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterator, KeysView, ValuesView
from typing import Generic, Literal, TypeVar

from supervisors.errors import TableGone

K = TypeVar("K")
V = TypeVar("V")
Access = Literal["protected", "public"]


class Table(Generic[K, V]):
    __slots__ = ("_data", "_is_owner_running", "access", "alive", "name", "owner_name")

    def __init__(
        self, name: str, access: Access, owner_name: str, is_owner_running: Callable[[], bool]
    ) -> None:
        self.name = name
        self.access = access
        self.owner_name = owner_name
        self.alive = True
        self._data: dict[K, V] = {}
        self._is_owner_running = is_owner_running

    # -- reads: any code on the node -----------------------------------------------
    def _live(self) -> dict[K, V]:
        if not self.alive:
            raise TableGone(self.name)
        return self._data

    def get(self, key: K, default: V | None = None) -> V | None:
        return self._live().get(key, default)

    def __getitem__(self, key: K) -> V:
        return self._live()[key]

    def __contains__(self, key: object) -> bool:
        return key in self._live()

    def __len__(self) -> int:
        return len(self._live())

    def __iter__(self) -> Iterator[K]:
        return iter(self._live())

    def keys(self) -> KeysView[K]:
        return self._live().keys()

    def values(self) -> ValuesView[V]:
        return self._live().values()

    def items(self) -> ItemsView[K, V]:
        return self._live().items()

    # -- writes: the owner, or anyone for a public table ---------------------------
    def _writable(self) -> dict[K, V]:
        data = self._live()
        if self.access == "protected" and not self._is_owner_running():
            raise PermissionError(f"table {self.name} is protected: only its owner writes")
        return data

    def insert(self, key: K, value: V) -> None:
        self._writable()[key] = value

    def delete(self, key: K) -> None:
        self._writable().pop(key, None)

    def take(self, key: K) -> V | None:
        """Remove and return the row (ETS `take/2`)."""
        return self._writable().pop(key, None)

    def insert_new(self, key: K, value: V) -> bool:
        data = self._writable()
        if key in data:
            return False
        data[key] = value
        return True

    def drop(self) -> None:
        """Called by the runtime when the owner ends."""
        self.alive = False
        self._data = {}

    def __repr__(self) -> str:
        state = len(self._data) if self.alive else "gone"
        return f"<Table {self.name} {self.access} owner={self.owner_name} rows={state}>"
