"""`Process`: the behaviour every gateway actor extends (OTP's gen_server vocabulary on a
thespian `Actor`).

Callbacks, all optional:
- `init(args)`: runs synchronously inside `createActor`; raising aborts the start and the
  creator gets `InitFailed` (OTP's `start_link` returning `{error, Reason}`).
- `receiveMessage(msg, sender)`: thespian's handler.
- `terminate(reason)`: runs when the actor ends for any reason but a brutal kill.
- `format_status()`: what the console and crash tooling may show; write it to leave out
  secrets (counts, not contents).

Class attribute `trap_exit`: when true, `ActorExitRequest` is an ordinary message and
the actor ends itself (with `exit`) when its cleanup is done; supervisors and actors with
a final flush set it. When false the runtime ends the actor after the handler returns.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Coroutine, Mapping
from typing import Any, ClassVar

from thespian.actors import Actor

from supervisors.address import Address
from supervisors.reason import NORMAL, ExitReason
from supervisors.runtime import ActorRef, LoopSystemBase
from supervisors.table import Access, Table


class Process(Actor):
    trap_exit: ClassVar[bool] = False
    _myRef: ActorRef

    def init(self, args: Any) -> None:
        """Set up state; `args` is what `createActor` got as targetActorRequirements."""

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        """Messages nobody handles are dropped, as OTP's `handle_info` default does."""

    def terminate(self, reason: ExitReason) -> None:
        """Release what the actor holds outside the runtime (sockets, servers)."""

    def format_status(self) -> Mapping[str, Any]:
        return {}

    # -- runtime services ------------------------------------------------------------
    @property
    def runtime(self) -> LoopSystemBase:
        return self._myRef.system

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._myRef.system.loop

    @property
    def parent_address(self) -> Address | None:
        parent = self._myRef.parent
        return None if parent is None else parent.address

    def now(self) -> float:
        """The loop's monotonic clock, the time every policy core is given."""
        return self._myRef.system.loop.time()

    def wakeupAfter(
        self, timePeriod: float | datetime.timedelta, payload: Any = None
    ) -> asyncio.TimerHandle:
        return self._myRef.wakeupAfter(timePeriod, payload)

    def cancel_wakeup(self, handle: asyncio.TimerHandle) -> None:
        self._myRef.system.cancel_wakeup(self._myRef, handle)

    def monitor(self, address: Address) -> int:
        return self._myRef.system.monitor(self._myRef, address)

    def demonitor(self, monitor: int) -> None:
        self._myRef.system.demonitor(monitor, self._myRef)

    def run_worker(self, coro: Coroutine[Any, Any, Any], tag: Any = None) -> None:
        self._myRef.system.run_worker(self._myRef, coro, tag)

    def exit(self, reason: ExitReason = NORMAL) -> None:
        """End this actor now with `reason` (its `terminate` runs)."""
        self._myRef.system.exit_actor(self._myRef.address, reason)

    def kill(self, address: Address) -> None:
        self._myRef.system.kill(address)

    def new_table(self, name: str, access: Access = "protected") -> Table[Any, Any]:
        return self._myRef.system.new_table(self._myRef, name, access)
