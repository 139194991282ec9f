"""Text that is not valid UTF-8, in every request the agent and management listeners take, on a
real node: grpcio clients send protobuf bytes built by hand (a valid message whose placeholder
text is overwritten with 0xFF bytes of the same length, which the generated classes refuse to
parse), and each answer is the status the manual names for that field, never INTERNAL for a
request the manual answers otherwise, and never a traceback in the log.

The rules (seed: "Heartbeat Batching" > chunked flush, "Heartbeat admission", "Known limits";
docs/agent-plane.md, docs/management-plane.md):

- a heartbeat tag: kept with the bytes replaced, counted heartbeat_invalid, session online;
- a session id (Heartbeat, ReportInventory, Subscribe's x-yuzu-session-id): not one this node
  holds, so the method's own unknown-session answer;
- an agent id over 256 bytes: INVALID_ARGUMENT before anything else; any other Register or
  inventory text: INTERNAL, refused locally, breaker-neutral (the seed's encode refusal);
- a Subscribe frame: delivered with the bytes replaced, the stream stays open;
- a management request: INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
from google.protobuf.message import DecodeError, Message

from actors.registry.api import agent_session
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2 as mgmt
from tests.integration.test_agent_plane import (
    UNKNOWN_SESSION,
    Agent,
    Metrics,
    agents,
    gateway,
    refused,
    run,
    until,
)
from tests.integration.test_management_plane import collect, command, connect, operator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(40)]

Code = grpc.StatusCode
S = agent_pb2.CommandResponse.Status
DEADLINE_S = 20.0
PLACEHOLDER = "Q" * 6
BAD = b"\xff" * len(PLACEHOLDER)
REPAIRED = "\ufffd" * len(PLACEHOLDER)


def invalid(message: Message, placeholder: str = PLACEHOLDER) -> bytes:
    """`message` on the wire with its one `placeholder` text replaced by 0xFF bytes."""
    data = message.SerializeToString()
    assert data.count(placeholder.encode()) == 1
    data = data.replace(placeholder.encode(), b"\xff" * len(placeholder))
    with pytest.raises(DecodeError):
        type(message).FromString(data)  # what upb refuses, and why the node used to
    return data


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        assert record.exc_info is None and "Traceback" not in record.getMessage()
        assert record.levelno < logging.ERROR, record.getMessage()


async def call(agent: Agent, method: str, data: bytes, response: type[Any]) -> Any:
    return await agent.unary(method, response)(data, timeout=DEADLINE_S)


# -- Heartbeat -----------------------------------------------------------------------------------


def test_a_heartbeat_with_an_invalid_tag_is_kept_repaired_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            stream = await connect(node, agent, "agent-1")
            session = fake.session_of("agent-1")
            assert session is not None
            before = await Metrics.read(node)
            heartbeat = agent_pb2.HeartbeatRequest(
                session_id=session, status_tags={"ok": "fine", "bad": PLACEHOLDER}
            )
            ack = await call(agent, "Heartbeat", invalid(heartbeat), agent_pb2.HeartbeatResponse)
            assert ack.acknowledged

            [batch] = await fake.wait_for_calls("BatchHeartbeat", timeout=5.0)
            [sent] = batch.request.heartbeats
            assert sent.session_id == session
            assert dict(sent.status_tags) == {"ok": "fine", "bad": REPAIRED}
            after = await Metrics.read(node)
            dropped = "yuzu_gw_heartbeat_buffer_dropped_total"
            assert after.delta(before, dropped, reason="heartbeat_invalid") == 1
            assert (
                after.delta(before, "yuzu_gw_heartbeat_rejected_total", reason="unknown_session")
                == 0
            )
            # The session stays online: held, its stream open.
            assert node.runtime is not None
            assert agent_session(node.runtime, "agent-1") is not None
            assert not stream.done()
            stream.cancel()
        no_traceback(caplog)

    run(body)


# -- session ids ---------------------------------------------------------------------------------


async def raw_subscribe(port: int, session_id: bytes) -> list[tuple[bytes, bytes]]:
    """A Subscribe whose x-yuzu-session-id holds `session_id` as raw header bytes (grpcio sends
    only printable ASCII metadata), then a second stream on the same connection: the trailers of
    both, so the connection is seen to survive the first."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    conn.initiate_connection()
    trailers: dict[int, list[tuple[bytes, bytes]]] = {}
    try:
        for stream_id, sid in ((1, session_id), (3, b"gw-session-none")):
            conn.send_headers(
                stream_id,
                [
                    (b":method", b"POST"),
                    (b":scheme", b"http"),
                    (b":path", b"/yuzu.agent.v1.AgentService/Subscribe"),
                    (b":authority", b"localhost"),
                    (b"content-type", b"application/grpc"),
                    (b"te", b"trailers"),
                    (b"x-yuzu-session-id", sid),
                ],
            )
            writer.write(conn.data_to_send())
            await writer.drain()
            while stream_id not in trailers:
                data = await asyncio.wait_for(reader.read(65535), 5.0)
                assert data, "the connection was closed"
                for event in conn.receive_data(data):
                    answer = h2.events.ResponseReceived | h2.events.TrailersReceived
                    ended = isinstance(event, answer)
                    if ended and any(name == b"grpc-status" for name, _ in event.headers):
                        trailers[event.stream_id] = list(event.headers)
                writer.write(conn.data_to_send())
                await writer.drain()
    finally:
        writer.close()
    return trailers[1]


