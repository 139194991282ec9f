"""OTP supervisors on the loop runtime.

Rules (OTP's `supervisor`, names unchanged):
- Children start in the order of their specs, synchronously, inside the supervisor's own
  `init`; a child whose `init` fails aborts the start, the children already started are
  ended, and the creator gets `failed_to_start_child <id>` with the child's reason.
- A child that ends is restarted by its `restart` type: `permanent` always, `transient`
  unless the reason is `normal` or `shutdown`, `temporary` never (its spec is dropped).
- Each restart is recorded against the restart intensity; the restart that exceeds it
  makes the supervisor stop every child in reverse start order and end with reason
  `reached_max_restart_intensity`, for its own supervisor to handle.
- Strategies: `one_for_one` restarts the child; `one_for_all` stops the others in
  reverse order and restarts all in order; `rest_for_one` does that for the children
  started after it; `simple_one_for_one` has one template and dynamic children that are
  stopped all at once.
- Stopping a child sends `ActorExitRequest` and waits its `shutdown` seconds for it to
  end, then kills it; `brutal_kill` kills at once; `infinity` waits for ever.
- While a supervisor is stopping children it handles nothing else: other messages wait
  (OTP's supervisor is blocked in the same place) and are handled afterwards in order.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

import attrs
from thespian.actors import Actor, ActorExitRequest, WakeupMessage

from supervisors.address import Address
from supervisors.errors import InitFailed
from supervisors.intensity import RestartIntensity
from supervisors.messages import ChildExited
from supervisors.process import Process
from supervisors.reason import REACHED_MAX_RESTART_INTENSITY, SHUTDOWN, ExitReason

log = logging.getLogger("supervisors.supervisor")

Restart = Literal["permanent", "transient", "temporary"]
Shutdown = float | Literal["brutal_kill", "infinity"]
Strategy = Literal["one_for_one", "one_for_all", "rest_for_one", "simple_one_for_one"]

# OTP's defaults: a worker gets 5 s to stop, a supervisor as long as its children need.
DEFAULT_WORKER_SHUTDOWN_S = 5.0


@attrs.frozen
class ChildSpec:
    id: str
    start: type[Actor]
    args: Any = None
    restart: Restart = "permanent"
    shutdown: Shutdown | None = None
    type: Literal["worker", "supervisor"] = "worker"
    # A registered name (thespian's globalName) so others find the child by name.
    name: str | None = None

    @property
    def shutdown_timeout(self) -> Shutdown:
        if self.shutdown is not None:
            return self.shutdown
        return "infinity" if self.type == "supervisor" else DEFAULT_WORKER_SHUTDOWN_S


@attrs.frozen
class SupFlags:
    strategy: Strategy = "one_for_one"
    intensity: int = 1
    period: float = 5.0


@attrs.frozen
class SupSpec:
    flags: SupFlags
    children: tuple[ChildSpec, ...] = ()


# -- the API, as messages ----------------------------------------------------------------
@attrs.frozen
class StartChild:
    """A `ChildSpec`, or for `simple_one_for_one` the child's `init` argument."""

    spec_or_args: Any


@attrs.frozen
class TerminateChild:
    """By id, or by address for `simple_one_for_one`."""

    child: str | Address


@attrs.frozen
class RestartChild:
    id: str


@attrs.frozen
class DeleteChild:
    id: str


@attrs.frozen
class WhichChildren:
    pass


@attrs.frozen
class CountChildren:
    pass


@attrs.frozen
class SupReply:
    ok: bool
    value: Any = None
    error: str = ""


@attrs.frozen
class ChildInfo:
    id: str | None
    address: Address | None
    type: str
    start: str


@attrs.frozen
class ChildCounts:
    specs: int
    active: int
    supervisors: int
    workers: int


# -- internal messages -------------------------------------------------------------------
@attrs.frozen
class _TryAgain:
    """A restart whose start failed is tried again, counting against the intensity."""

    child: _Child


@attrs.frozen
class _ShutdownTimeout:
    token: int


@attrs.define(eq=False)
class _Child:
    spec: ChildSpec
    address: Address | None = None
    args: Any = None


@attrs.define
class _Stopping:
    """Children being stopped one after another (or all at once), then `then`."""

    queue: deque[_Child]
    then: Callable[[], None]
    waiting: dict[Address, _Child] = attrs.field(factory=dict)
    token: int = 0
    timer: Any = None


