"""The pure parts of gRPC health and the RPC metrics: the per-service verdicts of the serving
board, the trailers' status, and the status an upstream failure is counted under."""

from __future__ import annotations

import asyncio

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from actors.node.api import Readiness
from gateway.listeners.grpc_health import MGMT_CHECKS, ReadinessCheck, ServingBoard
from gateway.listeners.rpc_metrics import _Trailers, split_path
from gateway.upstream.failures import ResponseTooLargeError
from gateway.upstream.rpc_metrics import client_code


def board_with(**checks: bool) -> tuple[ServingBoard, dict[str, bool]]:
    state = dict(checks)
    readiness = Readiness()
    for name in checks:
        readiness.register(name, lambda name=name: state[name])
    return ServingBoard(readiness, poll_s=0.01), state


def test_each_service_reads_its_own_checks_and_the_stop_turns_all_off() -> None:
    board, state = board_with(
        registry=True, sessions_index=True, agent_sup=True, router=True, memory_shedding=True
    )
    assert board.serving(None) and board.serving(MGMT_CHECKS)
    state["memory_shedding"] = False  # shedding: the whole server and agents, not management
    assert not board.serving(None)
    assert board.serving(MGMT_CHECKS)
    state["memory_shedding"] = True
    state["router"] = False  # management needs the router, and so does everything
    assert not board.serving(MGMT_CHECKS) and not board.serving(None)
    state["router"] = True
    board.stop_serving()
    assert not board.serving(None) and not board.serving(MGMT_CHECKS)


def test_a_watch_is_woken_by_a_change_and_at_once_by_the_stop() -> None:
    async def body() -> None:
        board, state = board_with(memory_shedding=True)
        check = ReadinessCheck(board, None)
        event = await check.__subscribe__()
        state["memory_shedding"] = False
        await asyncio.wait_for(event.wait(), 1)  # the poll saw it
        event.clear()
        state["memory_shedding"] = True
        await asyncio.wait_for(event.wait(), 1)
        event.clear()
        board.poll_s = 3600.0  # no poll now: only the stop can wake it
        await asyncio.sleep(0.02)
        board.stop_serving()
        assert event.is_set() and not check.__status__()
        await check.__unsubscribe__(event)
        assert board._poll is None  # the last watcher took the poll task with it

    asyncio.run(body())


def test_the_trailers_status_is_read_from_what_is_written() -> None:
    sent: list[tuple[list[tuple[str, str]], bool]] = []

    async def send(headers: list[tuple[str, str]], end_stream: bool = False) -> None:
        sent.append((headers, end_stream))

    async def body() -> None:
        trailers = _Trailers(send)
        await trailers([(":status", "200")])
        assert trailers.status is None
        await trailers([("grpc-status", "14"), ("grpc-retry-pushback-ms", "900")], end_stream=True)
        assert trailers.status is Status.UNAVAILABLE
        assert len(sent) == 2 and sent[1][1] is True

    asyncio.run(body())
    assert split_path("/yuzu.agent.v1.AgentService/Heartbeat") == (
        "yuzu.agent.v1.AgentService",
        "Heartbeat",
    )


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (None, Status.OK),
        (GRPCError(Status.NOT_FOUND, "x"), Status.NOT_FOUND),
        (GRPCError(Status.UNKNOWN, "Received :status = '503'"), Status.UNAVAILABLE),
        (GRPCError(Status.UNKNOWN, "Received :status = '404'"), Status.UNIMPLEMENTED),
        (TimeoutError(), Status.DEADLINE_EXCEEDED),
        (StreamTerminatedError("Connection lost"), Status.UNAVAILABLE),
        (ConnectionResetError(), Status.UNAVAILABLE),
        (ResponseTooLargeError(), Status.RESOURCE_EXHAUSTED),
        (asyncio.CancelledError(), Status.CANCELLED),
        (ValueError("x"), Status.INTERNAL),
    ],
)
def test_an_upstream_failure_is_counted_as_a_grpc_client_reports_it(
    error: BaseException | None, code: Status
) -> None:
    assert client_code(error) is code
