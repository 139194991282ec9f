"""The `upstream` actor's wiring: outcomes told by the call path drive the breaker core, the
state is published where callers and /readyz read it, transitions are logged and counted.

The breaker's rules themselves are tested on the core (test_breaker.py); here a fake channel
plays the server and the real call path (gateway/upstream/calls.py) reports to the actor.
"""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest
from prometheus_client import CollectorRegistry

from actors.core.breaker import Lane, ResultKind, State
from actors.core.permits import Caller
from actors.upstream.actor import BreakerView, GetBreaker, Outcome, breaker_view, readiness_checks
from actors.upstream.api import PROXY_REGISTER, UpstreamCallError, UpstreamRefused
from protos.yuzu.agent.v1 import agent_pb2
from tests.support.actors import Harness, actor_test
from tests.support.fake_channel import (
    FakeChannel,
    UpstreamActors,
    start_upstream_actors,
    status_error,
    upstream_context,
)

UNAVAILABLE, INTERNAL = 14, 13
REQUEST_FAULTS = (3, 5, 6, 9, 11)
# A fast breaker: 100 ms open, doubling to 400 ms.
FAST = (
    "[{circuit_breaker_failure_threshold, 5}, {circuit_breaker_reset_timeout_ms, 100},"
    " {circuit_breaker_max_reset_timeout_ms, 400}]"
)
LOGGER = "yuzu_gw.upstream"


def start(h: Harness, config: str = FAST) -> tuple[UpstreamActors, FakeChannel]:
    channel = FakeChannel()
    actors = start_upstream_actors(h.create, upstream_context(config), channel)
    return actors, channel


async def register(h: Harness, actors: UpstreamActors) -> agent_pb2.RegisterResponse:
    calls = actors.calls(h.base)
    return await calls.call(
        Caller.REGISTER,
        PROXY_REGISTER,
        agent_pb2.RegisterRequest(),
        agent_pb2.RegisterResponse,
        grpc_timeout_s=None,
    )


async def failing_register(h: Harness, actors: UpstreamActors) -> UpstreamCallError:
    with pytest.raises(UpstreamCallError) as caught:
        await register(h, actors)
    return caught.value