def test_an_invalid_session_id_is_an_unknown_session_everywhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            await agent.register()
            before = await Metrics.read(node)

            heartbeat = agent_pb2.HeartbeatRequest(session_id=PLACEHOLDER)
            error = await refused(
                call(agent, "Heartbeat", invalid(heartbeat), agent_pb2.HeartbeatResponse)
            )
            assert (error.code(), error.details()) == (Code.NOT_FOUND, UNKNOWN_SESSION)

            report = agent_pb2.InventoryReport(session_id=PLACEHOLDER)
            report.content_hashes["os"] = "h"
            error = await refused(
                call(agent, "ReportInventory", invalid(report), agent_pb2.InventoryAck)
            )
            assert (error.code(), error.details()) == (Code.NOT_FOUND, UNKNOWN_SESSION)

            port = node.ctx.bound["listener_agent"][1]
            for session_id in (BAD, "café".encode()):
                headers = dict(await raw_subscribe(port, session_id))
                assert headers[b"grpc-status"] == b"5"  # NOT_FOUND, as for any unknown id

            await asyncio.sleep(0.05)  # the upstream actor counts local refusals
            after = await Metrics.read(node)
            unknown = {"reason": "unknown_session"}
            assert after.delta(before, "yuzu_gw_heartbeat_rejected_total", **unknown) == 1
            assert after.delta(before, "yuzu_gw_inventory_rejected_total", **unknown) == 1
            errors = "yuzu_gw_upstream_rpc_errors_total"
            assert after.delta(before, errors, code="encode", rpc_name="inventory") == 0
            assert fake.calls("ProxyInventory") == []
        no_traceback(caplog)

    run(body)


# -- Register and ReportInventory: the edge bound first, then the local encode refusal ----------


def test_register_and_inventory_check_their_own_rules_before_the_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), agents(node) as [agent]:
            session = (await agent.register("agent-1")).session_id
            before = await Metrics.read(node)

            for agent_id in ("Q" * 257, "Q" * 300):  # over 256 bytes, and not UTF-8
                request = agent_pb2.RegisterRequest()
                request.info.agent_id = agent_id
                error = await refused(
                    call(agent, "Register", invalid(request, agent_id), agent_pb2.RegisterResponse)
                )
                assert error.code() is Code.INVALID_ARGUMENT
                assert error.details() == "agent_id length exceeds 256 bytes or is empty"

            # Within the bound: the seed's local encode refusal, INTERNAL and breaker-neutral.
            for field in ("agent_id", "hostname"):
                request = agent_pb2.RegisterRequest()
                request.info.agent_id = "agent-2"
                setattr(request.info, field, PLACEHOLDER)
                error = await refused(
                    call(agent, "Register", invalid(request), agent_pb2.RegisterResponse)
                )
                assert error.code() is Code.INTERNAL
            # An admitted report whose other text is not UTF-8: the same refusal.
            report = agent_pb2.InventoryReport(session_id=session)
            report.content_hashes[PLACEHOLDER] = "h"
            error = await refused(
                call(agent, "ReportInventory", invalid(report), agent_pb2.InventoryAck)
            )
            assert error.code() is Code.INTERNAL

            assert len(fake.calls("ProxyRegister")) == 1 and fake.calls("ProxyInventory") == []
            await asyncio.sleep(0.05)
            after = await Metrics.read(node)
            refused_id = "yuzu_gw_register_refused_total"
            assert after.delta(before, refused_id, reason="agent_id_length") == 2
            errors = "yuzu_gw_upstream_rpc_errors_total"
            assert after.delta(before, errors, code="encode", rpc_name="register") == 2
            assert after.delta(before, errors, code="encode", rpc_name="inventory") == 1
            assert after.value("yuzu_gw_upstream_circuit_breaker_state", state="closed") == 1
        lines = [r.getMessage() for r in caplog.records if "Register refused" in r.getMessage()]
        assert lines[0] == (
            "Register refused: the agent id is empty or longer than 256 bytes (size 257 bytes)"
        )
        no_traceback(caplog)

    run(body)


