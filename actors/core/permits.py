"""The upstream permit pool: the core of the upstream regulator (yuzu_gw_upstream_regulator).

Rules of this file: who gets an upstream permit, who waits, who is refused, and how many permits
the server's stream limit allows. Nothing here does I/O or reads a clock; every method that
depends on time takes `now` (seconds, monotonic) and returns effects for the actor.

Theory of operation (seed: "Register Proxy", "Configuration > Upstream call permits", "How the
gateway sizes its upstream calls"; SPEC_INDEX REG-03..REG-14, K18, K20):

* Two pools (the permit classes): `register` (48) and `inventory` (8). ProxyRegister and
  ProxyInventory each need a permit before they go upstream. Registration replays draw register
  permits too, but at most `replay` (24, half of register) at once, and they wait behind live
  registrations: a replay is granted only while no live registration waits.
* A request that finds its pool full waits in a bounded FIFO (10,000 per caller kind) with its
  own deadline: the agent's grpc-timeout less the stream handler's 5 s margin, or
  upstream_call_timeout_ms when it sent none (`queue_deadline`). A full queue refuses it at once
  (`queue_full`); a waiter whose deadline passes is refused (`deadline`) and is never sent, "so
  the server never registers an agent nobody is waiting for". A request whose deadline has
  already passed when it asks is refused the same way, even if a permit is free: nothing would be
  left of its deadline to send it with.
* A cancelled waiter frees its place at once; a cancelled or finished holder frees its permit and
  the next waiter is granted. `release` and `cancel` both free whatever the request holds; the
  two names say why the actor calls them.
* The permits in force follow the server's SETTINGS_MAX_CONCURRENT_STREAMS (`limits_for`). A
  lower limit takes nothing away: holders keep their permits, and nothing new is granted until
  fewer are held than the new limit.

Every operation ends with the pool "work conserving": a waiter is left queued only when its pool
(or the replay cap, or a live registration ahead of a replay) stops it from being granted.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable
from typing import Literal

import attrs

from actors.core import LogLine

__all__ = [
    "FLUSH_STREAMS",
    "GUARDIAN_STREAMS",
    "LIMITS_IN_FORCE",
    "LIMITS_LOWERED",
    "NOTIFY_STREAMS",
    "RESERVED_STREAMS",
    "STREAMS_TOO_FEW",
    "Caller",
    "DuplicateRequestError",
    "Granted",
    "Limits",
    "LimitsChanged",
    "PermitEffect",
    "PermitPolicy",
    "PermitPool",
    "Pool",
    "Queued",
    "Refused",
    "call_timeout",
    "limits_for",
    "policy_from_settings",
    "queue_deadline",
]

RequestId = Hashable
RefusalReason = Literal["queue_full", "deadline"]


class Pool(enum.Enum):
    """A permit class: the label of yuzu_gw_upstream_permits_held and _permit_limit."""

    REGISTER = "register"
    INVENTORY = "inventory"

    # Members are singletons compared by identity, so they hash by identity too: Enum's own
    # __hash__ is a Python call (the hash of the name), and the pool's tables are keyed by
    # these on every permit operation.
    __hash__ = object.__hash__


class Caller(enum.Enum):
    """Who asks. A replay draws from the register pool under its own cap."""

    REGISTER = "register"
    INVENTORY = "inventory"
    REPLAY = "replay"

    __hash__ = object.__hash__  # as Pool's

    @property
    def pool(self) -> Pool:
        return _POOL_OF[self]


_POOL_OF = {
    Caller.REGISTER: Pool.REGISTER,
    Caller.REPLAY: Pool.REGISTER,
    Caller.INVENTORY: Pool.INVENTORY,
}


# --- numbers ------------------------------------------------------------------------------------

# Streams kept for the lanes that take no permit (K18): the stream-status notifications (at most
# 10 in flight), the Guardian forwards (50 slots) and one heartbeat flush.
NOTIFY_STREAMS = 10
GUARDIAN_STREAMS = 50
FLUSH_STREAMS = 1
RESERVED_STREAMS = NOTIFY_STREAMS + GUARDIAN_STREAMS + FLUSH_STREAMS


def _at_least(lo: float) -> Callable[[object, attrs.Attribute[float], float], None]:
    def check(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
        if not value >= lo:
            raise ValueError(f"{attribute.name} must be >= {lo}, got {value!r}")

    return check


@attrs.frozen
class Limits:
    """Permits per pool, and the replay cap inside the register pool."""

    register: int = attrs.field(validator=_at_least(1))
    inventory: int = attrs.field(validator=_at_least(1))
    replay: int = attrs.field(validator=_at_least(1))

    def __attrs_post_init__(self) -> None:
        if self.replay > self.register:
            raise ValueError(f"replay cap {self.replay} above register permits {self.register}")

    def of(self, pool: Pool) -> int:
        return self.register if pool is Pool.REGISTER else self.inventory


@attrs.frozen
class PermitPolicy:
    """The regulator's numbers (seed: "Upstream call permits"), each with its reason."""

    # Little's law: a whole fleet of 5,000 re-registering inside the agent's 25 s (30 s less the
    # margin) is 200/s; at 50-200 ms a call that is 10-40 in flight, so 48 serves it with margin.
    register: int = attrs.field(default=48, validator=_at_least(1))
    # Daily-sync inventory reports are rare and large; a small pool keeps them from crowding
    # registrations out of the server's stream limit.
    inventory: int = attrs.field(default=8, validator=_at_least(1))
    # Half of register: a replay storm after a server restart can never take every permit from
    # agents that register live.
    replay: int = attrs.field(default=24, validator=_at_least(1))
    # 10,000 waiters per caller kind: bounds the decoded requests a flood of large Registers can
    # park here (the seed's "register wait queue (10000)").
    queue_max: int = attrs.field(default=10_000, validator=_at_least(1))
    # upstream_call_timeout_ms: the wait for a caller that sent no grpc-timeout; 25 s is the
    # agent's 30 s Register deadline less the handler margin.
    call_timeout_s: float = attrs.field(default=25.0, validator=_at_least(0.0))
    # The stream handler's margin: a queued request gives up this long before its agent does, so
    # the refusal reaches the agent while it still listens.
    handler_margin_s: float = attrs.field(default=5.0, validator=_at_least(0.0))
    # upstream_rpc_timeout_ms: the most one server call is given, whatever is left of the deadline.
    rpc_timeout_s: float = attrs.field(default=5.0, validator=_at_least(0.0))

    @property
    def configured(self) -> Limits:
        return Limits(self.register, self.inventory, min(self.replay, self.register))


