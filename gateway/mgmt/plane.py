"""What every handler of the ManagementService shares: the node's runtime, the metrics, one warn
limiter, and reading the one request message.

Crash containment is the agent plane's `guarded` (gateway/agent/plane.py): an exception that is
not a status the handler chose is answered INTERNAL with one line naming the method, the
exception class and the top frame, never the request (a command's parameters may be secrets).
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

import attrs
from google.protobuf.message import DecodeError, Message
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from actors.core.warn_limit import WarnLimiter
from gateway.mgmt.metrics import MgmtMetrics
from supervisors.runtime import LoopSystemBase

__all__ = ["MgmtPlane", "receive"]

log = logging.getLogger("yuzu_gw.mgmt")

M = TypeVar("M", bound=Message)


@attrs.define(eq=False)
class MgmtPlane:
    """One per node, built with the root supervisor's spec."""

    runtime: LoopSystemBase
    metrics: MgmtMetrics
    # One line per second per kind, shared by every management handler of the node (the seed's
    # safe-call limiter: at most one warning per second per called process).
    limiter: WarnLimiter = attrs.field(factory=WarnLimiter)

    def now(self) -> float:
        return self.runtime.loop.time()

    def warn(self, kind: object, line: str, *args: object) -> None:
        suffix = self.limiter.admit(kind, self.now())
        if suffix is not None:
            log.warning(line + "%s", *args, suffix)


async def receive(stream: Stream[M, Any]) -> M:
    """The one request message of a call; one that cannot be decoded is the caller's error."""
    try:
        request = await stream.recv_message()
    except DecodeError:
        raise GRPCError(Status.INVALID_ARGUMENT, "request cannot be decoded") from None
    if request is None:
        raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
    return request