class StartFailure(Exception):
    """Raised by a supervisor's `init` when a child fails to start."""

    def __init__(self, child_id: str, reason: ExitReason) -> None:
        super().__init__(child_id)
        self.exit_reason = ExitReason(
            "failed_to_start_child", reason.exc_class, reason.frame, child_id or reason.kind
        )


class Supervisor(Process):
    trap_exit: ClassVar[bool] = True

    def supervisor_spec(self, args: Any) -> SupSpec:
        """Override to build the spec from `args` (OTP's `init/1` callback); by default
        `args` is the `SupSpec` itself."""
        if not isinstance(args, SupSpec):
            raise TypeError("a Supervisor's args must be a SupSpec")
        return args

    def init(self, args: Any) -> None:
        spec = self.supervisor_spec(args)
        self.flags = spec.flags
        self.intensity = RestartIntensity(spec.flags.intensity, spec.flags.period)
        # Insertion-ordered (start order); a dict so that removing one of many thousands of
        # simple_one_for_one children is O(1).
        self.children: dict[_Child, None] = {}
        self.by_address: dict[Address, _Child] = {}
        self.template: ChildSpec | None = None
        self.stopping: _Stopping | None = None
        self.postponed: deque[tuple[Any, Address]] = deque()
        self.tokens = 0
        if spec.flags.strategy == "simple_one_for_one":
            if len(spec.children) != 1:
                raise ValueError("simple_one_for_one takes exactly one child spec")
            self.template = spec.children[0]
            return
        for child_spec in spec.children:
            child = _Child(child_spec)
            self.children[child] = None
            reason = self._start(child)
            if reason is not None:
                raise StartFailure(child_spec.id, reason)

    # -- message routing -------------------------------------------------------------
    def receiveMessage(self, msg: Any, sender: Address) -> None:
        if self.stopping is not None and not self._serves_stop(msg):
            self.postponed.append((msg, sender))
            return
        self._handle(msg, sender)
        while self.stopping is None and self.postponed and self._myRef.alive:
            msg, sender = self.postponed.popleft()
            self._handle(msg, sender)

    def _serves_stop(self, msg: Any) -> bool:
        stopping = self.stopping
        assert stopping is not None
        if isinstance(msg, ChildExited):
            return msg.childAddress in stopping.waiting
        if isinstance(msg, WakeupMessage) and isinstance(msg.payload, _ShutdownTimeout):
            return msg.payload.token == stopping.token
        return False

    def _handle(self, msg: Any, sender: Address) -> None:
        match msg:
            case ChildExited():
                self._child_exited(msg.childAddress, msg.reason)
            case WakeupMessage(payload=_ShutdownTimeout() as timeout):
                self._shutdown_timeout(timeout.token)
            case _TryAgain(child=child):
                self._try_again(child)
            case ActorExitRequest():
                self._stop_children(self._running_reversed(), lambda: self.exit(SHUTDOWN))
            case StartChild(spec_or_args=spec_or_args):
                self.send(sender, self._start_child(spec_or_args))
            case TerminateChild(child=key):
                self._terminate_child(key, sender)
            case RestartChild(id=child_id):
                self.send(sender, self._restart_child(child_id))
            case DeleteChild(id=child_id):
                self.send(sender, self._delete_child(child_id))
            case WhichChildren():
                self.send(sender, SupReply(True, self.which_children()))
            case CountChildren():
                self.send(sender, SupReply(True, self.count_children()))
            case _:
                self.unexpected(msg, sender)

    def unexpected(self, msg: Any, sender: Address) -> None:
        """Subclasses that also serve requests handle them here."""
        log.warning("supervisor %s: unexpected message %s", self._myRef.label, type(msg).__name__)

    # -- starting --------------------------------------------------------------------
    def _start(self, child: _Child) -> ExitReason | None:
        spec = child.spec
        args = spec.args if child.args is None else child.args
        if spec.name is not None and self.runtime.whereis(spec.name) is not None:
            # thespian's createActor would return the registered actor, which is not our
            # child: we would never see it exit. OTP's `{error, {already_started, Pid}}`.
            return ExitReason("already_started", detail=spec.name)
        try:
            address = self.createActor(spec.start, args, spec.name)
        except InitFailed as failed:
            return failed.reason
        child.address = address
        self.by_address[address] = child
        return None

    def _start_child(self, spec_or_args: Any) -> SupReply:
        if self.template is not None:
            child = _Child(attrs.evolve(self.template, id=""), args=spec_or_args)
            reason = self._start(child)
            if reason is not None:
                return SupReply(False, error=str(reason))
            self.children[child] = None
            return SupReply(True, child.address)
        if not isinstance(spec_or_args, ChildSpec):
            return SupReply(False, error="bad_child_spec")
        existing = self._by_id(spec_or_args.id)
        if existing is not None:
            error = "already_started" if existing.address else "already_present"
            return SupReply(False, existing.address, error)
        child = _Child(spec_or_args)
        self.children[child] = None
        reason = self._start(child)
        if reason is not None:
            del self.children[child]
            return SupReply(False, error=str(reason))
        return SupReply(True, child.address)

    # -- children ending -------------------------------------------------------------
    def _child_exited(self, address: Address, reason: ExitReason) -> None:
        stopping = self.stopping
        if stopping is not None and address in stopping.waiting:
            self._stopped(stopping, stopping.waiting.pop(address))
            return
        child = self.by_address.pop(address, None)
        if child is None:
            return  # a child we already killed or deleted
        child.address = None
        spec = child.spec
        if not reason.is_normal:
            log.error(
                "supervisor %s: child %s (%s) ended: %s",
                self._myRef.label,
                spec.id or address,
                spec.start.__name__,
                reason,
            )
        if spec.restart == "temporary" or (spec.restart == "transient" and reason.is_normal):
            if spec.restart == "temporary" or self.template is not None:
                del self.children[child]
            return
        self._restart(child)

    def _restart(self, child: _Child) -> None:
        if not self.intensity.add_restart(self.now()):
            self._escalate()
            return
        strategy = self.flags.strategy
        if strategy in ("one_for_one", "simple_one_for_one"):
            if self._start(child) is not None:
                self.send(self.myAddress, _TryAgain(child))
            return
        order = list(self.children)
        group = order if strategy == "one_for_all" else order[order.index(child) :]
        running = [c for c in reversed(group) if c.address is not None]
        self._stop_children(running, lambda: self._start_group(group))

    def _start_group(self, group: list[_Child]) -> None:
        for child in group:
            if child not in self.children or child.address is not None:
                continue
            if child.spec.restart == "temporary":
                # OTP: a temporary child that a one_for_all / rest_for_one restart stopped
                # is removed, never restarted.
                del self.children[child]
                continue
            if self._start(child) is not None:
                self.send(self.myAddress, _TryAgain(child))
                return

    def _try_again(self, child: _Child) -> None:
        if child in self.children and child.address is None:
            self._restart(child)

    def _escalate(self) -> None:
        log.error(
            "supervisor %s: reached_max_restart_intensity (%d restarts in %.1f s); "
            "stopping its children",
            self._myRef.label,
            self.flags.intensity,
            self.flags.period,
        )
        self._stop_children(
            self._running_reversed(), lambda: self.exit(REACHED_MAX_RESTART_INTENSITY)
        )

    # -- stopping --------------------------------------------------------------------
    def _running_reversed(self) -> list[_Child]:
        return [c for c in reversed(self.children) if c.address is not None]

    def _stop_children(self, children: list[_Child], then: Callable[[], None]) -> None:
        """Stop `children` in the given order (all at once for simple_one_for_one),
        each within its shutdown timeout, then run `then`."""
        stopping = _Stopping(deque(children), then)
        self.stopping = stopping
        self._stop_next(stopping)

    def _stop_next(self, stopping: _Stopping) -> None:
        batch = (
            list(stopping.queue)
            if self.template is not None
            else [stopping.queue[0]]
            if stopping.queue
            else []
        )
        for _ in batch:
            stopping.queue.popleft()
        if not batch:
            self.stopping = None
            stopping.then()
            return
        timeout = batch[0].spec.shutdown_timeout
        for child in batch:
            address = child.address
            assert address is not None
            self.by_address.pop(address, None)
            if not self.runtime.is_alive(address) and self._take_postponed_exit(address):
                # It ended by itself while we were stopping others, and its ChildExited was
                # postponed: waiting for it would stall until the shutdown timeout (for ever
                # with `infinity`). As in OTP, the exit already received ends the wait.
                child.address = None
            elif timeout == "brutal_kill":
                self.kill(address)
                child.address = None
            else:
                stopping.waiting[address] = child
                self.send(address, ActorExitRequest())
        if not stopping.waiting:
            self._stop_next(stopping)
            return
        if timeout != "infinity":
            self.tokens += 1
            stopping.token = self.tokens
            stopping.timer = self.wakeupAfter(timeout, _ShutdownTimeout(stopping.token))

    def _take_postponed_exit(self, address: Address) -> bool:
        for i, (msg, _sender) in enumerate(self.postponed):
            if isinstance(msg, ChildExited) and msg.childAddress == address:
                del self.postponed[i]
                return True
        return False

    def _stopped(self, stopping: _Stopping, child: _Child) -> None:
        child.address = None
        if not stopping.waiting:
            if stopping.timer is not None:
                self.cancel_wakeup(stopping.timer)
                stopping.timer = None
            self._stop_next(stopping)

    def _shutdown_timeout(self, token: int) -> None:
        stopping = self.stopping
        if stopping is None or stopping.token != token:
            return
        stopping.timer = None
        for address, child in list(stopping.waiting.items()):
            log.error(
                "supervisor %s: child %s did not stop within its shutdown timeout; killed",
                self._myRef.label,
                child.spec.id or address,
            )
            self.kill(address)
            child.address = None
        stopping.waiting.clear()
        self._stop_next(stopping)

    def terminate(self, reason: ExitReason) -> None:
        """Ending without having stopped the children (the parent ended, or this supervisor
        crashed): end them now in reverse start order. The runtime would otherwise end them
        in creation order, which restarts reshuffle. A subclass that overrides `terminate`
        must call this."""
        for child in self._running_reversed():
            address = child.address
            assert address is not None
            child.address = None
            self.by_address.pop(address, None)
            if child.spec.shutdown_timeout == "brutal_kill":
                self.kill(address)
            else:
                self.runtime.exit_actor(address, SHUTDOWN)

    # -- the rest of the API ---------------------------------------------------------
    def _by_id(self, child_id: str) -> _Child | None:
        return next((c for c in self.children if c.spec.id == child_id and c.spec.id), None)

    def _terminate_child(self, key: str | Address, sender: Address) -> None:
        child = self.by_address.get(key) if isinstance(key, Address) else self._by_id(key)
        if child is None:
            self.send(sender, SupReply(False, error="not_found"))
            return
        if child.address is None:
            self.send(sender, SupReply(True))
            return

        def reply() -> None:
            if self.template is not None or child.spec.restart == "temporary":
                del self.children[child]
            self.send(sender, SupReply(True))

        self._stop_children([child], reply)

    def _restart_child(self, child_id: str) -> SupReply:
        child = self._by_id(child_id)
        if child is None:
            return SupReply(False, error="not_found")
        if child.address is not None:
            return SupReply(False, child.address, "running")
        reason = self._start(child)
        if reason is not None:
            return SupReply(False, error=str(reason))
        return SupReply(True, child.address)

    def _delete_child(self, child_id: str) -> SupReply:
        child = self._by_id(child_id)
        if child is None:
            return SupReply(False, error="not_found")
        if child.address is not None:
            return SupReply(False, child.address, "running")
        del self.children[child]
        return SupReply(True)

    def which_children(self) -> list[ChildInfo]:
        return [
            ChildInfo(c.spec.id or None, c.address, c.spec.type, c.spec.start.__name__)
            for c in self.children
        ]

    def count_children(self) -> ChildCounts:
        active = sum(1 for c in self.children if c.address is not None)
        supervisors = sum(1 for c in self.children if c.spec.type == "supervisor")
        return ChildCounts(
            len(self.children), active, supervisors, len(self.children) - supervisors
        )

    def format_status(self) -> Mapping[str, Any]:
        return {
            "strategy": self.flags.strategy,
            "intensity": f"{self.flags.intensity}/{self.flags.period:g}s",
            "restarts_in_window": self.intensity.in_window(self.now()),
            "children": len(self.children),
            "stopping": self.stopping is not None,
            "postponed": len(self.postponed),
        }
