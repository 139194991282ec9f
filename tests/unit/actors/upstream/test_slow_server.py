"""The slow-server duty cycle (seed: "What happens when the server restarts > Slow server"; K58,
M18, CB-17): the core against a millisecond model and at its edges (0.5 counts, bucket rollover,
the 1 s credit cap after a stalled loop, a low reading after a start), then the wiring: each
lane's owner publishes its saturation, the sampler reads it without a message and flips
`yuzu_gw_upstream_slow`, and a node runs the sampler without making it a readiness input.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from thespian.actors import ActorExitRequest

from actors.core.notify_store import MAX_INFLIGHT as NOTIFY_SLOTS
from actors.core.notify_store import Event
from actors.core.permits import Caller
from actors.core.slow_server import (
    BUCKET_MS,
    BUCKETS,
    MAX_CREDIT_MS,
    WINDOW_MS,
    LaneFlag,
    SlowLane,
    SlowServer,
)
from actors.upstream.api import PROXY_REGISTER, ForwardGuardian, Notify
from actors.upstream.api import SLOW_SERVER_NAME as NAME
from actors.upstream.guardian import MAX_INFLIGHT as GUARDIAN_SLOTS
from actors.upstream.slow_metrics import SLOW
from actors.upstream.slow_sampler import SlowSampler, SlowSamplerArgs, saturated_lanes
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2
from tests.support.actors import Harness, ManualClock, actor_test
from tests.support.fake_channel import (
    FakeChannel,
    UpstreamActors,
    start_upstream_actors,
    upstream_context,
)
from tests.support.node import http_get, running_node

# --- the core -----------------------------------------------------------------------------------


def model_saturated_ms(samples: list[tuple[int, bool]]) -> int:
    """Every millisecond, by brute force: each sample's state holds until the next sample, for at
    most MAX_CREDIT_MS; the window is the 60 whole-second buckets up to the last sample's."""
    saturated: set[int] = set()
    for (start, state), (end, _) in itertools.pairwise(samples):
        if state:
            saturated.update(range(start, min(end, start + MAX_CREDIT_MS)))
    head = samples[-1][0] // BUCKET_MS
    return sum(1 for ms in saturated if ms // BUCKET_MS > head - BUCKETS)


gaps = st.one_of(
    st.integers(0, 250),  # about the sampling interval
    st.integers(0, 3_000),  # a late sampler
    st.integers(0, 200_000),  # a stalled loop or a suspended VM
)


@settings(max_examples=300, deadline=None)
@given(
    start=st.integers(0, 10**9),
    steps=st.lists(st.tuples(gaps, st.booleans()), min_size=1, max_size=120),
)
def test_the_core_matches_a_millisecond_model(start: int, steps: list[tuple[int, bool]]) -> None:
    core = SlowServer()
    samples: list[tuple[int, bool]] = []
    t = start
    for gap, state in steps:
        t += gap
        samples.append((t, state))
        reading = core.sample(t / 1000, state)
        expected = model_saturated_ms(samples)
        assert reading.duty_cycle == expected / WINDOW_MS
        assert 0.0 <= reading.duty_cycle <= 1.0
        assert reading.slow is (2 * expected >= WINDOW_MS)


@settings(max_examples=200, deadline=None)
@given(start=st.integers(0, 10**9), stall_ms=st.integers(MAX_CREDIT_MS, 59_000))
def test_a_stalled_loop_credits_at_most_one_second(start: int, stall_ms: int) -> None:
    core = SlowServer()
    core.sample(start / 1000, True)
    reading = core.sample((start + stall_ms) / 1000, True)
    assert reading.duty_cycle == MAX_CREDIT_MS / WINDOW_MS
    assert not reading.slow


def test_thirty_seconds_stalled_is_not_thirty_seconds_saturated() -> None:
    core = SlowServer()
    core.sample(100.0, True)
    # Uncapped, this step alone would be a duty cycle of 0.5: a slow server.
    assert core.sample(130.0, False).duty_cycle == pytest.approx(1 / 60)


def test_exactly_half_counts_and_one_second_less_does_not() -> None:
    core = SlowServer()
    for second in range(60):
        reading = core.sample(float(second), second < 30)
    assert reading.duty_cycle == 0.5
    assert reading.slow
    # The next bucket pushes second 0 (saturated) out of the window.
    reading = core.sample(60.0, False)
    assert reading.duty_cycle == pytest.approx(29 / 60)
    assert not reading.slow


def test_buckets_roll_over_one_second_at_a_time() -> None:
    core = SlowServer()
    t = 0
    while t <= 10_000:  # saturated from 0 to 10 s, sampled every 100 ms
        core.sample(t / 1000, t < 10_000)
        t += 100
    readings: dict[int, float] = {}
    while t <= 75_000:
        readings[t] = core.sample(t / 1000, False).duty_cycle
        t += 100
    assert readings[59_900] == pytest.approx(10 / 60)  # buckets 0..59: all ten seconds
    assert readings[60_000] == pytest.approx(9 / 60)  # bucket 0 left the window
    assert readings[65_500] == pytest.approx(4 / 60)
    assert readings[69_000] == 0.0
    assert readings[75_000] == 0.0


def test_after_a_start_the_figure_can_only_read_low() -> None:
    core = SlowServer()
    assert core.sample(5.0, True).duty_cycle == 0.0  # the first sample credits nothing
    t = 5000
    while t < 34_900:
        t += 100
        assert not core.sample(t / 1000, True).slow, t
    # Saturated since the start: slow once half of a minute has passed, not before.
    assert core.sample(35.0, True).slow


def test_a_clock_that_goes_back_credits_nothing() -> None:
    core = SlowServer()
    core.sample(10.0, True)
    assert core.sample(9.0, True).duty_cycle == 0.0
    assert core.sample(10.5, True).duty_cycle == pytest.approx(0.5 / 60)


def test_a_lane_flag_publishes_changes_only() -> None:
    written: list[tuple[SlowLane, bool]] = []
    flag = LaneFlag(SlowLane.NOTIFY, lambda lane, value: written.append((lane, value)))
    for value in (False, True, True, False, False, True):
        flag.update(value)
    assert written == [
        (SlowLane.NOTIFY, True),
        (SlowLane.NOTIFY, False),
        (SlowLane.NOTIFY, True),
    ]


# --- the lanes publish, the sampler reads ---------------------------------------------------------


ONE_PERMIT = "[{upstream_register_concurrency, 1}]"


def start(h: Harness, config: str = "[]") -> tuple[UpstreamActors, FakeChannel]:
    channel = FakeChannel()
    channel.set_rule("NotifyStreamStatus", gateway_pb2.StreamStatusAck(acknowledged=True))
    channel.set_rule("ForwardGuardianMessage", gateway_pb2.ForwardGuardianAck(acknowledged=True))
    return start_upstream_actors(h.create, upstream_context(config), channel), channel


def notify(n: int) -> Notify:
    return Notify(
        agent_id=f"agent-{n}",
        session_id=f"gw-session-{n:032x}",
        stream_home_id=f"{n:032x}",
        event=Event.CONNECTED,
        peer_addr="10.0.0.1",
    )


def guard(n: int) -> ForwardGuardian:
    frame = agent_pb2.CommandResponse(plugin="__guard__", action="drift", output=f"event-{n}")
    return ForwardGuardian(agent_id=f"agent-{n}", response=frame)


async def register(h: Harness, actors: UpstreamActors) -> agent_pb2.RegisterResponse:
    return await actors.calls(h.base).call(
        Caller.REGISTER,
        PROXY_REGISTER,
        agent_pb2.RegisterRequest(),
        agent_pb2.RegisterResponse,
        grpc_timeout_s=None,
    )


async def lanes_become(h: Harness, expected: frozenset[SlowLane]) -> None:
    await h.wait_until(lambda: saturated_lanes(h.base) == expected, 2.0, f"lanes {expected}")


@actor_test
async def test_nothing_is_saturated_while_the_upstream_actors_are_idle_or_absent(
    h: Harness,
) -> None:
    assert saturated_lanes(h.base) == frozenset()  # no tables at all
    start(h)
    await h.settle()
    assert saturated_lanes(h.base) == frozenset()


@actor_test
async def test_a_live_register_waiting_for_a_permit_saturates_the_permits_lane(h: Harness) -> None:
    actors, channel = start(h, ONE_PERMIT)
    channel.freeze()
    holder = asyncio.create_task(register(h, actors))
    await h.wait_until(lambda: channel.in_flight == 1)
    await h.settle()
    assert saturated_lanes(h.base) == frozenset()  # one held, nobody waits
    waiter = asyncio.create_task(register(h, actors))
    await lanes_become(h, frozenset({SlowLane.PERMITS}))
    channel.unfreeze()
    await asyncio.gather(holder, waiter)
    await lanes_become(h, frozenset())


@actor_test
async def test_a_waiting_replay_does_not_saturate_the_permits_lane(h: Harness) -> None:
    actors, channel = start(h, ONE_PERMIT)
    channel.freeze()
    calls = actors.calls(h.base)

    async def replay() -> Any:
        return await calls.call(
            Caller.REPLAY,
            PROXY_REGISTER,
            agent_pb2.RegisterRequest(),
            agent_pb2.RegisterResponse,
            grpc_timeout_s=None,
        )

    holder = asyncio.create_task(register(h, actors))
    await h.wait_until(lambda: channel.in_flight == 1)
    waiter = asyncio.create_task(replay())
    await h.wait_until(lambda: h.instance(actors.regulator).pool.waiting(Caller.REPLAY) == 1)
    await h.settle()
    assert saturated_lanes(h.base) == frozenset()
    channel.unfreeze()
    await asyncio.gather(holder, waiter)


@actor_test
async def test_every_notification_slot_held_saturates_the_notify_lane(h: Harness) -> None:
    actors, channel = start(h)
    channel.freeze()
    for n in range(NOTIFY_SLOTS - 1):
        h.tell(actors.upstream, notify(n))
    await h.wait_until(lambda: channel.in_flight == NOTIFY_SLOTS - 1)
    await h.settle()
    assert saturated_lanes(h.base) == frozenset()
    h.tell(actors.upstream, notify(NOTIFY_SLOTS))
    await lanes_become(h, frozenset({SlowLane.NOTIFY}))
    channel.unfreeze()
    await lanes_become(h, frozenset())


@actor_test
async def test_every_guardian_slot_held_saturates_the_guardian_lane(h: Harness) -> None:
    actors, channel = start(h)
    channel.freeze()
    for n in range(GUARDIAN_SLOTS - 1):
        h.tell(actors.upstream, guard(n))
    await h.wait_until(lambda: channel.in_flight == GUARDIAN_SLOTS - 1)
    await h.settle()
    assert saturated_lanes(h.base) == frozenset()
    h.tell(actors.upstream, guard(GUARDIAN_SLOTS))
    await lanes_become(h, frozenset({SlowLane.GUARDIAN}))
    channel.unfreeze()
    await lanes_become(h, frozenset())


class SteppingClock(ManualClock):
    """Each reading is one second later: every sample of the sampler below is a one-second
    step, so a minute of window passes in 60 fast samples."""

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


class FastSampler(SlowSampler):
    interval_s: ClassVar[float] = 0.002
    clock = SteppingClock()

    def now(self) -> float:
        return self.clock()


def slow_gauge(actors: UpstreamActors) -> float | None:
    return actors.ctx.registry.get_sample_value(SLOW)


@actor_test
async def test_the_gauge_flips_to_one_at_half_a_minute_of_backpressure_and_back(
    h: Harness,
) -> None:
    actors, channel = start(h)
    sampler = h.create(FastSampler, SlowSamplerArgs(actors.ctx.registry), NAME)
    await h.settle()
    assert slow_gauge(actors) == 0.0
    channel.freeze()
    for n in range(NOTIFY_SLOTS):
        h.tell(actors.upstream, notify(n))
    await lanes_become(h, frozenset({SlowLane.NOTIFY}))
    await h.wait_until(lambda: slow_gauge(actors) == 1.0, 3.0, "slow")
    window = h.instance(sampler).window
    assert window.duty_cycle >= 0.5
    status = h.instance(sampler).format_status()
    assert status["slow"] is True and status["saturated_lanes"] == ["notify"]
    channel.unfreeze()
    await lanes_become(h, frozenset())
    await h.wait_until(lambda: slow_gauge(actors) == 0.0, 3.0, "not slow")
    assert window.duty_cycle < 0.5


@actor_test
async def test_a_sampler_that_ends_reads_zero(h: Harness) -> None:
    actors, channel = start(h, ONE_PERMIT)
    sampler = h.create(FastSampler, SlowSamplerArgs(actors.ctx.registry), NAME)
    channel.freeze()
    tasks = [asyncio.create_task(register(h, actors)) for _ in range(2)]
    await lanes_become(h, frozenset({SlowLane.PERMITS}))
    await h.wait_until(lambda: slow_gauge(actors) == 1.0, 3.0, "slow")
    h.tell(sampler, ActorExitRequest())
    await h.wait_until(lambda: not h.alive(sampler))
    assert slow_gauge(actors) == 0.0
    channel.unfreeze()
    await asyncio.gather(*tasks)


# --- in a node ----------------------------------------------------------------------------------


def test_a_node_runs_the_sampler_and_it_is_not_a_readiness_input(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as node:
            assert node.runtime is not None
            assert node.runtime.whereis(NAME) is not None
            _, body = await http_get(node.ctx.bound["metrics"][1], "/metrics")
            assert f"{SLOW} 0.0" in body.decode()
            _, body = await http_get(node.ctx.bound["health"][1], "/readyz")
            checks = json.loads(body)["checks"]
            assert not any("slow" in name for name in checks)

    asyncio.run(main())
