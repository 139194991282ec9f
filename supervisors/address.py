"""Actor addresses for the loop system base.

thespian's `ActorAddress` is deliberately unhashable; the registry, monitors and the
agent tables key on addresses on every message, so ours hash and compare by their
integer id in O(1).
"""

from __future__ import annotations

from thespian.actors import ActorAddress


class Address(ActorAddress):
    """An opaque, hashable actor address; `id` 0 is the actor system itself."""

    def __init__(self, aaddr: int) -> None:
        self._aaddr = aaddr

    @property
    def id(self) -> int:
        return self._aaddr

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Address) and other._aaddr == self._aaddr

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return self._aaddr

    def __repr__(self) -> str:
        return f"<Address {self._aaddr}>"

    def __str__(self) -> str:
        return f"<0.{self._aaddr}.0>"


SYSTEM_ADDRESS = Address(0)
