"""A small ManagementService client (grpcio) for the dev stack's "send a command" line:

    python -c 'from gateway.devstack.client import broadcast; \
               broadcast("127.0.0.1:50063", "os", "info")'

`broadcast` sends one SendCommand to every online agent (empty `agent_ids`) and prints each
answer as it arrives, RUNNING frames included; with `pki=` the run directory's PKI it presents
the server leaf over mutual TLS (the gateway admits the Yuzu server's identity). The operator
CLI (`yuzu-gw-ctl`) replaces it for anything more than a try.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import grpc

from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2

__all__ = ["SEND_COMMAND", "broadcast", "channel", "send_command"]

SEND_COMMAND = "/yuzu.server.v1.ManagementService/SendCommand"
Status = agent_pb2.CommandResponse.Status


def channel(target: str, pki: str | Path | None = None) -> grpc.Channel:
    """A channel to the management listener: plaintext, or mutual TLS with the files of `pki`
    (ca.pem, server.pem, server.key)."""
    if pki is None:
        return grpc.insecure_channel(target)
    directory = Path(pki)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(directory / "ca.pem").read_bytes(),
        private_key=(directory / "server.key").read_bytes(),
        certificate_chain=(directory / "server.pem").read_bytes(),
    )
    return grpc.secure_channel(target, credentials)


def send_command(
    target: str,
    plugin: str,
    action: str,
    *,
    agent_ids: Sequence[str] = (),
    parameters: Mapping[str, str] | None = None,
    timeout_s: int = 30,
    pki: str | Path | None = None,
) -> Iterator[management_pb2.SendCommandResponse]:
    """SendCommand (every online agent when `agent_ids` is empty); yields the answers as they
    come until the gateway ends the stream (every target answered, or the timeout)."""
    request = management_pb2.SendCommandRequest(
        agent_ids=list(agent_ids), timeout_seconds=timeout_s
    )
    command = request.command
    command.command_id = uuid.uuid4().hex
    command.plugin, command.action = plugin, action
    command.parameters.update(parameters or {})
    with channel(target, pki) as chan:
        call = chan.unary_stream(
            SEND_COMMAND,
            request_serializer=management_pb2.SendCommandRequest.SerializeToString,
            response_deserializer=management_pb2.SendCommandResponse.FromString,
        )
        # The gateway ends the stream at its own timeout; a little more covers the trip.
        yield from call(request, timeout=timeout_s + 10)


def broadcast(
    target: str, plugin: str, action: str, *, pki: str | Path | None = None, timeout_s: int = 30
) -> None:
    """Send to every online agent and print the answers, then a count by status."""
    counts: dict[str, int] = {}
    for answer in send_command(target, plugin, action, pki=pki, timeout_s=timeout_s):
        status = Status.Name(answer.response.status)
        counts[status] = counts.get(status, 0) + 1
        print(f"{answer.agent_id}  {status:<8} {answer.response.output}", flush=True)
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    print(f"-- {summary or 'no answer (no agent online?)'}", flush=True)
