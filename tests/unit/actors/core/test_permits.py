"""The upstream permit pool against the seed's rules (SPEC_INDEX REG-04..REG-14, K18, K20).

Example tests pin the sizing examples and log lines; the state machine drives arbitrary
acquisitions, releases, cancellations, time and server limits, and checks the rules after every
step against a plain model of who holds and who waits in which order.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from actors.core import LogLine
from actors.core.permits import (
    RESERVED_STREAMS,
    Caller,
    DuplicateRequestError,
    Granted,
    Limits,
    LimitsChanged,
    PermitPolicy,
    PermitPool,
    Pool,
    Queued,
    Refused,
    call_timeout,
    limits_for,
    policy_from_settings,
    queue_deadline,
)

CONFIGURED = PermitPolicy().configured
FAR = 1_000.0  # a deadline nobody reaches in these tests


def own(effects: list) -> object:
    return effects[-1]


# --- sizing -------------------------------------------------------------------------------------


def test_reserved_streams() -> None:
    assert RESERVED_STREAMS == 61  # 10 notifications + 50 Guardian forwards + 1 heartbeat flush


@pytest.mark.parametrize(
    ("streams", "expected"),
    [
        (128, Limits(register=48, inventory=8, replay=24)),  # the C++ default: unchanged
        (117, Limits(register=48, inventory=8, replay=24)),  # exactly 61 + 48 + 8
        (116, Limits(register=47, inventory=8, replay=23)),
        (100, Limits(register=33, inventory=6, replay=16)),  # the seed's example
        (62, Limits(register=1, inventory=1, replay=1)),
        (61, Limits(register=1, inventory=1, replay=1)),
        (50, Limits(register=1, inventory=1, replay=1)),
        (1, Limits(register=1, inventory=1, replay=1)),
        (0, Limits(register=48, inventory=8, replay=24)),  # unknown: the configured sizes
    ],
)
def test_limits_for(streams: int, expected: Limits) -> None:
    assert limits_for(streams, CONFIGURED) == expected


def test_negative_stream_limit_is_an_error() -> None:
    with pytest.raises(ValueError, match="server_max_streams"):
        limits_for(-1, CONFIGURED)


@given(
    streams=st.integers(0, 2000),
    register=st.integers(1, 200),
    inventory=st.integers(1, 50),
    replay_fraction=st.floats(0.0, 1.0),
)
@settings(max_examples=300)
def test_limits_for_rules(
    streams: int, register: int, inventory: int, replay_fraction: float
) -> None:
    replay = max(1, math.floor(register * replay_fraction))
    configured = Limits(register, inventory, replay)
    got = limits_for(streams, configured)
    left = streams - RESERVED_STREAMS
    assert 1 <= got.register <= register and 1 <= got.inventory <= inventory
    assert 1 <= got.replay <= min(replay, got.register)
    if streams == 0 or left >= register + inventory:
        assert got == configured
    else:
        assert got.register == max(1, max(left, 0) * register // (register + inventory))
        assert got.register + got.inventory <= max(left, 2)  # never above what is left
        assert got.replay == min(replay, max(1, got.register // 2))


def test_sizing_logs_and_warns() -> None:
    pool = PermitPool()
    assert pool.set_server_max_streams(128, 0.0) == []  # nothing changes at the C++ default
    effects = pool.set_server_max_streams(100, 0.0)
    assert effects == [
        LimitsChanged(
            CONFIGURED,
            Limits(33, 6, 16),
            100,
            LogLine(
                "info",
                "Upstream permits lowered to the server's stream limit: register 33 of 48, "
                "replay 16 of 24, inventory 6 of 8 (the server allows 100 concurrent streams; "
                "61 are kept for the lanes that take no permit)",
            ),
        )
    ]
    effects = pool.set_server_max_streams(50, 0.0)
    warning = effects[0]
    assert isinstance(warning, LogLine) and warning.level == "warning"
    assert warning.text.startswith(
        "The server allows 50 concurrent streams on the gateway's connections; "
    )
    assert pool.limits == Limits(1, 1, 1)
    # The same value again: no new warning, no change.
    assert pool.set_server_max_streams(50, 0.0) == []
    # Another value below 61: the warning follows the value, the limits stay.
    effects = pool.set_server_max_streams(40, 0.0)
    assert [type(e) for e in effects] == [LogLine]
    effects = pool.set_server_max_streams(0, 0.0)
    assert effects == [
        LimitsChanged(
            Limits(1, 1, 1),
            CONFIGURED,
            0,
            LogLine(
                "info",
                "Upstream permits in force: register 48, replay 24, inventory 8 "
                "(server stream limit: unknown)",
            ),
        )
    ]


# --- deadlines ----------------------------------------------------------------------------------


def test_queue_deadline_and_call_timeout() -> None:
    policy = PermitPolicy()
    assert queue_deadline(100.0, 30.0, policy) == 125.0  # 30 s grpc-timeout less the 5 s margin
    assert queue_deadline(100.0, None, policy) == 125.0  # upstream_call_timeout_ms, 25 s
    assert queue_deadline(100.0, 4.0, policy) == 99.0  # already past: refused, never sent
    assert call_timeout(125.0, 100.0, policy) == 5.0  # at most upstream_rpc_timeout_ms
    assert call_timeout(125.0, 122.0, policy) == 3.0  # what is left of the deadline
    assert call_timeout(125.0, 130.0, policy) == 0.0


# --- operations ---------------------------------------------------------------------------------


def small(**overrides: int) -> PermitPool:
    values = {"register": 2, "inventory": 1, "replay": 1, "queue_max": 3} | overrides
    return PermitPool(PermitPolicy(**values))


def test_grant_queue_release_in_fifo_order() -> None:
    pool = small()
    assert own(pool.acquire("a", Caller.REGISTER, FAR, 0.0)) == Granted("a", Caller.REGISTER, 0.0)
    assert own(pool.acquire("b", Caller.REGISTER, FAR, 0.0)) == Granted("b", Caller.REGISTER, 0.0)
    assert own(pool.acquire("c", Caller.REGISTER, FAR, 1.0)) == Queued("c", Caller.REGISTER, FAR)
    assert own(pool.acquire("d", Caller.REGISTER, FAR, 2.0)) == Queued("d", Caller.REGISTER, FAR)
    assert pool.live_waiting
    assert pool.release("a", 4.0) == [Granted("c", Caller.REGISTER, 3.0)]
    assert pool.release("b", 5.0) == [Granted("d", Caller.REGISTER, 3.0)]
    assert pool.held(Pool.REGISTER) == 2 and pool.waiting(Caller.REGISTER) == 0


def test_queue_bound() -> None:
    pool = small(register=1, queue_max=2)
    pool.acquire("h", Caller.REGISTER, FAR, 0.0)
    pool.acquire("w1", Caller.REGISTER, FAR, 0.0)
    pool.acquire("w2", Caller.REGISTER, FAR, 0.0)
    assert own(pool.acquire("w3", Caller.REGISTER, FAR, 0.0)) == Refused(
        "w3", Caller.REGISTER, "queue_full", 0.0
    )
    pool.cancel("w1", 0.0)  # a cancelled waiter frees its place at once
    assert isinstance(own(pool.acquire("w3", Caller.REGISTER, FAR, 0.0)), Queued)


def test_deadline_refuses_and_is_never_granted() -> None:
    pool = small(register=1)
    pool.acquire("h", Caller.REGISTER, FAR, 0.0)
    pool.acquire("late", Caller.REGISTER, 5.0, 0.0)
    pool.acquire("ok", Caller.REGISTER, 50.0, 1.0)
    assert pool.next_deadline() == 5.0
    assert pool.expire(4.9) == []
    assert pool.expire(5.0) == [Refused("late", Caller.REGISTER, "deadline", 5.0)]
    assert pool.next_deadline() == 50.0
    assert pool.release("h", 6.0) == [Granted("ok", Caller.REGISTER, 5.0)]


def test_release_refuses_expired_heads_instead_of_granting_them() -> None:
    pool = small(register=1)
    pool.acquire("h", Caller.REGISTER, FAR, 0.0)
    pool.acquire("late", Caller.REGISTER, 5.0, 0.0)
    pool.acquire("ok", Caller.REGISTER, 50.0, 0.0)
    assert pool.release("h", 6.0) == [
        Refused("late", Caller.REGISTER, "deadline", 6.0),
        Granted("ok", Caller.REGISTER, 6.0),
    ]


def test_a_request_out_of_time_is_refused_even_with_a_free_permit() -> None:
    pool = small()
    assert own(pool.acquire("x", Caller.REGISTER, 1.0, 1.0)) == Refused(
        "x", Caller.REGISTER, "deadline", 0.0
    )
    assert pool.held(Pool.REGISTER) == 0


def test_cancelled_holder_frees_its_permit() -> None:
    pool = small(register=1)
    pool.acquire("h", Caller.REGISTER, FAR, 0.0)
    pool.acquire("w", Caller.REGISTER, FAR, 0.0)
    assert pool.cancel("h", 1.0) == [Granted("w", Caller.REGISTER, 1.0)]
    assert pool.cancel("nobody", 1.0) == []
    assert pool.release("nobody", 1.0) == []


def test_duplicate_request_id() -> None:
    pool = small()
    pool.acquire("a", Caller.REGISTER, FAR, 0.0)
    with pytest.raises(DuplicateRequestError):
        pool.acquire("a", Caller.INVENTORY, FAR, 0.0)


def test_replays_are_capped_and_wait_behind_live_registrations() -> None:
    pool = small(register=3, replay=2)
    assert isinstance(own(pool.acquire("r1", Caller.REPLAY, FAR, 0.0)), Granted)
    assert isinstance(own(pool.acquire("r2", Caller.REPLAY, FAR, 0.0)), Granted)
    # The cap: a third replay waits although a register permit is free.
    assert isinstance(own(pool.acquire("r3", Caller.REPLAY, FAR, 0.0)), Queued)
    assert not pool.live_waiting  # a waiting replay does not make the lane saturated
    assert isinstance(own(pool.acquire("live1", Caller.REGISTER, FAR, 0.0)), Granted)
    assert isinstance(own(pool.acquire("live2", Caller.REGISTER, FAR, 1.0)), Queued)
    # A replay finishing frees a register permit: the live registration goes first.
    assert pool.release("r1", 2.0) == [Granted("live2", Caller.REGISTER, 1.0)]
    assert pool.release("live1", 3.0) == [Granted("r3", Caller.REPLAY, 3.0)]


def test_inventory_is_its_own_pool() -> None:
    pool = small(register=1, inventory=1)
    pool.acquire("reg", Caller.REGISTER, FAR, 0.0)
    assert isinstance(own(pool.acquire("inv", Caller.INVENTORY, FAR, 0.0)), Granted)
    assert isinstance(own(pool.acquire("inv2", Caller.INVENTORY, FAR, 0.0)), Queued)
    assert pool.release("reg", 1.0) == []


def test_lowering_takes_nothing_away() -> None:
    pool = PermitPool()
    for i in range(48):
        pool.acquire(i, Caller.REGISTER, FAR, 0.0)
    pool.acquire("waiter", Caller.REGISTER, FAR, 0.0)
    effects = pool.set_server_max_streams(100, 1.0)  # 33 register permits now
    assert [type(e) for e in effects] == [LimitsChanged]
    assert pool.held(Pool.REGISTER) == 48  # holders keep their permits
    for i in range(15):
        assert pool.release(i, 2.0) == []  # 47..33 held: still not below 33
    assert pool.release(15, 2.0) == [Granted("waiter", Caller.REGISTER, 2.0)]
    assert pool.held(Pool.REGISTER) == 33


def test_raising_the_limit_grants_waiters() -> None:
    pool = PermitPool()
    pool.set_server_max_streams(50, 0.0)
    pool.acquire("a", Caller.REGISTER, FAR, 0.0)
    pool.acquire("b", Caller.REGISTER, FAR, 0.0)
    effects = pool.set_server_max_streams(128, 1.0)
    assert effects[-1] == Granted("b", Caller.REGISTER, 1.0)


def test_too_many_streams_round_trip_goes_to_the_back_of_the_queue() -> None:
    pool = small(register=1)
    pool.acquire("a", Caller.REGISTER, FAR, 0.0)
    pool.acquire("b", Caller.REGISTER, FAR, 0.0)
    # "a" was refused locally with too_many_streams: it hands its permit back and re-asks.
    assert pool.release("a", 0.01) == [Granted("b", Caller.REGISTER, 0.01)]
    assert isinstance(own(pool.acquire("a", Caller.REGISTER, FAR, 0.02)), Queued)


def test_stale_entries_are_compacted() -> None:
    pool = small(register=1, queue_max=10_000)
    pool.acquire("h", Caller.REGISTER, FAR, 0.0)
    for i in range(1000):
        pool.acquire(i, Caller.REGISTER, FAR, 0.0)
        pool.cancel(i, 0.0)
    assert pool.waiting(Caller.REGISTER) == 0
    assert pool.next_deadline() is None
    assert len(pool._deadlines) < 200 and len(pool._fifo[Caller.REGISTER]) < 200


# --- configuration ------------------------------------------------------------------------------


def settings_(**overrides: int | None) -> tuple[PermitPolicy, list[LogLine]]:
    values: dict[str, int | None] = {
        "register": 48,
        "inventory": 8,
        "replay": None,
        "queue_max": 10_000,
        "call_timeout_ms": 25_000,
        "rpc_timeout_ms": 5_000,
    }
    values.update(overrides)
    return policy_from_settings(**values)  # type: ignore[arg-type]


def test_policy_from_settings() -> None:
    policy, warnings = settings_()
    assert policy == PermitPolicy() and warnings == []
    policy, warnings = settings_(register=20)
    assert policy.configured == Limits(20, 8, 10)  # replay defaults to half of register
    policy, warnings = settings_(queue_max=5, call_timeout_ms=10, replay=12)
    assert policy.configured == Limits(48, 8, 12) and policy.queue_max == 5
    assert policy.call_timeout_s == 0.01 and warnings == []


def test_a_replay_cap_above_the_register_pool_warns_and_takes_half() -> None:
    policy, warnings = settings_(register=20, replay=100)
    assert policy.configured == Limits(20, 8, 10)
    assert warnings == [
        LogLine(
            "warning",
            "Upstream client tuning: upstream_replay_concurrency is 100, above "
            "upstream_register_concurrency (20); the default 10 (half of the register pool) "
            "is used instead",
        )
    ]


# --- the state machine --------------------------------------------------------------------------

CALLERS = list(Caller)


class PermitMachine(RuleBasedStateMachine):
    """Checks, after every operation: the limits hold for every grant, replays stay under their
    cap and behind live registrations, each kind is served first in first out, the queue bound
    holds, nothing past its deadline is left waiting or granted, and the pool is work
    conserving (nobody waits who could be granted)."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = PermitPool(PermitPolicy(register=4, inventory=2, replay=2, queue_max=3))
        self.now = 0.0
        self.next_id = 0
        self.holders: dict[int, Caller] = {}
        self.queues: dict[Caller, list[tuple[int, float]]] = {c: [] for c in CALLERS}

    # -- helpers --

    def _waiter(self, request_id: int) -> tuple[Caller, float] | None:
        for caller, queue in self.queues.items():
            for rid, deadline in queue:
                if rid == request_id:
                    return caller, deadline
        return None

    def _apply(self, effects: list, acquirer: int | None = None) -> None:
        granted_pools = set()
        for effect in effects:
            if isinstance(effect, Granted):
                rid, caller = effect.request_id, effect.caller
                if rid != acquirer:
                    # From the queue: it must be the head of its kind, and a replay only when
                    # no live registration waits.
                    queue = self.queues[caller]
                    assert queue and queue[0][0] == rid, (rid, queue)
                    assert queue[0][1] > self.now  # never granted past its deadline
                    queue.pop(0)
                if caller is Caller.REPLAY:
                    assert not self.queues[Caller.REGISTER]
                self.holders[rid] = caller
                granted_pools.add(caller.pool)
                if caller is Caller.REPLAY:
                    granted_pools.add("replay")
            elif isinstance(effect, Refused):
                if effect.reason == "deadline" and effect.request_id != acquirer:
                    found = self._waiter(effect.request_id)
                    assert found is not None and found[1] <= self.now
                    self.queues[found[0]].remove((effect.request_id, found[1]))
                elif effect.reason == "queue_full":
                    assert effect.request_id == acquirer
                    assert len(self.queues[effect.caller]) == self.pool.policy.queue_max
            elif isinstance(effect, Queued):
                assert effect.request_id == acquirer
                self.queues[effect.caller].append((effect.request_id, effect.deadline))
        limits = self.pool.limits
        for pool in Pool:
            if pool in granted_pools:
                assert self.pool.held(pool) <= limits.of(pool)
        if "replay" in granted_pools:
            assert self.pool.replays_held <= limits.replay

    # -- rules --

    @rule(
        caller=st.sampled_from(CALLERS),
        timeout=st.sampled_from([-1.0, 0.0, 0.5, 1.0, 3.0, math.inf]),
    )
    def acquire(self, caller: Caller, timeout: float) -> None:
        rid = self.next_id
        self.next_id += 1
        effects = self.pool.acquire(rid, caller, self.now + timeout, self.now)
        last = effects[-1]
        assert getattr(last, "request_id", None) == rid
        if timeout <= 0:
            assert last == Refused(rid, caller, "deadline", 0.0)
        self._apply(effects, acquirer=rid)

    @precondition(lambda self: bool(self.holders))
    @rule(data=st.data(), how=st.sampled_from(["release", "cancel"]))
    def free_holder(self, data: st.DataObject, how: str) -> None:
        rid = data.draw(st.sampled_from(sorted(self.holders)))
        del self.holders[rid]
        self._apply(getattr(self.pool, how)(rid, self.now))

    @precondition(lambda self: any(self.queues.values()))
    @rule(data=st.data())
    def cancel_waiter(self, data: st.DataObject) -> None:
        waiting = sorted(rid for q in self.queues.values() for rid, _ in q)
        rid = data.draw(st.sampled_from(waiting))
        found = self._waiter(rid)
        assert found is not None
        effects = self.pool.cancel(rid, self.now)
        if (rid, found[1]) in self.queues[found[0]]:
            self.queues[found[0]].remove((rid, found[1]))
        self._apply(effects)
        assert not self.pool.is_waiting(rid)

    @rule(dt=st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        self._apply(list(self.pool.expire(self.now)))

    @rule(streams=st.sampled_from([0, 10, 61, 62, 63, 64, 65, 66, 67, 200]))
    def server_limit(self, streams: int) -> None:
        self._apply(self.pool.set_server_max_streams(streams, self.now))

    # -- invariants --

    @invariant()
    def books_balance(self) -> None:
        for pool in Pool:
            held = sum(1 for c in self.holders.values() if c.pool is pool)
            assert self.pool.held(pool) == held
        assert self.pool.replays_held == sum(1 for c in self.holders.values() if c is Caller.REPLAY)
        for caller in CALLERS:
            assert self.pool.waiting(caller) == len(self.queues[caller])
            assert self.pool.waiting(caller) <= self.pool.policy.queue_max
        assert all(self.pool.holds(rid) for rid in self.holders)

    @invariant()
    def nobody_waits_who_could_be_granted(self) -> None:
        limits = self.pool.limits
        register_full = self.pool.held(Pool.REGISTER) >= limits.register
        if self.queues[Caller.REGISTER]:
            assert register_full
        if self.queues[Caller.INVENTORY]:
            assert self.pool.held(Pool.INVENTORY) >= limits.inventory
        if self.queues[Caller.REPLAY]:
            assert (
                register_full
                or self.pool.replays_held >= limits.replay
                or bool(self.queues[Caller.REGISTER])
            )

    @invariant()
    def the_timer_is_the_earliest_deadline(self) -> None:
        deadlines = [d for q in self.queues.values() for _, d in q if d != math.inf]
        assert self.pool.next_deadline() == (min(deadlines) if deadlines else None)


TestPermitMachine = PermitMachine.TestCase
TestPermitMachine.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
