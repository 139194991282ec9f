"""The supervisor API for coroutines (gRPC handlers, the console, tests): each call is an
`ask` of the supervisor, answered after anything it is busy with, as in OTP."""

from __future__ import annotations

from typing import Any

from supervisors.address import Address
from supervisors.runtime import LoopSystemBase
from supervisors.supervisor import (
    ChildCounts,
    ChildInfo,
    CountChildren,
    DeleteChild,
    RestartChild,
    StartChild,
    SupReply,
    TerminateChild,
    WhichChildren,
)

DEFAULT_CALL_TIMEOUT_S = 5.0


class SupervisorError(Exception):
    """The supervisor refused: `error` is OTP's reason (`not_found`, `running`, ...)."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


async def _call(system: LoopSystemBase, sup: Address, request: Any, timeout: float | None) -> Any:
    reply: SupReply = await system.ask(sup, request, timeout)
    if not reply.ok:
        raise SupervisorError(reply.error)
    return reply.value


async def start_child(
    system: LoopSystemBase,
    sup: Address,
    spec_or_args: Any,
    timeout: float | None = DEFAULT_CALL_TIMEOUT_S,
) -> Address:
    address: Address = await _call(system, sup, StartChild(spec_or_args), timeout)
    return address


async def terminate_child(
    system: LoopSystemBase, sup: Address, child: str | Address, timeout: float | None = None
) -> None:
    await _call(system, sup, TerminateChild(child), timeout)


async def restart_child(
    system: LoopSystemBase,
    sup: Address,
    child_id: str,
    timeout: float | None = DEFAULT_CALL_TIMEOUT_S,
) -> Address:
    address: Address = await _call(system, sup, RestartChild(child_id), timeout)
    return address


async def delete_child(
    system: LoopSystemBase,
    sup: Address,
    child_id: str,
    timeout: float | None = DEFAULT_CALL_TIMEOUT_S,
) -> None:
    await _call(system, sup, DeleteChild(child_id), timeout)


async def which_children(
    system: LoopSystemBase, sup: Address, timeout: float | None = DEFAULT_CALL_TIMEOUT_S
) -> list[ChildInfo]:
    children: list[ChildInfo] = await _call(system, sup, WhichChildren(), timeout)
    return children


async def count_children(
    system: LoopSystemBase, sup: Address, timeout: float | None = DEFAULT_CALL_TIMEOUT_S
) -> ChildCounts:
    counts: ChildCounts = await _call(system, sup, CountChildren(), timeout)
    return counts