# The register and replay keys are the seed's; upstream_register_concurrency and the others are
# declared, range-checked and logged once by the configuration (gateway/config/keys/upstream.py),
# so the policy takes typed values. The one rule that spans two keys lives here: the replay cap
# cannot exceed the register pool it draws from.
REPLAY_KEY = "upstream_replay_concurrency"
REGISTER_KEY = "upstream_register_concurrency"
_WHERE = "Upstream client tuning: "
REPLAY_ABOVE_REGISTER = (
    _WHERE + "{replay_key} is {replay}, above {register_key} ({register}); "
    "the default {default} (half of the register pool) is used instead"
)


def policy_from_settings(
    *,
    register: int,
    inventory: int,
    replay: int | None,
    queue_max: int,
    call_timeout_ms: int,
    rpc_timeout_ms: int,
) -> tuple[PermitPolicy, list[LogLine]]:
    """The policy from the settings as the configuration resolved them. `replay` None means
    unset: half of the register pool, so it shrinks with it. A replay cap above the register
    pool logs a WARN naming the key and takes that default."""
    lines: list[LogLine] = []
    default_replay = max(1, register // 2)
    if replay is None:
        replay = default_replay
    elif replay > register:
        text = REPLAY_ABOVE_REGISTER.format(
            replay_key=REPLAY_KEY,
            replay=replay,
            register_key=REGISTER_KEY,
            register=register,
            default=default_replay,
        )
        lines.append(LogLine("warning", text))
        replay = default_replay
    policy = PermitPolicy(
        register=register,
        inventory=inventory,
        replay=replay,
        queue_max=queue_max,
        call_timeout_s=call_timeout_ms / 1000.0,
        rpc_timeout_s=rpc_timeout_ms / 1000.0,
    )
    return policy, lines


def queue_deadline(now: float, grpc_timeout_s: float | None, policy: PermitPolicy) -> float:
    """When a request stops waiting for a permit: the agent's grpc-timeout less the handler's
    margin, or upstream_call_timeout_ms when the agent sent none (REG-04)."""
    if grpc_timeout_s is None:
        return now + policy.call_timeout_s
    return now + grpc_timeout_s - policy.handler_margin_s


def call_timeout(deadline: float, now: float, policy: PermitPolicy) -> float:
    """The grpc-timeout for the server call once granted: what is left of the deadline, at most
    upstream_rpc_timeout_ms (REG-07)."""
    return max(0.0, min(deadline - now, policy.rpc_timeout_s))


def limits_for(server_max_streams: int, configured: Limits) -> Limits:
    """The permits in force for a server that allows `server_max_streams` streams in total over
    the channel's connections (0: unknown, or no limit declared).

    61 streams are set aside for the lanes that take no permit. If the rest covers both pools
    they apply unchanged; otherwise the rest is split in proportion to the configured sizes
    (register rounded down, inventory the rest), each within [1, configured], and the replay cap
    is half of register (at least 1, at most its configured value)."""
    if server_max_streams < 0:
        raise ValueError(f"server_max_streams must be >= 0, got {server_max_streams}")
    if server_max_streams == 0:
        return configured
    left = server_max_streams - RESERVED_STREAMS
    wanted = configured.register + configured.inventory
    if left >= wanted:
        return configured
    left = max(left, 0)
    # left < wanted here, so register's share is below its configured size.
    register = max(left * configured.register // wanted, 1)
    # "the rest" after register's floor of one, so the two never promise more than is left
    # (except the floors of one each when fewer than two streams are left).
    inventory = min(max(left - register, 1), configured.inventory)
    replay = min(max(register // 2, 1), configured.replay)
    return Limits(register, inventory, replay)


# Log lines. The seed quotes the first words: "The server allows <N> concurrent streams on the
# gateway's connections; ..." (WARN), "Upstream permits in force: ..." and "Upstream permits
# lowered to the server's stream limit: ...". What follows those words is this rebuild's.
STREAMS_TOO_FEW = (
    "The server allows {n} concurrent streams on the gateway's connections; the gateway's other "
    "upstream lanes need {reserved} (10 stream-status notifications, 50 Guardian forwards, 1 "
    "heartbeat flush), so each permit pool is cut to 1 and those lanes can hit the server's limit "
    "too. Raise the server's --grpc-max-concurrent-streams (not the channel's pool_size)."
)
LIMITS_IN_FORCE = (
    "Upstream permits in force: register {register}, replay {replay}, inventory {inventory} "
    "(server stream limit: {limit})"
)
LIMITS_LOWERED = (
    "Upstream permits lowered to the server's stream limit: register {register} of {c_register}, "
    "replay {replay} of {c_replay}, inventory {inventory} of {c_inventory} (the server allows {n} "
    "concurrent streams; {reserved} are kept for the lanes that take no permit)"
)


# --- effects ------------------------------------------------------------------------------------


@attrs.frozen
class Granted:
    """Hand the permit to `request_id`; `waited_s` feeds yuzu_gw_upstream_permit_wait_seconds."""

    request_id: RequestId
    caller: Caller
    waited_s: float


@attrs.frozen
class Queued:
    """`request_id` waits; it will get a `Granted` or a `Refused` later."""

    request_id: RequestId
    caller: Caller
    deadline: float


@attrs.frozen
class Refused:
    """Answer `request_id` UNAVAILABLE and never send it (permit_refused_total{reason})."""

    request_id: RequestId
    caller: Caller
    reason: RefusalReason
    waited_s: float


@attrs.frozen
class LimitsChanged:
    """The permits in force changed: publish yuzu_gw_upstream_permit_limit and log `line`."""

    previous: Limits
    current: Limits
    server_max_streams: int
    line: LogLine


PermitEffect = Granted | Queued | Refused | LimitsChanged | LogLine


class DuplicateRequestError(ValueError):
    """A request id that already holds a permit or a place asked again."""


@attrs.define
class _Waiter:
    """One wait. Mutable on purpose: `live` goes False when it ends (granted, cancelled,
    expired), which marks its FIFO and heap entries stale without searching for them; a request
    id that asks again gets a new `_Waiter`."""

    request_id: RequestId
    caller: Caller
    deadline: float
    since: float
    live: bool = True


# Stale entries (granted, cancelled, expired) are dropped lazily from the FIFOs and the deadline
# heap; past this slack the structure is rebuilt, so neither grows without bound.
_COMPACT_SLACK = 64
# The order in which freed permits go to the heads: live registrations before replays.
_DISPATCH_ORDER = (Caller.REGISTER, Caller.REPLAY, Caller.INVENTORY)


# --- the core -----------------------------------------------------------------------------------


@attrs.define
class PermitPool:
    """Register and inventory permits, a bounded FIFO per caller kind with a deadline per waiter,
    and sizing from the server's stream limit. No clock inside: every method takes `now`."""

    policy: PermitPolicy = attrs.field(factory=PermitPolicy)
    limits: Limits = attrs.field(
        default=attrs.Factory(lambda self: self.policy.configured, takes_self=True)
    )
    server_max_streams: int = 0  # 0 = unknown
    # Who holds a permit, and for which caller kind (a replay's permit is a register one).
    _holders: dict[RequestId, Caller] = attrs.field(init=False, factory=dict)
    _waiters: dict[RequestId, _Waiter] = attrs.field(init=False, factory=dict)
    _fifo: dict[Caller, deque[_Waiter]] = attrs.field(
        init=False, factory=lambda: {caller: deque() for caller in Caller}
    )
    # (deadline, seq, waiter): seq keeps equal deadlines in arrival order and never compares
    # two waiters.
    _deadlines: list[tuple[float, int, _Waiter]] = attrs.field(init=False, factory=list)
    _held: dict[Pool, int] = attrs.field(init=False, factory=lambda: dict.fromkeys(Pool, 0))
    _replays_held: int = attrs.field(init=False, default=0)
    _waiting: dict[Caller, int] = attrs.field(init=False, factory=lambda: dict.fromkeys(Caller, 0))
    _seq: int = attrs.field(init=False, default=0)

    # -- reading (the gauges, and the slow-server sampler) --

    def held(self, pool: Pool) -> int:
        return self._held[pool]

    @property
    def replays_held(self) -> int:
        return self._replays_held

    def waiting(self, caller: Caller) -> int:
        return self._waiting[caller]

    @property
    def live_waiting(self) -> bool:
        """The "permits" lane is saturated: a live Register or inventory report waits (a waiting
        replay does not count; it waits behind live registrations by design)."""
        return self._waiting[Caller.REGISTER] > 0 or self._waiting[Caller.INVENTORY] > 0

    def holds(self, request_id: RequestId) -> bool:
        return request_id in self._holders

    def is_waiting(self, request_id: RequestId) -> bool:
        return request_id in self._waiters

    def next_deadline(self) -> float | None:
        """The earliest deadline of a waiter: when the actor should call `expire`. None when
        nobody waits or nobody has a finite deadline (a replay may wait without one)."""
        self._drop_stale_deadlines()
        if not self._deadlines or math.isinf(self._deadlines[0][0]):
            return None
        return self._deadlines[0][0]

    # -- operations --

    def acquire(
        self, request_id: RequestId, caller: Caller, deadline: float, now: float
    ) -> list[PermitEffect]:
        """Ask for a permit. The last effect is the requester's own answer (`Granted`, `Queued`
        or `Refused`); any before it refuse other waiters whose deadline had passed."""
        if request_id in self._holders or request_id in self._waiters:
            raise DuplicateRequestError(f"request {request_id!r} already holds or waits")
        effects: list[PermitEffect] = []
        if self._deadlines and self._deadlines[0][0] <= now:
            effects.extend(self.expire(now))
        if deadline <= now:
            effects.append(Refused(request_id, caller, "deadline", 0.0))
        elif self._grantable(caller) and not self._anyone_ahead(caller):
            effects.append(self._grant(request_id, caller, now, now))
        elif self._waiting[caller] >= self.policy.queue_max:
            effects.append(Refused(request_id, caller, "queue_full", 0.0))
        else:
            self._enqueue(request_id, caller, deadline, now)
            effects.append(Queued(request_id, caller, deadline))
        return effects

    def release(self, request_id: RequestId, now: float) -> list[PermitEffect]:
        """The call is done (or hands its permit back after too_many_streams): free the permit
        and grant the next waiters. Unknown ids are ignored, so a release that races the
        request's exit is harmless."""
        return self._free(request_id, now)

    def cancel(self, request_id: RequestId, now: float) -> list[PermitEffect]:
        """The agent's call was cancelled (stream reset, deadline, connection closed): a waiter
        frees its place at once, a holder its permit. A call already sent is not cancelled
        upstream; that is the actor's business."""
        return self._free(request_id, now)

    def expire(self, now: float) -> list[Refused]:
        """Refuse every waiter whose deadline has passed; none of them is ever sent."""
        refused: list[Refused] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            waiter = heapq.heappop(deadlines)[2]
            if not waiter.live:
                continue  # granted or cancelled since
            self._unqueue(waiter)
            refused.append(
                Refused(waiter.request_id, waiter.caller, "deadline", now - waiter.since)
            )
        return refused

    def set_server_max_streams(self, server_max_streams: int, now: float) -> list[PermitEffect]:
        """The channel's total of SETTINGS_MAX_CONCURRENT_STREAMS changed (0: unknown)."""
        new = limits_for(server_max_streams, self.policy.configured)
        effects: list[PermitEffect] = []
        too_few = 0 < server_max_streams < RESERVED_STREAMS
        if too_few and server_max_streams != self.server_max_streams:
            text = STREAMS_TOO_FEW.format(n=server_max_streams, reserved=RESERVED_STREAMS)
            effects.append(LogLine("warning", text))
        self.server_max_streams = server_max_streams
        if new != self.limits:
            previous, self.limits = self.limits, new
            effects.append(LimitsChanged(previous, new, server_max_streams, self._limits_line()))
        # A higher limit may let waiters in; a lower one revokes nothing.
        effects.extend(self._dispatch(now))
        return effects

    # -- internals --

    def _limits_line(self) -> LogLine:
        configured, now_in_force = self.policy.configured, self.limits
        if now_in_force == configured:
            n = self.server_max_streams
            limit = f"{n} concurrent streams" if n else "unknown"
            text = LIMITS_IN_FORCE.format(
                register=configured.register,
                replay=configured.replay,
                inventory=configured.inventory,
                limit=limit,
            )
        else:
            text = LIMITS_LOWERED.format(
                register=now_in_force.register,
                c_register=configured.register,
                replay=now_in_force.replay,
                c_replay=configured.replay,
                inventory=now_in_force.inventory,
                c_inventory=configured.inventory,
                n=self.server_max_streams,
                reserved=RESERVED_STREAMS,
            )
        return LogLine("info", text)

    def _grantable(self, caller: Caller) -> bool:
        if caller is Caller.INVENTORY:
            return self._held[Pool.INVENTORY] < self.limits.inventory
        if self._held[Pool.REGISTER] >= self.limits.register:
            return False
        return caller is not Caller.REPLAY or self._replays_held < self.limits.replay

    def _anyone_ahead(self, caller: Caller) -> bool:
        if self._waiting[caller] > 0:
            return True
        # Replays queue behind live registrations.
        return caller is Caller.REPLAY and self._waiting[Caller.REGISTER] > 0

    def _grant(self, request_id: RequestId, caller: Caller, since: float, now: float) -> Granted:
        self._holders[request_id] = caller
        self._held[_POOL_OF[caller]] += 1
        if caller is Caller.REPLAY:
            self._replays_held += 1
        return Granted(request_id, caller, now - since)

    def _enqueue(self, request_id: RequestId, caller: Caller, deadline: float, now: float) -> None:
        self._seq += 1
        waiter = _Waiter(request_id, caller, deadline, now)
        self._waiters[request_id] = waiter
        self._fifo[caller].append(waiter)
        self._waiting[caller] += 1
        heapq.heappush(self._deadlines, (deadline, self._seq, waiter))

    def _unqueue(self, waiter: _Waiter) -> None:
        # The FIFO and heap entries go stale; they are skipped when met and compacted in bulk.
        waiter.live = False
        del self._waiters[waiter.request_id]
        caller = waiter.caller
        self._waiting[caller] -= 1
        self._compact(caller)

    def _free(self, request_id: RequestId, now: float) -> list[PermitEffect]:
        caller = self._holders.pop(request_id, None)
        if caller is not None:
            self._held[_POOL_OF[caller]] -= 1
            if caller is Caller.REPLAY:
                self._replays_held -= 1
            return self._dispatch(now)
        waiter = self._waiters.get(request_id)
        if waiter is not None:
            self._unqueue(waiter)
            return self._dispatch(now)
        return []

    def _dispatch(self, now: float) -> list[PermitEffect]:
        """Refuse the expired, then grant heads while their pool allows: live registrations
        before replays, each kind first in first out."""
        effects: list[PermitEffect] = []
        if self._deadlines and self._deadlines[0][0] <= now:
            effects.extend(self.expire(now))
        if not self._waiters:
            return effects
        waiting = self._waiting
        for caller in _DISPATCH_ORDER:
            while waiting[caller] > 0 and self._grantable(caller):
                if caller is Caller.REPLAY and waiting[Caller.REGISTER] > 0:
                    break
                waiter = self._head(caller)
                self._unqueue(waiter)
                effects.append(self._grant(waiter.request_id, caller, waiter.since, now))
        return effects

    def _head(self, caller: Caller) -> _Waiter:
        fifo = self._fifo[caller]
        while not fifo[0].live:
            fifo.popleft()
        return fifo[0]

    def _drop_stale_deadlines(self) -> None:
        deadlines = self._deadlines
        while deadlines and not deadlines[0][2].live:
            heapq.heappop(deadlines)

    def _compact(self, caller: Caller) -> None:
        live = len(self._waiters)
        if len(self._deadlines) > 2 * live + _COMPACT_SLACK:
            self._deadlines = [e for e in self._deadlines if e[2].live]
            heapq.heapify(self._deadlines)
        fifo = self._fifo[caller]
        if len(fifo) > 2 * self._waiting[caller] + _COMPACT_SLACK:
            self._fifo[caller] = deque(w for w in fifo if w.live)
