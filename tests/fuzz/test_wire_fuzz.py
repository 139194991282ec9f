"""Hostile bytes on every listener mode of a real node: hypothesis draws batches of calls
(payload bytes, protobuf wire types, the message prefix, metadata) and raw connection openings,
sends each batch to a transport, a PROXY-protocol, a forwarded_for and a TLS listener, and after
each batch asserts that the node still serves a normal heartbeat, logged no traceback and no
ERROR, answered every call with a named status (never grpclib's UNKNOWN), and holds its memory
and descriptors within bounds (issue 23).

Bounded for CI: `BATCHES` examples of `BATCH` calls each, one node per example."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.registry.api import agent_session
from gateway.devstack.fake_upstream import FakeUpstream
from protos.yuzu.agent.v1 import agent_pb2
from tests.integration.test_agent_plane import Agent, _live, until
from tests.support.certs import write_pki
from tests.support.node import TEST_CONFIG, running_node
from tests.support.raw_grpc import RawGrpc, frame

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

BATCHES = 10
BATCH = 24
UNKNOWN = 2  # grpclib's "Internal Server Error": an input the gateway did not name
RSS_GROWTH_LIMIT = 96 * 1024 * 1024
FD_GROWTH_LIMIT = 16
SERVICE = "/yuzu.agent.v1.AgentService/"
METHODS = ("Register", "Heartbeat", "ReportInventory", "Subscribe", "NoSuchMethod")
PROXY_V1 = b"PROXY TCP4 10.1.2.3 127.0.0.1 40000 50051\r\n"
LOOPBACK = "{127,0,0,1}"
COMMON = "limits => #{request_timeout_ms => 500}"


def _listeners(pki_dir: Path) -> str:
    agent = "services => #{'yuzu.agent.v1.AgentService' => yuzu_gw_agent_service}"

    def entry(name: str, extra: str) -> str:
        return (
            f"#{{name => {name}, service_protos => [agent_pb], {agent},"
            f" listen => #{{port => 0, ip => {LOOPBACK}}}, {COMMON}{extra}}}"
        )

    tls = (
        f', tls => #{{certfile => "{pki_dir / "server.pem"}",'
        f' keyfile => "{pki_dir / "server.key"}",'
        f' cacertfile => "{pki_dir / "ca.pem"}", verify => verify_none,'
        " fail_if_no_peer_cert => false}"
    )
    return ",\n".join(
        [
            entry("agent", ""),
            entry("proxied", f", origin => #{{mode => proxy_protocol, sources => [{LOOPBACK}]}}"),
            entry("forwarded", f", origin => #{{mode => forwarded_for, sources => [{LOOPBACK}]}}"),
            entry("tls", tls),
        ]
    )


@contextlib.asynccontextmanager
async def fuzz_node(tmp_path: Path) -> AsyncIterator[Any]:
    """A node with the four listeners and a fake server upstream."""
    pki = write_pki(tmp_path / "pki")
    config = tmp_path / "fuzz.config"
    text = TEST_CONFIG.read_text()
    start = text.index("{grpc_listeners, [")
    end = text.index("]},", start) + 3
    listeners = "{grpc_listeners, [\n" + _listeners(pki.directory) + "\n]},"
    async with FakeUpstream() as fake:
        upstream = (
            "{upstream_client, #{channels => [{default_channel,"
            f' [{{http, "127.0.0.1", {fake.port}, []}}], #{{}}}}]}}}},'
            " {listener_handshake_timeout_ms, 1000}"
        )
        rest = text[end:].replace("{allow_no_upstream, true}", upstream)
        config.write_text(text[:start] + listeners + rest)
        async with running_node(tmp_path, YUZU_GW_CONFIG=str(config)) as node:
            yield node


def _client_tls() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    return context


# -- what hypothesis draws ------------------------------------------------------------------------

_field = st.integers(min_value=1, max_value=40)
_wire_type = st.integers(min_value=0, max_value=7)  # 6 and 7 are not protobuf wire types
_tagged = st.builds(
    lambda field, wire, rest: bytes([(field << 3 | wire) & 0x7F]) + rest,
    _field,
    _wire_type,
    st.binary(max_size=24),
)
_valid = st.sampled_from(
    [
        agent_pb2.RegisterRequest(info=agent_pb2.AgentInfo(agent_id="fuzz")).SerializeToString(),
        agent_pb2.HeartbeatRequest(session_id="gw-session-fuzz").SerializeToString(),
        b"",
    ]
)
_payload = st.one_of(
    st.binary(max_size=128),
    st.lists(_tagged, max_size=4).map(b"".join),
    st.tuples(_valid, st.binary(max_size=8)).map(lambda pair: pair[0] + pair[1]),
)
_ascii = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=24)
_metadata = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "grpc-timeout",
                "grpc-encoding",
                "x-yuzu-session-id",
                "x-forwarded-for",
                "trace-bin",
                "x-custom",
            ]
        ),
        st.one_of(_ascii, st.sampled_from(["0n", "0S", "-1S", "5S", "gzip", "10.0.0.1"])),
    ),
    max_size=3,
)
_call = st.fixed_dictionaries(
    {
        "method": st.sampled_from(METHODS),
        "payload": _payload,
        "flag": st.sampled_from([0, 0, 0, 1, 2]),
        "length_delta": st.sampled_from([0, 0, 0, 3, 100]),
        "messages": st.integers(min_value=0, max_value=2),
        "metadata": _metadata,
    }
)
_opening = st.one_of(st.binary(max_size=64), st.just(b"PRI * HTTP/2.0\r\n"), st.just(PROXY_V1[:9]))


# -- the checks ---------------------------------------------------------------------------------


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.bad: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.exc_info is not None or "Traceback" in message or record.levelno >= logging.ERROR:
            self.bad.append(message)


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _send(raw: RawGrpc, call: dict[str, Any]) -> int | None:
    """The call's grpc-status (None: reset, closed or still open)."""
    body = call["payload"]
    message = frame(body, flag=call["flag"], length=len(body) + call["length_delta"])
    try:
        answer = await raw.call(
            SERVICE + call["method"],
            *([message] * call["messages"]),
            headers=call["metadata"],
            timeout=5.0,
        )
    except TimeoutError:
        return None  # a Subscribe held open, say: the node's own bounds end it
    assert answer.status != UNKNOWN, (call, answer)
    assert answer.status is not None or answer.reset is not None or answer.closed, answer
    return answer.status