def state(h: Harness) -> State:
    view = breaker_view(h.base)
    assert view is not None
    return view.state


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def messages(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


@actor_test
async def test_five_failures_open_it_and_calls_are_refused_without_reaching_the_channel(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    actors, channel = start(h)
    checks = readiness_checks(h.base)
    assert checks["circuit_breaker"]() and checks["upstream"]()
    channel.set_rule("ProxyRegister", status_error(UNAVAILABLE, "server down"))
    for _ in range(4):
        await failing_register(h, actors)
    await h.settle()
    assert state(h) is State.CLOSED  # four is not yet the threshold
    error = await failing_register(h, actors)
    assert (error.kind, error.status) == (ResultKind.STATUS, UNAVAILABLE)
    await h.settle()

    assert state(h) is State.OPEN
    assert not checks["circuit_breaker"]()
    with pytest.raises(UpstreamRefused) as refused:
        await register(h, actors)
    assert refused.value.reason == "circuit_open"
    assert len(channel.calls()) == 5  # the refused call never reached the channel
    assert (logging.WARNING, "Circuit breaker: OPEN (will probe in 100ms)") in messages(caplog)
    registry = actors.ctx.registry
    assert sample(registry, "yuzu_gw_upstream_circuit_breaker_state", state="open") == 1
    assert sample(registry, "yuzu_gw_upstream_circuit_breaker_state", state="closed") == 0
    transitions = "yuzu_gw_upstream_circuit_breaker_transitions_total"
    assert sample(registry, transitions, **{"from": "closed", "to": "open"}) == 1
    errors = "yuzu_gw_upstream_rpc_errors_total"
    assert sample(registry, errors, code="unavailable", rpc_name="register") == 5
    # a circuit_open refusal never reaches the call, so it is not an RPC error
    assert (
        sum(
            s.value
            for m in registry.collect()
            if m.name == "yuzu_gw_upstream_rpc_errors"
            for s in m.samples
            if s.name.endswith("_total")
        )
        == 5
    )
    # "Upstream RPC <Method> failed: <Status> <message>", not limited for other statuses
    failed = [m for level, m in messages(caplog) if m.startswith("Upstream RPC ProxyRegister")]
    assert failed == ["Upstream RPC ProxyRegister failed: UNAVAILABLE server down"] * 5


@actor_test
async def test_the_reset_timeout_passes_and_a_probe_closes_it(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    actors, channel = start(h)
    channel.fail("ProxyRegister", status_error(INTERNAL), times=5)
    for _ in range(5):
        await failing_register(h, actors)
    await h.settle()
    opened = h.loop.time()
    assert state(h) is State.OPEN

    # The actor's own timer moves it to half-open when the 100 ms have passed, with no call.
    await h.wait_until(lambda: state(h) is State.HALF_OPEN, timeout=1.0)
    assert h.loop.time() - opened >= 0.09
    assert readiness_checks(h.base)["circuit_breaker"]()  # only OPEN fails readiness
    response = await register(h, actors)  # the probe: the fake answers OK by default
    assert isinstance(response, agent_pb2.RegisterResponse)
    await h.settle()

    assert state(h) is State.CLOSED
    lines = [m for _, m in messages(caplog) if m.startswith("Circuit breaker")]
    assert lines == [
        "Circuit breaker: OPEN (will probe in 100ms)",
        "Circuit breaker: open -> half_open (probing)",
        "Circuit breaker: half_open -> closed (probe succeeded)",
    ]


@actor_test
async def test_a_failed_probe_reopens_with_a_doubled_reset_timeout(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    actors, channel = start(h)
    channel.set_rule("ProxyRegister", status_error(UNAVAILABLE))
    for _ in range(5):
        await failing_register(h, actors)
    for expected_ms in (200, 400, 400):  # doubling, capped at the maximum
        await h.wait_until(lambda: state(h) is State.HALF_OPEN, timeout=2.0)
        await failing_register(h, actors)
        await h.settle()
        assert state(h) is State.OPEN
        view = await h.ask(actors.upstream, GetBreaker())
        assert isinstance(view, BreakerView) and view.reset_s == expected_ms / 1000
    reopened = [m for _, m in messages(caplog) if "half_open -> open" in m]
    assert reopened == [
        "Circuit breaker: half_open -> open (probe failed: unavailable; will probe in 200ms)",
        "Circuit breaker: half_open -> open (probe failed: unavailable; will probe in 400ms)",
        "Circuit breaker: half_open -> open (probe failed: unavailable; will probe in 400ms)",
    ]


@actor_test
async def test_neutral_statuses_never_move_it(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    actors, channel = start(h)
    # Many request faults in a row: not failures.
    for code in REQUEST_FAULTS * 3:
        channel.fail("ProxyRegister", status_error(code, "bad request"))
        await failing_register(h, actors)
    await h.settle()
    assert state(h) is State.CLOSED
    # Nor successes: four failures, request faults, one more failure opens it.
    channel.fail("ProxyRegister", status_error(UNAVAILABLE), times=4)
    for _ in range(4):
        await failing_register(h, actors)
    for code in REQUEST_FAULTS:
        channel.fail("ProxyRegister", status_error(code))
        await failing_register(h, actors)
    await h.settle()
    assert state(h) is State.CLOSED
    channel.fail("ProxyRegister", status_error(UNAVAILABLE))
    await failing_register(h, actors)
    await h.settle()
    assert state(h) is State.OPEN
    # Half-open: request faults neither close nor reopen it.
    await h.wait_until(lambda: state(h) is State.HALF_OPEN, timeout=1.0)
    for code in REQUEST_FAULTS:
        channel.fail("ProxyRegister", status_error(code))
        await failing_register(h, actors)
    await h.settle()
    assert state(h) is State.HALF_OPEN
    # The request-fault lines are rate limited (one per second per kind).
    invalid = [m for _, m in messages(caplog) if "failed: INVALID_ARGUMENT" in m]
    assert invalid == ["Upstream RPC ProxyRegister failed: INVALID_ARGUMENT bad request"]
    errors = "yuzu_gw_upstream_rpc_errors_total"
    assert sample(actors.ctx.registry, errors, code="invalid_argument", rpc_name="register") == 5


@actor_test
async def test_too_many_streams_is_retried_and_never_counted(h: Harness) -> None:
    actors, channel = start(h)
    channel.fail(
        "ProxyRegister", UpstreamCallError(ResultKind.TOO_MANY_STREAMS), times=6
    )  # more than the threshold
    started = h.loop.time()
    await register(h, actors)
    await h.settle()
    # 10 + 20 + 40 + 80 + 100 + 100 ms of backoff between the six refusals
    assert h.loop.time() - started >= 0.33
    assert state(h) is State.CLOSED
    assert h.instance(actors.upstream).breaker.failures == 0
    errors = "yuzu_gw_upstream_rpc_errors_total"
    assert sample(actors.ctx.registry, errors, code="too_many_streams", rpc_name="register") == 6


@actor_test
async def test_an_exception_out_of_the_channel_is_a_failure_named_by_class_only(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    actors, channel = start(h)

    def explode(_request: object) -> agent_pb2.RegisterResponse:
        raise KeyError("enrollment-token-secret")

    channel.set_rule("ProxyRegister", explode)
    error = await failing_register(h, actors)
    assert (error.kind, error.detail) == (ResultKind.EXCEPTION, "KeyError")
    await h.settle()
    assert h.instance(actors.upstream).breaker.failures == 1
    assert "secret" not in caplog.text
    assert "Upstream RPC ProxyRegister raised exception:KeyError" in caplog.text


@actor_test
async def test_outcomes_of_an_earlier_period_or_actor_are_ignored(h: Harness) -> None:
    actors, _ = start(h, "[{circuit_breaker_failure_threshold, 1}]")
    view = breaker_view(h.base)
    assert view is not None
    failure = Outcome(
        view.incarnation, view.epoch, Lane.REGISTER, PROXY_REGISTER, ResultKind.TIMEOUT
    )
    stale = Outcome(view.incarnation + 1000, 0, Lane.REGISTER, PROXY_REGISTER, ResultKind.TIMEOUT)
    h.tell(actors.upstream, stale)
    await h.settle()
    assert state(h) is State.CLOSED
    h.tell(actors.upstream, failure)
    await h.settle()
    assert state(h) is State.OPEN
    h.tell(actors.upstream, failure)  # admitted while closed: that period is over
    await h.settle()
    assert h.instance(actors.upstream).breaker.epoch == 1


@actor_test
async def test_status_shows_counts_and_the_state_is_gone_with_the_actor(h: Harness) -> None:
    actors, _ = start(h)
    status = h.instance(actors.upstream).format_status()
    assert status["breaker"] == "closed" and status["reset_ms"] == 100
    await h.base.stop(actors.upstream, 1.0)
    checks = readiness_checks(h.base)
    assert breaker_view(h.base) is None
    assert not checks["upstream"]() and checks["circuit_breaker"]()
    with pytest.raises(UpstreamRefused) as refused:
        await register(h, actors)
    assert refused.value.reason == "unavailable"


@actor_test
async def test_a_call_left_by_its_caller_still_reports_its_outcome(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    actors, channel = start(h, "[{circuit_breaker_failure_threshold, 1}]")
    channel.freeze()
    channel.set_rule("ProxyRegister", status_error(UNAVAILABLE))
    task = asyncio.create_task(register(h, actors))
    await h.wait_until(lambda: channel.in_flight == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert channel.in_flight == 1  # the call already sent is not cancelled
    channel.unfreeze()
    await h.wait_until(lambda: state(h) is State.OPEN, timeout=1.0)
    await asyncio.sleep(0)
    gc.collect()  # its error was retrieved: asyncio has nothing to complain about
    assert "never retrieved" not in caplog.text


@actor_test
async def test_transport_failure_lines_are_limited_to_one_a_second_per_kind(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    # A threshold no storm reaches here: every call is sent and fails on the transport.
    actors, channel = start(h, "[{circuit_breaker_failure_threshold, 1000}]")
    refused = UpstreamCallError(ResultKind.TRANSPORT, detail="econnrefused")
    channel.set_rule("ProxyRegister", refused)
    started = h.loop.time()
    for _ in range(100):
        await failing_register(h, actors)
    channel.set_rule("ProxyRegister", UpstreamCallError(ResultKind.TIMEOUT, detail="deadline"))
    for _ in range(10):
        await failing_register(h, actors)
    await h.settle()
    assert h.loop.time() - started < 1.0, "the storm must fit in one limiter interval"
    lines = [m for _, m in messages(caplog) if m.startswith("Upstream RPC ProxyRegister")]
    # One line per kind (a method and its failure code) a second...
    assert lines == [
        "Upstream RPC ProxyRegister failed: transport econnrefused",
        "Upstream RPC ProxyRegister failed: timeout deadline",
    ]
    errors = "yuzu_gw_upstream_rpc_errors_total"
    assert sample(actors.ctx.registry, errors, code="transport", rpc_name="register") == 100
    assert sample(actors.ctx.registry, errors, code="timeout", rpc_name="register") == 10
    # ...and the next one after the interval says how many were held back.
    await asyncio.sleep(max(0.0, started + 1.05 - h.loop.time()))
    channel.set_rule("ProxyRegister", refused)
    await failing_register(h, actors)
    await h.settle()
    lines = [m for _, m in messages(caplog) if m.startswith("Upstream RPC ProxyRegister")]
    assert lines[-1] == (
        "Upstream RPC ProxyRegister failed: transport econnrefused"
        " (99 similar line(s) suppressed since the last)"
    )
