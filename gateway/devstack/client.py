"""A small ManagementService client for the dev stack's "send a command" line:

    python -c 'from gateway.devstack.client import broadcast; \
               broadcast("127.0.0.1:50063", "os", "info")'

`broadcast` sends one SendCommand to every online agent (empty `agent_ids`) and prints each
answer as it arrives, RUNNING frames included; with `pki=` the run directory's PKI it presents
the server leaf over mutual TLS (the gateway admits the Yuzu server's identity). The operator
CLI (`yuzu-gw-ctl`) replaces it for anything more than a try.

It speaks through the typed management API (betterproto2 classes and their grpclib stub,
`protos.typed`, docs/dev/protos.md) on the CLI's own channel (`gateway.ctl.connect`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from gateway.ctl.cli import Connection
from gateway.ctl.connect import open_channel
from protos.typed.yuzu.agent.v1 import CommandRequest, CommandResponseStatus
from protos.typed.yuzu.server.v1 import (
    ManagementServiceStub,
    SendCommandRequest,
    SendCommandResponse,
)

__all__ = ["STREAM_MARGIN_S", "broadcast", "connection", "send_command"]

# The gateway ends the stream at its own timeout; a little more covers the trip.
STREAM_MARGIN_S = 10


def connection(target: str, pki: str | Path | None = None) -> Connection:
    """The management listener at `target` (host:port): plaintext, or mutual TLS with the files
    of `pki` (ca.pem, server.pem, server.key)."""
    host, _, port = target.rpartition(":")
    if pki is None:
        return Connection(host.strip("[]"), int(port))
    directory = Path(pki)
    return Connection(
        host.strip("[]"),
        int(port),
        ca=directory / "ca.pem",
        cert=directory / "server.pem",
        key=directory / "server.key",
    )


async def send_command(
    target: str,
    plugin: str,
    action: str,
    *,
    agent_ids: Sequence[str] = (),
    parameters: Mapping[str, str] | None = None,
    timeout_s: int = 30,
    pki: str | Path | None = None,
) -> AsyncIterator[SendCommandResponse]:
    """SendCommand (every online agent when `agent_ids` is empty); yields the answers as they
    come until the gateway ends the stream (every target answered, or the timeout)."""
    request = SendCommandRequest(
        agent_ids=list(agent_ids),
        timeout_seconds=timeout_s,
        command=CommandRequest(
            command_id=uuid.uuid4().hex,
            plugin=plugin,
            action=action,
            parameters=dict(parameters or {}),
        ),
    )
    async with open_channel(connection(target, pki)) as channel:
        stub = ManagementServiceStub(channel)
        async for answer in stub.send_command(request, timeout=timeout_s + STREAM_MARGIN_S):
            yield answer


def _status_name(answer: SendCommandResponse) -> str:
    status = answer.response.status if answer.response is not None else None
    return status.name if isinstance(status, CommandResponseStatus) else str(status)


async def _broadcast(
    target: str, plugin: str, action: str, pki: str | Path | None, timeout_s: int
) -> None:
    counts: dict[str, int] = {}
    async for answer in send_command(target, plugin, action, pki=pki, timeout_s=timeout_s):
        status = _status_name(answer)
        counts[status] = counts.get(status, 0) + 1
        output = answer.response.output if answer.response is not None else ""
        print(f"{answer.agent_id}  {status:<8} {output}", flush=True)
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    print(f"-- {summary or 'no answer (no agent online?)'}", flush=True)


def broadcast(
    target: str, plugin: str, action: str, *, pki: str | Path | None = None, timeout_s: int = 30
) -> None:
    """Send to every online agent and print the answers, then a count by status."""
    asyncio.run(_broadcast(target, plugin, action, pki, timeout_s))