async def _batch(node: Any, calls: list[dict[str, Any]], openings: list[bytes]) -> None:
    bound = node.ctx.bound
    targets = [
        (bound["listener_agent"][1], {}),
        (bound["listener_proxied"][1], {"before": PROXY_V1}),
        (bound["listener_forwarded"][1], {}),
        (bound["listener_tls"][1], {"ssl": _client_tls()}),
    ]
    for port, options in targets:
        async with RawGrpc.connect(port, **options) as raw:
            statuses = await asyncio.gather(*(_send(raw, call) for call in calls))
        # The batch reached the listener's gRPC layer (an unknown method is answered too).
        assert any(status is not None for status in statuses), (port, statuses)
        for opening in openings:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(opening)
            writer.close()


@settings(
    max_examples=BATCHES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    calls=st.lists(_call, min_size=BATCH, max_size=BATCH),
    openings=st.lists(_opening, min_size=2, max_size=4),
)
def test_hostile_batches_leave_the_node_serving(
    tmp_path_factory: pytest.TempPathFactory, calls: list[dict[str, Any]], openings: list[bytes]
) -> None:
    tmp_path = tmp_path_factory.mktemp("fuzz")
    errors = _Errors()
    root = logging.getLogger()
    root.addHandler(errors)

    async def body() -> None:
        async with fuzz_node(tmp_path) as node:
            agent = Agent(node)
            try:
                await until(lambda: _live(node), "the upstream connection")
                session_id = (await agent.register("fuzz-agent")).session_id
                stream = agent.subscribe(session_id)
                runtime = node.runtime
                await until(lambda: agent_session(runtime, "fuzz-agent") is not None, "held")
                session = agent_pb2.HeartbeatRequest(session_id=session_id)
                rss, fds = _rss(), _fds()
                await _batch(node, calls, openings)
                heartbeat = agent.unary("Heartbeat", agent_pb2.HeartbeatResponse)
                ack = await heartbeat(session, timeout=10.0)
                assert ack.acknowledged
                await until(lambda: _fds() <= fds + FD_GROWTH_LIMIT, "descriptors freed", 10.0)
                assert _rss() - rss < RSS_GROWTH_LIMIT
                stream.cancel()
            finally:
                await agent.close()

    try:
        asyncio.run(body())
    finally:
        root.removeHandler(errors)
    assert errors.bad == []
