"""Messages the runtime itself delivers to actors."""

from __future__ import annotations

from typing import Any

import attrs
from thespian.actors import ChildActorExited

from supervisors.address import Address
from supervisors.reason import ExitReason


class ChildExited(ChildActorExited):
    """thespian's `ChildActorExited`, carrying the exit reason OTP gives an `'EXIT'`."""

    def __init__(self, child: Address, reason: ExitReason) -> None:
        super().__init__(child)
        self.reason = reason

    def __str__(self) -> str:
        return f"ChildExited({self.childAddress}, {self.reason})"


@attrs.frozen
class ActorDown:
    """A monitored actor ended (OTP's `'DOWN'`)."""

    address: Address
    reason: ExitReason
    monitor: int


@attrs.frozen
class WorkerDone:
    """The coroutine an actor ran with `run_worker` finished: `error` is the exception it
    raised (kept as an object for the actor to classify, never logged by the runtime)."""

    tag: Any
    result: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
