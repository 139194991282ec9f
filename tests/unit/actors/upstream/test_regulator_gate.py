"""The regulator's permit gate (actors/upstream/regulator.py): request processes take and give
back permits with a plain call on the loop, and OTP's crash semantics still hold. A defect in a
gate operation ends the regulator as a crash, a regulator that ends however it ends answers its
waiters `unavailable`, and the permits its pool handed out do not leak into a restarted
regulator's pool. The permit rules themselves are in test_permits.py, the wiring through the
call path in test_regulator_actor.py."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from actors.core.permits import Caller, PermitPool
from actors.upstream.api import REGULATOR_NAME as REGULATOR
from actors.upstream.regulator import GetPermits, PermitSnapshot, Regulator, permit_gate
from gateway.node.children.upstream import regulator_args
from supervisors.address import Address
from supervisors.reason import ExitReason
from tests.support.actors import Harness, actor_test
from tests.unit.actors.upstream.test_regulator_actor import register, start
from tests.unit.actors.upstream.test_regulator_stopping import held_and_waiting, refused_reason


class BrokenPool(PermitPool):
    """A pool with a defect: asking for a permit raises."""

    def acquire(self, *args: Any) -> Any:
        raise RuntimeError("a defect, with request details that must not be logged")


@actor_test
async def test_taking_and_giving_back_permits_sends_the_regulator_no_message(h: Harness) -> None:
    actors, channel = start(h, "[{upstream_register_concurrency, 2}]")
    channel.latency["ProxyRegister"] = 0.01
    await h.settle()
    mailbox: list[int] = []
    calls = asyncio.gather(*(register(h, actors) for _ in range(6)))  # 2 hold, 4 wait
    while not calls.done():
        mailbox.append(h.base.mailbox_len(actors.regulator) or 0)
        await asyncio.sleep(0)
    await calls
    assert max(mailbox) == 0
    assert len(channel.calls()) == 6 and channel.peak_in_flight == 2


async def held_register_permits(h: Harness, regulator: Address) -> int:
    snapshot = await h.ask(regulator, GetPermits())
    assert isinstance(snapshot, PermitSnapshot)
    return snapshot.held["register"]


@actor_test
async def test_a_killed_regulator_answers_its_waiters_and_leaks_nothing(h: Harness) -> None:
    async with held_and_waiting(h, 1) as (actors, [waiter]):
        old_gate = permit_gate(h.base)
        h.base.kill(actors.regulator)  # no terminate: the waiter still hears of it
        assert await refused_reason(waiter) == "unavailable"
        assert permit_gate(h.base) is None
        assert old_gate is not None
        assert old_gate.acquire(0, Caller.REGISTER, h.loop.time() + 10.0) == "unavailable"
        restarted = h.create(Regulator, regulator_args(actors.ctx), REGULATOR)
        assert await held_register_permits(h, restarted) == 0
    # The holder gave its permit back to the pool it took it from, which nobody uses.
    await h.settle()
    assert await held_register_permits(h, restarted) == 0
    await register(h, actors)  # the restarted regulator's permit
    assert actors.channel is not None and len(actors.channel.calls()) == 2


@actor_test
async def test_a_defect_in_a_gate_operation_crashes_the_regulator(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    async with held_and_waiting(h, 1) as (actors, [waiter]):
        regulator: Regulator = h.instance(actors.regulator)
        reasons: list[ExitReason] = []
        h.base.monitor_callback(actors.regulator, reasons.append)
        regulator.pool = BrokenPool(regulator.pool.policy)
        with caplog.at_level(logging.ERROR, logger="supervisors.crash"):
            assert await refused_reason(asyncio.ensure_future(register(h, actors))) == "unavailable"
        # Ended as a crash in receiveMessage would end it: its supervisor restarts it.
        [reason] = reasons
        assert (reason.kind, reason.exc_class) == ("crash", "RuntimeError")
        assert not h.alive(actors.regulator)
        [line] = [r.getMessage() for r in caplog.records]
        assert line.startswith(f"actor {REGULATOR} ") and "crashed: crash: RuntimeError" in line
        assert "request details" not in line
        assert await refused_reason(waiter) == "unavailable"
