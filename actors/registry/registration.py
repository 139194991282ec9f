"""The Register handler's side of the registry: a slot held for exactly as long as the call.

    async with reserve_slot(runtime, conn_key, agent_id) as slot:   # SlotRefused: UNAVAILABLE
        ... permit, ProxyRegister ...                                  # RegistryUnavailable:
        if not await slot.commit(session_id, peer, plugins, request):  #   INTERNAL
            ...  # UNAVAILABLE, SUPERSEDED_DETAILS

Leaving the block without a commit (an exception, a refusal upstream, the agent's call being
cancelled) sends `Release` at once, without awaiting anything, so a cancelled call frees its slot
in the same step it is cancelled (seed: "its reservation is released at once"). The request id
is minted here before the `Reserve` is sent, so even a caller cancelled while its reserve call is
still queued, or one whose reserve call timed out at 5 s, releases its slot: the registry
handles the `Release` after the `Reserve`.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Literal

from actors.core.reservations import ConnKey
from actors.registry.api import (
    Commit,
    CommitRefused,
    Committed,
    Release,
    Reserve,
    Reserved,
    ReserveRefused,
    registry_address,
)
from supervisors.errors import ActorExited, NoProc

if TYPE_CHECKING:
    from supervisors.address import Address
    from supervisors.runtime import LoopSystemBase

__all__ = [
    "RESERVE_TIMEOUT_S",
    "RegistrySlot",
    "RegistryUnavailable",
    "SlotRefused",
    "new_request_id",
    "reserve_slot",
]

# The registry reserve call timeout (K31). The registry answers in microseconds; 5 s only bounds
# a registry stuck behind a flood, and the Register still has its own deadline left.
RESERVE_TIMEOUT_S = 5.0

_request_ids = itertools.count(1)
# What a registry call failure may be named by in a log line.
ExitClass = Literal["noproc", "timeout", "other"]


def new_request_id() -> int:
    """Unique on the node for its whole life (one loop, one counter)."""
    return next(_request_ids)


class RegistryUnavailable(Exception):
    """The registry is not running, ended while asked, or did not answer in time (INTERNAL).
    `exit_class` is all the Register handler's warning may name of it (seed: the safe-call
    warning names "only the class of the exit (noproc, timeout or other)")."""

    def __init__(self, why: str, exit_class: ExitClass = "other") -> None:
        super().__init__(why)
        self.exit_class: ExitClass = exit_class


class SlotRefused(Exception):
    """No slot: `reason` is `cap` (answer UNAVAILABLE), `connection_down` or `no_connection`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RegistrySlot:
    """A reservation held by one Register call."""

    __slots__ = ("_registry", "_runtime", "committed", "request_id", "stamp")

    def __init__(
        self, runtime: LoopSystemBase, registry: Address, request_id: int, stamp: float
    ) -> None:
        self._runtime = runtime
        self._registry = registry
        self.request_id = request_id
        self.stamp = stamp
        # Set once a Commit was sent: from then on the registry owns the outcome.
        self.committed = False

    async def commit(
        self,
        session_id: str,
        peer: str = "",
        plugins: tuple[str, ...] = (),
        register: object = None,
        timeout: float = RESERVE_TIMEOUT_S,
    ) -> bool:
        """Store the pending row. True: committed. False: superseded (answer UNAVAILABLE,
        `SUPERSEDED_DETAILS`). Raises `RegistryUnavailable`."""
        self.committed = True
        message = Commit(self.request_id, session_id, peer, plugins, register)
        answer = await _ask(self._runtime, self._registry, message, timeout)
        if isinstance(answer, Committed):
            return True
        if isinstance(answer, CommitRefused):
            return False
        raise RegistryUnavailable(f"unexpected answer {type(answer).__name__}")

    def release(self) -> None:
        if not self.committed:
            self.committed = True
            # tell: enqueued at once, even from a cancelled coroutine; a dead registry (and its
            # reservations with it) makes this a dead letter, which is fine.
            self._runtime.tell(self._registry, Release(self.request_id))


@asynccontextmanager
async def reserve_slot(
    runtime: LoopSystemBase,
    conn_key: ConnKey | None,
    agent_id: str,
    timeout: float = RESERVE_TIMEOUT_S,
) -> AsyncIterator[RegistrySlot]:
    registry = registry_address(runtime)
    if registry is None:
        raise RegistryUnavailable("no registry", "noproc")
    request_id = new_request_id()
    try:
        answer = await _ask(runtime, registry, Reserve(request_id, conn_key, agent_id), timeout)
    except BaseException:
        # Cancelled or timed out while the Reserve may still be queued: release it behind it.
        runtime.tell(registry, Release(request_id))
        raise
    if isinstance(answer, ReserveRefused):
        raise SlotRefused(answer.reason)
    if not isinstance(answer, Reserved):
        raise RegistryUnavailable(f"unexpected answer {type(answer).__name__}")
    slot = RegistrySlot(runtime, registry, request_id, answer.stamp)
    try:
        yield slot
    finally:
        slot.release()


async def _ask(
    runtime: LoopSystemBase, registry: Address, message: object, timeout: float
) -> object:
    try:
        answer = await runtime.ask(registry, message, timeout)
    except NoProc:
        raise RegistryUnavailable("NoProc", "noproc") from None
    except TimeoutError:
        raise RegistryUnavailable("TimeoutError", "timeout") from None
    except ActorExited:
        raise RegistryUnavailable("ActorExited") from None
    return answer
