"""Operator log lines (SPEC_INDEX section 8) that only a node produces: a request process of the
agent plane writes them, through the plane's warn limiter. Each test triggers the condition over
the wire and finds the line, its level and, where the seed limits it, the suppressed-count
suffix. The table of every line and its test is in tests/unit/gateway/agent/test_log_lines.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import grpc
import pytest

from gateway.agent.register import REGISTRY_UNAVAILABLE_LOG
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.api import SupervisorError, terminate_child
from tests.integration.test_agent_plane import Metrics, agents, gateway, refused, run, until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

Code = grpc.StatusCode
AGENT_LOGGER = "yuzu_gw.agent"
UPSTREAM_LOGGER = "yuzu_gw.upstream"
# The seed's suffix ("Known limits", warn_limited), after one line held back.
ONE_SUPPRESSED = " (1 similar line(s) suppressed since the last)"
# A little over the limiter's one second.
PAST_THE_INTERVAL_S = 1.1


def lines(caplog: pytest.LogCaptureFixture, logger: str, contains: str) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == logger and contains in r.getMessage()
    ]


def test_l04_an_inventory_refused_before_forwarding_is_warn_limited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=AGENT_LOGGER)
    session = "gw-session-" + "e" * 32
    text = "ReportInventory refused before forwarding: no session held on this connection"

    async def body() -> None:
        async with gateway(tmp_path) as (node, _fake), agents(node) as [agent]:
            report = agent_pb2.InventoryReport(session_id=session)
            for _ in range(3):  # the first line at once, two held back
                assert (await refused(agent.inventory(report))).code() is Code.NOT_FOUND
            await asyncio.sleep(PAST_THE_INTERVAL_S)
            assert (await refused(agent.inventory(report))).code() is Code.NOT_FOUND

    run(body)
    first = f"{text} (unknown_session)"
    assert lines(caplog, AGENT_LOGGER, text) == [
        (logging.WARNING, first),
        (logging.WARNING, first + " (2 similar line(s) suppressed since the last)"),
    ]
    assert session not in caplog.text  # never the session id


def test_l16_upstream_register_failed_is_warn_limited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=AGENT_LOGGER)

    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            fake.fail("ProxyRegister", Code.INTERNAL, times=3, details="boom")
            for _ in range(2):
                assert (await refused(agent.register())).code() is Code.INTERNAL
            await asyncio.sleep(PAST_THE_INTERVAL_S)
            assert (await refused(agent.register())).code() is Code.INTERNAL

    run(body)
    first = "Upstream Register failed: status 13: boom"
    assert lines(caplog, AGENT_LOGGER, "Upstream Register failed") == [
        (logging.WARNING, first),
        (logging.WARNING, first + ONE_SUPPRESSED),
    ]


def test_l17_an_unencodable_register_is_internal_with_the_raised_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The seed's systematic-encoder-failure signature: Register answered INTERNAL and an
    `Upstream RPC <Method> raised <Class>:<Why>` line; the rebuild's INTERNAL details say why."""
    caplog.set_level(logging.WARNING, logger=UPSTREAM_LOGGER)

    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            request = agent_pb2.RegisterRequest(machine_certificate=b"x" * 4_194_304)
            request.info.agent_id = "agent-big"
            call = agent.unary("Register", agent_pb2.RegisterResponse)
            error = await refused(call(request, timeout=20.0))
            assert (error.code(), error.details()) == (
                Code.INTERNAL,
                "request larger than 4194304 bytes",
            )
            assert fake.calls("ProxyRegister") == []
            await until(lambda: bool(lines(caplog, UPSTREAM_LOGGER, "raised")), "the line")

    run(body)
    assert lines(caplog, UPSTREAM_LOGGER, "raised") == [
        (logging.WARNING, "Upstream RPC ProxyRegister raised error:request_too_large")
    ]


def test_l18_upstream_report_inventory_failed_is_warn_limited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=AGENT_LOGGER)

    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            session = (await agent.register()).session_id
            report = agent_pb2.InventoryReport(session_id=session)
            fake.fail("ProxyInventory", Code.INTERNAL, times=3, details="boom")
            for _ in range(2):
                assert (await refused(agent.inventory(report))).code() is Code.INTERNAL
            await asyncio.sleep(PAST_THE_INTERVAL_S)
            assert (await refused(agent.inventory(report))).code() is Code.INTERNAL

    run(body)
    first = "Upstream ReportInventory failed: status 13: boom"
    assert lines(caplog, AGENT_LOGGER, "Upstream ReportInventory failed") == [
        (logging.WARNING, first),
        (logging.WARNING, first + ONE_SUPPRESSED),
    ]


def test_l53_a_register_with_the_registry_down_names_only_the_class(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=AGENT_LOGGER)

    async def body() -> None:
        async with gateway(tmp_path) as (node, _fake), agents(node) as [agent]:
            assert node.runtime is not None and node.root is not None
            with contextlib.suppress(SupervisorError):
                await terminate_child(node.runtime, node.root, "registry")
            assert node.runtime.whereis("registry") is None
            for _ in range(3):  # one line a second for the called process
                error = await refused(agent.register("agent-secret-id"))
                assert (error.code(), error.details()) == (
                    Code.INTERNAL,
                    "Register failed: registry_unavailable",
                )

    run(body)
    assert lines(caplog, AGENT_LOGGER, "the registry call failed") == [
        (logging.WARNING, REGISTRY_UNAVAILABLE_LOG.format(cls="noproc"))
    ]
    assert "agent-secret-id" not in caplog.text


def test_agents_disconnected_total_counts_each_subscribed_stream_once(tmp_path: Path) -> None:
    """Not a log line: `yuzu_gw_agents_disconnected_total` (issue 10 §1) mirrors
    `yuzu_gw_agents_connected_total`, one count when a counted stream ends."""

    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node, 2) as [first, second]:
            start = await Metrics.read(node)
            assert start.value("yuzu_gw_agents_disconnected_total") == 0
            streams = []
            for agent, agent_id in ((first, "agent-1"), (second, "agent-2")):
                stream = agent.subscribe((await agent.register(agent_id)).session_id)
                await stream.initial_metadata()
                streams.append(stream)
            await fake.wait_for_calls("NotifyStreamStatus", count=2)
            # A refused Subscribe was never connected: not a disconnect either.
            assert (await second.subscribe("gw-session-" + "0" * 32).code()) is Code.NOT_FOUND
            held = await Metrics.read(node)
            assert held.delta(start, "yuzu_gw_agents_connected_total") == 2
            assert held.value("yuzu_gw_agents_disconnected_total") == 0
            streams[0].cancel()

            async def disconnected() -> float:
                return (await Metrics.read(node)).value("yuzu_gw_agents_disconnected_total")

            async with asyncio.timeout(5):
                while await disconnected() < 1:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # nothing more follows for the same stream
            assert await disconnected() == 1

    run(body)
