"""The handler-side pieces of the management plane, without a node: the operator sink's bounds
(gateway/mgmt/command.py), the end-of-command write grace, ListAgents paging
(gateway/mgmt/agents.py) and a watcher's bounded queue (actors/agents/watch.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from actors.agents.watch import WATCH_QUEUE_MAX, Watcher
from actors.router.api import RESPONSE_KINDS
from gateway.mgmt import command as mgmt_command
from gateway.mgmt.agents import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT, page, page_limit
from gateway.mgmt.command import PROGRESS_QUEUE_MAX, OperatorSink
from gateway.mgmt.metrics import COMMAND_OUTCOMES, MgmtMetrics, mgmt_metrics
from protos.yuzu.server.v1 import management_pb2 as mgmt
from supervisors.reason import KILLED


def metrics() -> tuple[CollectorRegistry, MgmtMetrics]:
    registry = CollectorRegistry()
    return registry, mgmt_metrics(registry)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def response(agent_id: str) -> mgmt.SendCommandResponse:
    return mgmt.SendCommandResponse(agent_id=agent_id)


async def drain(sink: OperatorSink) -> list[str]:
    out = []
    while (item := await sink.next()) is not None:
        out.append(item.agent_id)
    return out


# -- the operator sink --------------------------------------------------------------------------


def test_every_series_is_there_from_the_start() -> None:
    registry, _ = metrics()
    assert PROGRESS_QUEUE_MAX == 1024
    for outcome in COMMAND_OUTCOMES:
        assert sample(registry, "yuzu_gw_mgmt_commands_total", outcome=outcome) == 0
    for kind in RESPONSE_KINDS:
        assert sample(registry, "yuzu_gw_mgmt_command_responses_total", kind=kind) == 0
    for name in ("command_progress_dropped_total", "watch_events_dropped_total", "watchers"):
        assert sample(registry, f"yuzu_gw_mgmt_{name}") == 0


def test_progress_is_bounded_and_terminal_answers_never_dropped() -> None:
    async def body() -> None:
        registry, m = metrics()
        sink = OperatorSink(m, progress_max=2)
        for n in range(5):
            sink.put(response(f"r{n}"), "agent", final=False)
        for n in range(3):
            sink.put(response(f"t{n}"), "timeout", final=True)
        assert (
            sample(registry, "yuzu_gw_mgmt_command_progress_dropped_total") == 3
        )  # r2..r4: the queue held two RUNNING frames already
        assert await sink.next() is not None  # r0 written: room for one more RUNNING frame
        sink.put(response("r5"), "agent", final=False)
        sink.finish("timeout")
        sink.put(response("late"), "agent", final=True)  # after the end: nothing
        assert await drain(sink) == ["r1", "t0", "t1", "t2", "r5"]
        responses = "yuzu_gw_mgmt_command_responses_total"
        assert sample(registry, responses, kind="agent") == 3
        assert sample(registry, responses, kind="timeout") == 3
        assert sink.outcome == "timeout" and sink.failure is None

    asyncio.run(body())


def test_a_router_that_dies_ends_the_sink_with_its_class_only() -> None:
    async def body() -> None:
        sink = OperatorSink(metrics()[1])
        sink.put(response("a"), "agent", final=True)
        waiter = asyncio.ensure_future(drain(sink))
        await asyncio.sleep(0)
        sink.router_down(KILLED)
        sink.finish("completed")  # too late: the first end stands
        assert await asyncio.wait_for(waiter, 1) == ["a"]
        assert (sink.failure, sink.outcome) == ("killed", None)

    asyncio.run(body())


class StuckStream:
    """An operator stream nobody reads: every write waits for ever."""

    def __init__(self) -> None:
        self.sent = 0
        self.cancelled = False

    async def send_message(self, message: Any) -> None:
        if self.sent >= 1:
            await asyncio.Event().wait()
        self.sent += 1

    async def cancel(self) -> None:
        self.cancelled = True


def test_an_operator_that_stops_reading_is_reset_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mgmt_command, "END_WRITE_GRACE_S", 0.05)

    async def body() -> None:
        sink = OperatorSink(metrics()[1])
        stream = StuckStream()
        relay = asyncio.ensure_future(mgmt_command._relay(stream, sink))  # type: ignore[arg-type]
        for n in range(3):
            sink.put(response(f"a{n}"), "agent", final=True)
        await asyncio.sleep(0.2)
        # Before the end nothing is cut: the command's own timeout bounds the wait.
        assert not relay.done()
        sink.finish("completed")
        assert await asyncio.wait_for(relay, 1) == "stalled"
        assert stream.cancelled and stream.sent == 1

    asyncio.run(body())


# -- ListAgents paging -----------------------------------------------------------------------------


@given(st.integers(-(2**31), 2**31 - 1))
def test_page_limit(requested: int) -> None:
    assert (DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT) == (100, 1000)
    expected = requested if 1 <= requested <= 1000 else 100
    assert page_limit(requested) == expected


@given(st.sets(st.text(min_size=1, max_size=6)), st.integers(1, 7))
def test_walking_the_pages_lists_every_agent_once_in_bytewise_order(
    ids: set[str], limit: int
) -> None:
    seen: list[str] = []
    cursor = ""
    for _ in range(len(ids) + 2):
        chosen, cursor = page(ids, cursor, limit)
        assert len(chosen) <= limit
        seen += chosen
        if not cursor:
            break
        assert cursor == chosen[-1]
    assert seen == sorted(ids, key=lambda s: s.encode())


# -- a watcher's queue -----------------------------------------------------------------------------


def test_a_watcher_keeps_the_newest_and_counts_what_it_lost() -> None:
    async def body() -> None:
        registry, m = metrics()
        assert WATCH_QUEUE_MAX == 256
        watcher = Watcher(frozenset({"x"}), m.watch_dropped, maxlen=2)
        assert watcher.wants("x") and not watcher.wants("y")
        assert Watcher(frozenset(), m.watch_dropped).wants("anything")
        for n in range(4):
            watcher.offer(mgmt.AgentEvent(agent_id=f"e{n}"))
        assert sample(registry, "yuzu_gw_mgmt_watch_events_dropped_total") == 2
        assert [(await watcher.next()).agent_id for _ in range(2)] == ["e2", "e3"]
        later = asyncio.ensure_future(watcher.next())
        await asyncio.sleep(0)
        watcher.offer(mgmt.AgentEvent(agent_id="e4"))
        assert (await asyncio.wait_for(later, 1)).agent_id == "e4"

    asyncio.run(body())
