"""The memory shedder actor against scripted listener actors and a fake memory reader: which
listeners it moves, readiness, metrics, the retry lines of a failing resume, adopting a listener
found suspended, and the modes in which it does not run (SPEC_INDEX MS-02..MS-04, MS-08..MS-10)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from prometheus_client import CollectorRegistry

from actors.listeners.api import (
    RUNNING,
    STATE_ROW,
    SUSPENDED,
    ListenerState,
    Resume,
    Suspend,
    actor_name,
    table_name,
)
from actors.memory.api import READINESS_CHECK
from actors.memory.api import SHEDDER_NAME as NAME
from actors.memory.shedder import MemoryShedder
from gateway.config.context import NodeContext
from gateway.config.keys import SCHEMA
from gateway.config.keys.shedder import MEMORY_SHEDDING, SheddingPlan, shared_by
from gateway.config.listener_spec import ListenerSpec
from gateway.config.resolve import resolve_section
from gateway.config.terms import parse_term
from gateway.config.vm_args import CookieSource, NodeArgs
from gateway.node import memory_reader
from gateway.node.children.memory import agent_listeners, shedder_args
from supervisors.address import Address
from supervisors.process import Process
from tests.support.actors import Harness, actor_test

AGENT = (
    "#{name => agent, service_protos => [agent_pb],"
    " services => #{'yuzu.agent.v1.AgentService' => yuzu_gw_agent_service},"
    " listen => #{port => 50051, ip => {127,0,0,1}}}"
)
MGMT = (
    "#{name => mgmt, service_protos => [management_pb],"
    " services => #{'yuzu.server.v1.ManagementService' => yuzu_gw_mgmt_service},"
    " listen => #{port => 50063, ip => {127,0,0,1}}}"
)
MARKS = "high_water_bytes => 1000, low_water_bytes => 800"
LOGGER = "yuzu_gw.memory_shedder"


@attrs.define
class Script:
    """What a fake listener does: fail the next `fail` resumes with `error`."""

    name: str
    state: str = RUNNING
    fail: int = 0
    error: str = "eaddrinuse"
    asked: list[str] = attrs.Factory(list)


class FakeListener(Process):
    """Publishes `listener:<name>` like the real listener and answers Suspend/Resume."""

    def init(self, script: Script) -> None:
        self.script = script
        self.table = self.new_table(table_name(script.name))
        self._publish()

    def _publish(self, error: str | None = None) -> ListenerState:
        row = ListenerState(self.script.name, self.script.state, ("127.0.0.1", 1), True)  # type: ignore[arg-type]
        self.table.insert(STATE_ROW, row)
        return attrs.evolve(row, error=error)

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        match msg:
            case Suspend():
                self.script.asked.append("suspend")
                self.script.state = SUSPENDED
                self.send(sender, self._publish())
            case Resume():
                self.script.asked.append("resume")
                if self.script.fail > 0:
                    self.script.fail -= 1
                    self.send(sender, self._publish(self.script.error))
                else:
                    self.script.state = RUNNING
                    self.send(sender, self._publish())


class Memory:
    """The fake reader: bytes in use, set by the test."""

    def __init__(self, used: int | None = 0) -> None:
        self.used = used

    def __call__(self) -> int | None:
        return self.used


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> Memory:
    fake = Memory()
    monkeypatch.setattr(memory_reader, "READER", fake)
    return fake


def context(
    tmp_path: Path, shedding: str = MARKS, listeners: str = f"{AGENT}, {MGMT}"
) -> NodeContext:
    text = (
        f"[{{grpc_listeners, [{listeners}]}}, {{allow_no_listeners, true}},"
        f" {{memory_shedding, #{{interval_ms => 20{', ' if shedding else ''}{shedding}}}}}]."
    )
    config = resolve_section(SCHEMA, parse_term(text), {}, "test.config")
    node = NodeArgs("gw@127.0.0.1", "test", "x" * 32, CookieSource.ENV, (), "vm.args")
    return NodeContext(config, node, tmp_path, CollectorRegistry())


def listener(h: Harness, script: Script) -> Script:
    h.create(FakeListener, script, actor_name(script.name))
    return script


def metric(ctx: NodeContext, name: str, **labels: str) -> float:
    value = ctx.registry.get_sample_value(name, labels)
    assert value is not None, name
    return value


async def until(predicate: Callable[[], bool], timeout: float = 3.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def ready(ctx: NodeContext) -> bool:
    return ctx.readiness.evaluate()[READINESS_CHECK]


@actor_test
async def test_a_node_of_a_multi_node_host_names_the_share_its_marks_are_of(
    h: Harness, tmp_path: Path, memory: Memory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    listener(h, Script("agent"))
    listener(h, Script("mgmt"))
    whole = context(tmp_path, shedding="")
    settings = shared_by(whole.config[MEMORY_SHEDDING], 2)
    config = whole.config.with_value(
        MEMORY_SHEDDING, settings, whole.config.source_of(MEMORY_SHEDDING)
    )
    ctx = NodeContext(config, whole.node, tmp_path, CollectorRegistry())
    h.create(MemoryShedder, shedder_args(ctx), NAME)
    assert settings.plan is not None and settings.plan.limit is not None
    limit = settings.plan.limit
    share = limit.limit_bytes // 2
    [line] = lines(caplog)
    assert line.startswith(
        f"gateway memory shedding: memory limit {limit.limit_bytes} bytes ({limit.source}),"
        f" shared by 2 nodes; high-water mark high_water_fraction 0.75 of the limit"
        f" = {int(0.75 * share)} bytes"
    ), line
    assert metric(ctx, "yuzu_gw_memory_shedding_high_water_bytes") == int(0.75 * share)


def test_only_agent_listeners_that_do_not_serve_management_are_shed() -> None:
    agent = ListenerSpec("a", ("agent_pb",), (("yuzu.agent.v1.AgentService", "m"),))
    mgmt = ListenerSpec("m", ("management_pb",), ())
    both = ListenerSpec("b", ("agent_pb", "management_pb"), ())
    assert agent_listeners((agent, mgmt, both)) == ("a",)


@actor_test
async def test_sheds_the_agent_listener_and_resumes_it_with_hysteresis(
    h: Harness, tmp_path: Path, memory: Memory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    agent, mgmt = listener(h, Script("agent")), listener(h, Script("mgmt"))
    ctx = context(tmp_path)
    h.create(MemoryShedder, shedder_args(ctx), NAME)
    assert (
        lines(caplog)
        == [
            "gateway memory shedding: memory limit "
            + f"{ctx.config[MEMORY_SHEDDING].plan.limit.limit_bytes} bytes"  # type: ignore[union-attr]
            + f" ({ctx.config[MEMORY_SHEDDING].plan.limit.source});"  # type: ignore[union-attr]
            " high-water mark high_water_bytes 1000 = 1000 bytes, low-water mark"
            " low_water_bytes 800 = 800 bytes; sampling RssAnon every 20 ms; agent listener(s):"
            " agent"
        ]
    )
    assert metric(ctx, "yuzu_gw_memory_shedding_high_water_bytes") == 1000
    assert metric(ctx, "yuzu_gw_memory_shedding_low_water_bytes") == 800
    assert metric(ctx, "yuzu_gw_memory_shedding_inactive") == 0
    assert ready(ctx)

    memory.used = 1000
    await until(lambda: agent.state == SUSPENDED)
    assert not ready(ctx)
    assert metric(ctx, "yuzu_gw_memory_shedding_active") == 1
    assert metric(ctx, "yuzu_gw_memory_shedding_suspensions_total") == 1
    memory.used = 900  # between the marks: nothing moves
    await asyncio.sleep(0.1)
    assert agent.state == SUSPENDED and agent.asked == ["suspend"]
    memory.used = 800
    await until(lambda: agent.state == RUNNING)
    await until(lambda: ready(ctx))
    assert metric(ctx, "yuzu_gw_memory_shedding_active") == 0
    assert metric(ctx, "yuzu_gw_memory_shedding_suspensions_total") == 1
    assert mgmt.asked == [] and mgmt.state == RUNNING  # never the management listener


@actor_test
async def test_a_resume_that_fails_is_retried_counted_and_logged(
    h: Harness, tmp_path: Path, memory: Memory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    agent = listener(h, Script("agent", fail=3))
    ctx = context(tmp_path, listeners=AGENT)
    h.create(MemoryShedder, shedder_args(ctx), NAME)
    memory.used = 2000
    await until(lambda: agent.state == SUSPENDED)
    memory.used = 0
    await until(
        lambda: metric(ctx, "yuzu_gw_memory_shedding_transition_failing", action="resume") == 1
    )
    # Not shedding any more: this check is green; the `listeners` check (not registered here)
    # stays red until the listener runs again (tests/integration/test_memory_shedding.py).
    assert ready(ctx)
    await until(lambda: agent.state == RUNNING)
    await until(
        lambda: metric(ctx, "yuzu_gw_memory_shedding_transition_failing", action="resume") == 0
    )
    assert metric(ctx, "yuzu_gw_memory_shedding_transition_failures_total", action="resume") == 3
    assert metric(ctx, "yuzu_gw_memory_shedding_transition_failures_total", action="suspend") == 0
    assert agent.asked == ["suspend", "resume", "resume", "resume", "resume"]
    logged = lines(caplog)
    assert "could not resume agent listener(s) agent (eaddrinuse); retrying every 20 ms" in logged
    # First failure only: the next line may come a minute later at the earliest.
    assert sum(line.startswith("could not resume") for line in logged) == 1
    assert logged[-1] == "agent listener(s) agent resumed after 3 failed attempt(s)"


@actor_test
async def test_a_restarted_shedder_adopts_a_suspended_listener(
    h: Harness, tmp_path: Path, memory: Memory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    agent = listener(h, Script("agent", state=SUSPENDED))
    ctx = context(tmp_path, listeners=AGENT)
    memory.used = 900
    h.create(MemoryShedder, shedder_args(ctx), NAME)
    assert lines(caplog)[0].endswith("; agent found suspended: treated as shed")
    assert not ready(ctx)
    assert metric(ctx, "yuzu_gw_memory_shedding_active") == 1
    await asyncio.sleep(0.1)
    assert agent.state == SUSPENDED and agent.asked == []
    memory.used = 800
    await until(lambda: agent.state == RUNNING)
    assert metric(ctx, "yuzu_gw_memory_shedding_suspensions_total") == 0  # it began before


@actor_test
async def test_a_listener_restarted_while_shedding_is_suspended_again(
    h: Harness, tmp_path: Path, memory: Memory
) -> None:
    agent = listener(h, Script("agent"))
    ctx = context(tmp_path, listeners=AGENT)
    h.create(MemoryShedder, shedder_args(ctx), NAME)
    memory.used = 5000
    await until(lambda: agent.state == SUSPENDED)
    address = h.base.whereis(actor_name("agent"))
    assert address is not None
    h.base.kill(address)
    successor = listener(h, Script("agent"))  # binds again: running
    await until(lambda: successor.state == SUSPENDED)
    assert successor.asked == ["suspend"]


@pytest.mark.parametrize(
    "case",
    [
        ("enabled => false", AGENT, 0, "gateway memory shedding is disabled", 0),
        (MARKS, MGMT, 0, "gateway memory shedding has no agent listener to shed", 0),
        (
            MARKS,
            AGENT,
            None,
            "gateway memory shedding is inactive: memory_sample_unavailable (set",
            1,
        ),
    ],
)
def test_modes_that_do_not_run(
    tmp_path: Path,
    memory: Memory,
    caplog: pytest.LogCaptureFixture,
    case: tuple[str, str, int | None, str, int],
) -> None:
    shedding, listeners, used, line, inactive = case
    memory.used = used

    @actor_test
    async def body(h: Harness) -> None:
        caplog.set_level(logging.INFO, LOGGER)
        ctx = context(tmp_path, shedding, listeners)
        h.create(MemoryShedder, shedder_args(ctx), NAME)
        assert lines(caplog)[0].startswith(line)
        assert metric(ctx, "yuzu_gw_memory_shedding_inactive") == inactive
        assert metric(ctx, "yuzu_gw_memory_shedding_high_water_bytes") == 0
        assert metric(ctx, "yuzu_gw_memory_shedding_active") == 0
        memory.used = 10**12
        await asyncio.sleep(0.1)
        assert ready(ctx)

    body()


@actor_test
async def test_an_unknown_limit_with_fractions_is_inactive(
    h: Harness, tmp_path: Path, memory: Memory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    ctx = context(tmp_path, "", AGENT)
    settings = ctx.config[MEMORY_SHEDDING]
    config = ctx.config.with_value(
        MEMORY_SHEDDING,
        attrs.evolve(settings, plan=SheddingPlan(None, None)),
        ctx.config.source_of(MEMORY_SHEDDING),
    )
    ctx = attrs.evolve(ctx, config=config)
    h.create(MemoryShedder, shedder_args(ctx), NAME)
    assert lines(caplog) == [
        "gateway memory shedding is inactive: memory_limit_unknown (set high_water_bytes and"
        " low_water_bytes below the memory the gateway may use; read at start, so restart the"
        " gateway; docs/memory-shedding.md)"
    ]
    assert metric(ctx, "yuzu_gw_memory_shedding_inactive") == 1