# -- Subscribe's frames --------------------------------------------------------------------------


def test_a_frame_with_invalid_text_is_delivered_repaired(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        async with gateway(tmp_path) as (node, _fake), agents(node) as [agent]:
            session = (await agent.register("agent-1")).session_id
            raw = agent.channel.stream_stream(
                "/yuzu.agent.v1.AgentService/Subscribe",
                request_serializer=lambda b: b,
                response_deserializer=agent_pb2.CommandRequest.FromString,
            )
            stream = raw(metadata=(("x-yuzu-session-id", session),))
            assert node.runtime is not None
            runtime = node.runtime
            await until(lambda: agent_session(runtime, "agent-1") is not None, "agent-1 held")
            async with operator(node) as op:
                answers = op.send(command("c1"), ("agent-1",))
                assert (await stream.read()).command_id == "c1"
                frame = agent_pb2.CommandResponse(
                    command_id="c1", status=S.SUCCESS, output=f"out {PLACEHOLDER}"
                )
                frame.error.metadata["k"] = "v"
                await stream.write(invalid(frame))
                responses, code = await collect(answers)
            assert code is Code.OK
            [answer] = responses
            assert (answer.response.status, answer.response.output) == (
                S.SUCCESS,
                f"out {REPAIRED}",
            )
            # The session goes on: still held, its stream open.
            assert agent_session(runtime, "agent-1") is not None
            assert not stream.done()
            stream.cancel()
        assert any("not valid UTF-8" in r.getMessage() for r in caplog.records)
        no_traceback(caplog)

    run(body)


# -- the management listener ---------------------------------------------------------------------


def test_management_requests_with_invalid_text_are_invalid_argument(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        async with gateway(tmp_path) as (node, _fake), operator(node) as op:
            send = mgmt.SendCommandRequest(agent_ids=[PLACEHOLDER])
            send.command.command_id = "c1"
            params = mgmt.SendCommandRequest()
            params.command.command_id = "c2"
            params.command.parameters["secret"] = PLACEHOLDER
            streams = {
                "SendCommand": (send, mgmt.SendCommandResponse),
                "SendCommand parameters": (params, mgmt.SendCommandResponse),
                "WatchEvents": (mgmt.WatchEventsRequest(agent_ids=[PLACEHOLDER]), mgmt.AgentEvent),
            }
            for name, (request, response) in streams.items():
                method = op.channel.unary_stream(
                    "/yuzu.server.v1.ManagementService/" + name.split()[0],
                    request_serializer=lambda b: b,
                    response_deserializer=response.FromString,
                )
                answer = method(invalid(request), timeout=DEADLINE_S)
                out, code = await collect(answer)
                assert (out, code) == ([], Code.INVALID_ARGUMENT), name
            unary = {
                "ListAgents": (mgmt.ListAgentsRequest(cursor=PLACEHOLDER), mgmt.ListAgentsResponse),
                "GetAgent": (mgmt.GetAgentRequest(agent_id=PLACEHOLDER), mgmt.GetAgentResponse),
            }
            for name, (request, response) in unary.items():
                method = op.channel.unary_unary(
                    "/yuzu.server.v1.ManagementService/" + name,
                    request_serializer=lambda b: b,
                    response_deserializer=response.FromString,
                )
                error = await refused(method(invalid(request), timeout=DEADLINE_S))
                assert error.code() is Code.INVALID_ARGUMENT, name
        no_traceback(caplog)

    run(body)
