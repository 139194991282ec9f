"""Hostile input on the wire (issue 23): raw HTTP/2 frames from the `h2` package to a real node,
each case answered with its named status, counted, logged at most once a second per reason, and
never with a traceback (docs/listeners.md "Hostile input")."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from gateway.agent.plane import NOT_PROTOBUF_DETAIL
from protos.yuzu.agent.v1 import agent_pb2
from tests.integration.test_agent_plane import Metrics, gateway, run
from tests.support.raw_grpc import RawGrpc, frame

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SERVICE = "/yuzu.agent.v1.AgentService/"
REGISTER = SERVICE + "Register"
HEARTBEAT = SERVICE + "Heartbeat"
DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL = 4, 12, 13
REFUSED = "yuzu_gw_grpc_request_refused_total"
HANDSHAKE = "yuzu_gw_listener_handshake_failed_total"


def _heartbeat() -> bytes:
    return frame(agent_pb2.HeartbeatRequest(session_id="gw-session-x").SerializeToString())


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        assert record.exc_info is None and "Traceback" not in record.getMessage()
        assert record.levelno < logging.ERROR, record.getMessage()


def refusal_lines(caplog: pytest.LogCaptureFixture, reason: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if f"refused a call: {reason}," in r.getMessage()
    ]


def port(node: object, name: str = "listener_agent") -> int:
    return node.ctx.bound[name][1]  # type: ignore[attr-defined]


def test_a_zero_or_malformed_grpc_timeout_is_answered_by_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        async with gateway(tmp_path) as (node, _fake), RawGrpc.connect(port(node)) as raw:
            before = await Metrics.read(node)
            for value in ("0n", "0S") * 10:
                answer = await raw.call(HEARTBEAT, _heartbeat(), headers=[("grpc-timeout", value)])
                assert answer.status == DEADLINE_EXCEEDED, answer
            for value in ("-1S", "abc", "123456789S", "1x", ""):
                answer = await raw.call(HEARTBEAT, _heartbeat(), headers=[("grpc-timeout", value)])
                assert (answer.status, answer.message) == (
                    INTERNAL,
                    "malformed grpc-timeout header",
                ), value
            # A tiny positive deadline is the deadline passing, not a crash.
            answer = await raw.call(HEARTBEAT, _heartbeat(), headers=[("grpc-timeout", "1n")])
            assert answer.status in (DEADLINE_EXCEEDED, 5), answer  # 5: NOT_FOUND, in time
            after = await Metrics.read(node)
            assert after.delta(before, REFUSED, listener="agent", reason="deadline_expired") == 20
            assert after.delta(before, REFUSED, listener="agent", reason="bad_timeout") == 5
        assert len(refusal_lines(caplog, "deadline_expired")) <= 2  # one a second at most
        no_traceback(caplog)

    run(body)


def test_a_compressed_message_is_unimplemented_naming_its_encoding(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        async with gateway(tmp_path) as (node, _fake), RawGrpc.connect(port(node)) as raw:
            message = agent_pb2.HeartbeatRequest(session_id="s").SerializeToString()
            gzip = await raw.call(
                HEARTBEAT, frame(message, flag=1), headers=[("grpc-encoding", "gzip")]
            )
            assert gzip.status == UNIMPLEMENTED and "grpc-encoding gzip" in gzip.message
            assert gzip.meta("grpc-accept-encoding") == "identity"
            plain = await raw.call(HEARTBEAT, frame(message, flag=1))
            assert plain.status == UNIMPLEMENTED and "no grpc-encoding" in plain.message
            odd = await raw.call(HEARTBEAT, frame(message, flag=7))
            assert (odd.status, odd.message) == (INTERNAL, "invalid compressed-flag byte")
            metrics = await Metrics.read(node)
            assert metrics.value(REFUSED, listener="agent", reason="compressed") == 2
            # The connection serves on.
            again = await raw.call(HEARTBEAT, _heartbeat())
            assert again.status == 5  # NOT_FOUND: no such session
        assert not [r for r in caplog.records if "NotImplementedError" in r.getMessage()]
        no_traceback(caplog)

    run(body)


def test_a_length_prefix_longer_than_the_data_is_a_named_internal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        async with gateway(tmp_path) as (node, _fake), RawGrpc.connect(port(node)) as raw:
            cut = await raw.call(HEARTBEAT, frame(b"\x0a\x01s", length=100))
            assert cut.status == INTERNAL
            assert cut.message == (
                "truncated message: the stream ended 3 bytes into a 100-byte message"
            )
            prefix = await raw.call(HEARTBEAT, b"\x00\x00")
            assert prefix.status == INTERNAL and "5-byte message prefix" in prefix.message
            metrics = await Metrics.read(node)
            assert metrics.value(REFUSED, listener="agent", reason="truncated_message") == 2
        assert not [r for r in caplog.records if "AssertionError" in r.getMessage()]
        no_traceback(caplog)

    run(body)


def test_a_second_request_message_on_a_unary_call_is_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), RawGrpc.connect(port(node)) as raw:
            request = agent_pb2.RegisterRequest()
            request.info.agent_id = "agent-1"
            message = frame(request.SerializeToString())
            twice = await raw.call(REGISTER, message, message)
            assert (twice.status, twice.message) == (
                INTERNAL,
                "more than one request message on a unary call",
            )
            assert fake.calls("ProxyRegister") == []  # refused before the handler ran
            once = await raw.call(REGISTER, message)
            assert once.status == 0 and len(fake.calls("ProxyRegister")) == 1
            metrics = await Metrics.read(node)
            assert metrics.value(REFUSED, listener="agent", reason="extra_message") == 1
        no_traceback(caplog)

    run(body)


def test_random_bytes_to_register_name_the_cause_and_the_local_refusal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        async with gateway(tmp_path) as (node, fake), RawGrpc.connect(port(node)) as raw:
            answer = await raw.call(REGISTER, frame(b"\xff\xfe\x07garbage\x00\x01"))
            assert answer.status == INTERNAL
            assert answer.message == "request cannot be decoded: not a protobuf message"
            assert fake.calls("ProxyRegister") == []
            await asyncio.sleep(0.1)  # the upstream actor logs the local refusal
        lines = [r.getMessage() for r in caplog.records if "ProxyRegister" in r.getMessage()]
        assert lines == [f"Upstream RPC ProxyRegister raised error:{NOT_PROTOBUF_DETAIL}"]
        assert "not decodable" not in "".join(lines)
        no_traceback(caplog)

    run(body)


def test_a_connection_that_never_starts_http2_is_closed_at_the_handshake_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def body() -> None:
        extra = ",{listener_handshake_timeout_ms, 300}"
        async with gateway(tmp_path, extra) as (node, _fake):
            before = await Metrics.read(node)
            silent = await asyncio.open_connection("127.0.0.1", port(node))
            half = await asyncio.open_connection("127.0.0.1", port(node))
            half[1].write(b"PRI * HTTP/2.0\r\n")  # half a preface
            for reader, _writer in (silent, half):
                # Closed by the node long before the idle timeout (600 s): read until EOF.
                while await asyncio.wait_for(reader.read(65536), 10.0):
                    pass
            after = await Metrics.read(node)
            assert after.delta(before, HANDSHAKE, listener="agent", reason="preface_timeout") == 2
            # A connection that does start HTTP/2 in time is served as ever.
            async with RawGrpc.connect(port(node)) as raw:
                await asyncio.sleep(0.5)  # past the handshake time-out
                assert (await raw.call(HEARTBEAT, _heartbeat())).status == 5
            bad = await asyncio.open_connection("127.0.0.1", port(node))
            bad[1].write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 40)
            while await asyncio.wait_for(bad[0].read(65536), 10.0):
                pass
            final = await Metrics.read(node)
            assert final.delta(after, HANDSHAKE, listener="agent", reason="bad_preface") == 1
        no_traceback(caplog)

    run(body)
