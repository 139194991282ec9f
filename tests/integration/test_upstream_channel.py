"""The upstream channel against the grpcio fake server: calls, round robin, waiting and failing
fast, redial, deadlines, status mapping, stream limits, TLS, and the actor that owns it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from prometheus_client import CollectorRegistry

from actors.core.breaker import ResultKind
from actors.upstream import api as methods
from actors.upstream.api import CHANNEL_ACTOR_NAME, UpstreamCallError, upstream_channel
from actors.upstream.api import CHANNELS_TABLE as TABLE
from gateway.config.context import NodeContext
from gateway.config.keys import SCHEMA
from gateway.config.resolve import resolve_section
from gateway.config.terms import parse_term
from gateway.config.upstream_client import ChannelSpec, parse_client_config
from gateway.config.vm_args import CookieSource, NodeArgs
from gateway.devstack.fake_upstream import FakeUpstream
from gateway.listeners.h2_closed_streams import CLOSED_STREAMS_KEPT
from gateway.upstream.channel import UpstreamChannel
from gateway.upstream.channel_actor import READINESS_CHECK, UpstreamChannelActor
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2
from tests.support.actors import Harness
from tests.support.certs import CertAuthority, Pki, write_pki

pytestmark = pytest.mark.integration

T = TypeVar("T")

CALLS: list[tuple[str, Any, type[Any]]] = [
    (
        methods.PROXY_REGISTER,
        agent_pb2.RegisterRequest(info=agent_pb2.AgentInfo(agent_id="agent-1")),
        agent_pb2.RegisterResponse,
    ),
    (
        methods.BATCH_HEARTBEAT,
        gateway_pb2.BatchHeartbeatRequest(),
        gateway_pb2.BatchHeartbeatResponse,
    ),
    (methods.PROXY_INVENTORY, agent_pb2.InventoryReport(), agent_pb2.InventoryAck),
    (
        methods.NOTIFY_STREAM_STATUS,
        gateway_pb2.StreamStatusNotification(agent_id="agent-1"),
        gateway_pb2.StreamStatusAck,
    ),
    (
        methods.FORWARD_GUARDIAN_MESSAGE,
        gateway_pb2.ForwardGuardianRequest(),
        gateway_pb2.ForwardGuardianAck,
    ),
]


def run(body: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(body(), timeout)

    return asyncio.run(bounded())


def spec_of(endpoints: str, options: str = "#{}") -> ChannelSpec:
    term = parse_term(f"#{{channels => [{{default_channel, [{endpoints}], {options}}}]}}.")
    client = parse_client_config(term)
    assert client is not None
    return client.channels[0]


def http_spec(port: int, options: str = "#{}") -> ChannelSpec:
    return spec_of(f'{{http, "127.0.0.1", {port}, []}}', options)


def tls_spec(port: int, ca: Path, cert: Path | None = None, key: Path | None = None) -> ChannelSpec:
    options = f'{{verify, verify_peer}}, {{cacertfile, "{ca}"}}'
    if cert is not None and key is not None:
        options += f', {{certfile, "{cert}"}}, {{keyfile, "{key}"}}'
    return spec_of(f'{{https, "127.0.0.1", {port}, [{options}]}}')


@contextlib.asynccontextmanager
async def open_channel(spec: ChannelSpec, **kw: Any) -> AsyncIterator[UpstreamChannel]:
    channel = UpstreamChannel(spec, **kw)
    channel.start()
    try:
        yield channel
    finally:
        channel.close()


async def until(predicate: Callable[[], bool], timeout: float = 3.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.01)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def register(channel: UpstreamChannel, timeout: float = 2.0) -> Any:
    request = agent_pb2.RegisterRequest(info=agent_pb2.AgentInfo(agent_id="agent-1"))
    return await channel.unary(
        methods.PROXY_REGISTER, request, agent_pb2.RegisterResponse, timeout=timeout
    )


async def expect_error(call: Awaitable[Any]) -> UpstreamCallError:
    with pytest.raises(UpstreamCallError) as caught:
        await call
    return caught.value


# -- calls --------------------------------------------------------------------------------------


def test_a_unary_round_trip_on_every_method() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, open_channel(http_spec(fake.port)) as channel:
            for path, request, response_type in CALLS:
                reply = await channel.unary(path, request, response_type, timeout=2.0)
                assert isinstance(reply, response_type)
            assert [c.method for c in fake.calls()] == [
                "ProxyRegister",
                "BatchHeartbeat",
                "ProxyInventory",
                "NotifyStreamStatus",
                "ForwardGuardianMessage",
            ]
            assert fake.calls()[0].request.info.agent_id == "agent-1"
            [register_call] = fake.calls("ProxyRegister")
            assert register_call.response.session_id.startswith("gw-session-")

    run(body)


def test_metadata_and_grpc_timeout_reach_the_server() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, open_channel(http_spec(fake.port)) as channel:
            await channel.unary(
                methods.PROXY_REGISTER,
                agent_pb2.RegisterRequest(),
                agent_pb2.RegisterResponse,
                timeout=2.0,
                metadata={methods.SESSION_ID_METADATA: "gw-session-1"},
            )
            [call] = fake.calls()
            assert call.metadata[methods.SESSION_ID_METADATA] == "gw-session-1"
            # grpc-timeout is what was left of the 2 s (the connection wait included).
            assert call.deadline is not None and 1.5 < call.deadline <= 2.05

    run(body)


def test_round_robin_over_a_pool_of_two() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake:
            spec = http_spec(fake.port, "#{pool_size => 2}")
            async with open_channel(spec) as channel:
                await until(lambda: channel.live_connections() == 2, what="two connections")
                for _ in range(6):
                    await register(channel)
                peers = [c.peer for c in fake.calls()]
                assert len(set(peers)) == 2
                # Alternating: no connection is used twice in a row.
                assert all(a != b for a, b in itertools.pairwise(peers))

    run(body)


def test_tcp_nodelay_follows_the_setting() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake:
            for nodelay in (True, False):
                async with open_channel(http_spec(fake.port), nodelay=nodelay) as channel:
                    await register(channel)
                    slot = channel._slots[0]
                    assert slot._protocol is not None
                    sock = slot._protocol.connection._transport.get_extra_info("socket")
                    assert bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)) is nodelay

    run(body)


# -- no connection: wait while connecting, else fail at once -----------------------------------


def test_a_call_fails_at_once_with_the_last_error_when_nothing_is_connecting() -> None:
    async def body() -> None:
        async with open_channel(http_spec(free_port())) as channel:
            await until(lambda: channel._last_error is not None, what="the first dial to fail")
            started = time.monotonic()
            error = await expect_error(register(channel, timeout=5.0))
            assert time.monotonic() - started < 0.05  # not after its 5 s timeout
            assert (error.kind, error.detail) == (ResultKind.TRANSPORT, "econnrefused")

    run(body)


def test_a_call_while_the_first_dial_runs_waits_and_succeeds() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake:
            channel = UpstreamChannel(http_spec(fake.port))
            channel.start()
            try:
                assert channel.live_connections() == 0  # still connecting
                reply = await register(channel)
                assert reply.accepted
            finally:
                channel.close()

    run(body)


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """Accepts TCP and never speaks HTTP/2: a connection that stays `connecting`."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()


def test_the_wait_for_a_connecting_slot_is_bounded_by_the_calls_timeout() -> None:
    async def body() -> None:
        async with silent_server() as port:
            spec = http_spec(port, "#{connect_timeout => 2000}")
            async with open_channel(spec) as channel:
                started = time.monotonic()
                error = await expect_error(register(channel, timeout=0.3))
                waited = time.monotonic() - started
                assert error.kind is ResultKind.TIMEOUT
                assert 0.25 < waited < 1.0

    run(body)


def test_the_connect_timeout_bounds_a_silent_server_and_redial_follows() -> None:
    async def body() -> None:
        async with silent_server() as port:
            spec = http_spec(port, "#{connect_timeout => 200}")
            async with open_channel(spec) as channel:
                await until(lambda: channel._last_error is not None, what="a timed-out dial")
                assert channel._last_error.detail == "timeout"
                await until(lambda: channel.connection_states()["connecting"] == 1, what="a redial")

    run(body)


def test_redial_after_the_server_restarts_and_drops_connections() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, open_channel(http_spec(fake.port)) as channel:
            await register(channel)
            first_peer = fake.calls()[0].peer
            await fake.restart(drop_connections=True)
            await until(lambda: channel.live_connections() == 0, what="the loss to be seen")
            started = time.monotonic()
            await until(lambda: channel.live_connections() == 1, what="the redial")
            # First redial after 100 ms (+ up to 20 %), not seconds.
            assert time.monotonic() - started < 1.0
            await register(channel)
            assert fake.calls()[-1].peer != first_peer

    run(body)


def test_a_call_after_a_loss_fails_fast_then_succeeds_once_redialled() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, open_channel(http_spec(fake.port)) as channel:
            await register(channel)
            port = fake.port
            await fake.stop()
            await until(lambda: channel.live_connections() == 0, what="the loss")
            await until(lambda: channel._last_error.detail == "econnrefused", what="a redial")
            error = await expect_error(register(channel, timeout=5.0))
            assert error.kind is ResultKind.TRANSPORT
            await fake.start(port=port)
            await until(lambda: channel.live_connections() == 1, timeout=5.0, what="redial")
            assert (await register(channel)).accepted

    run(body)


# -- how calls fail ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INTERNAL,
    ],
)
def test_a_status_is_mapped_with_its_code(code: grpc.StatusCode) -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, open_channel(http_spec(fake.port)) as channel:
            fake.fail("ProxyRegister", code, details="server says no")
            error = await expect_error(register(channel))
            assert (error.kind, error.status) == (ResultKind.STATUS, code.value[0])
            assert error.detail == "server says no"

    run(body)


def test_a_slow_answer_is_a_timeout_and_the_server_sees_the_cancel() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, open_channel(http_spec(fake.port)) as channel:
            await register(channel)  # connected
            fake.freeze("ProxyRegister")
            started = time.monotonic()
            error = await expect_error(register(channel, timeout=0.3))
            assert error.kind is ResultKind.TIMEOUT
            assert 0.25 < time.monotonic() - started < 1.0
            await fake.wait_for_calls("ProxyRegister", 2, answered=True, timeout=2.0)
            # The gateway's timer sends the cancel; on a busy host the server's own copy of the
            # deadline (the grpc-timeout it was sent) may pass first and end the call itself.
            assert fake.calls()[-1].code in (
                grpc.StatusCode.CANCELLED,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
            fake.unfreeze()
            assert (await register(channel)).accepted  # the connection is still good

    run(body)


def test_a_connection_lost_during_a_call_is_a_transport_failure() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, open_channel(http_spec(fake.port)) as channel:
            await register(channel)
            fake.freeze("ProxyRegister")
            call = asyncio.ensure_future(register(channel, timeout=3.0))
            await fake.wait_for_calls("ProxyRegister", 2)
            await fake.stop()
            error = await expect_error(call)
            # grpcio ends running calls as it stops: an UNAVAILABLE status or a dropped stream.
            assert error.kind in (ResultKind.TRANSPORT, ResultKind.STATUS)
            if error.kind is ResultKind.STATUS:
                assert error.status == grpc.StatusCode.UNAVAILABLE.value[0]

    run(body)


def test_an_unencodable_request_and_an_oversized_answer() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake:
            spec = http_spec(fake.port, "#{max_receive_message_bytes => 16}")
            async with open_channel(spec) as channel:
                error = await expect_error(
                    channel.unary(
                        methods.PROXY_REGISTER,
                        "not a message",
                        agent_pb2.RegisterResponse,
                        timeout=1.0,
                    )
                )
                assert error.kind is ResultKind.ENCODE
                assert fake.calls() == []  # nothing left the gateway
                error = await expect_error(register(channel))  # a ~60-byte answer
                assert error.kind is ResultKind.EXCEPTION
                assert "max_receive_message_bytes" in error.detail

    run(body)


# -- the server's stream limit ------------------------------------------------------------------


def test_the_stream_limit_is_recorded_summed_and_published() -> None:
    async def body() -> None:
        async with FakeUpstream(max_concurrent_streams=7) as fake:
            spec = http_spec(fake.port, "#{pool_size => 2}")
            heard: list[int] = []
            async with open_channel(spec) as channel:
                channel.add_settings_listener(heard.append)
                await until(lambda: channel.server_max_streams() == 14, what="both limits")
                assert heard[-1] == 14
                await fake.stop()
                await until(lambda: channel.server_max_streams() == 0, what="the loss")
                assert heard[-1] == 0

    run(body)


def test_no_limit_declared_is_zero() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, open_channel(http_spec(fake.port)) as channel:
            await register(channel)
            # grpcio declares no SETTINGS_MAX_CONCURRENT_STREAMS by default.
            assert channel._slots[0].max_streams is None
            assert channel.server_max_streams() == 0

    run(body)


def test_a_connection_remembers_a_bounded_number_of_closed_streams() -> None:
    """An upstream connection opens a stream per call of the whole node for weeks: h2's record
    of how each closed stream ended stays bounded (gateway/listeners/h2_closed_streams.py) instead
    of
    growing to h2's 65,536 entries per connection."""

    async def body() -> None:
        async with FakeUpstream() as fake, open_channel(http_spec(fake.port)) as channel:
            for _ in range(CLOSED_STREAMS_KEPT + 40):
                await register(channel)
            protocol = channel._slots[0]._protocol
            assert protocol is not None
            # h2 files a stream as closed when the next one opens: all but the last.
            assert len(protocol.connection._connection._closed_streams) == CLOSED_STREAMS_KEPT

    run(body, timeout=30.0)


def test_a_call_past_the_servers_limit_is_refused_locally() -> None:
    async def body() -> None:
        async with (
            FakeUpstream(max_concurrent_streams=2) as fake,
            open_channel(http_spec(fake.port)) as channel,
        ):
            await register(channel)
            fake.freeze("ProxyRegister")
            held = [asyncio.ensure_future(register(channel, timeout=3.0)) for _ in range(2)]
            await fake.wait_for_calls("ProxyRegister", 3)
            started = time.monotonic()
            error = await expect_error(register(channel, timeout=3.0))
            assert error.kind is ResultKind.TOO_MANY_STREAMS
            assert time.monotonic() - started < 0.05
            assert len(fake.calls("ProxyRegister")) == 3  # the third never left
            fake.unfreeze()
            for reply in await asyncio.gather(*held):
                assert reply.accepted
            assert (await register(channel)).accepted  # room again

    run(body)


# -- TLS ----------------------------------------------------------------------------------------


def test_mutual_tls_against_the_fake(tmp_path: Path) -> None:
    pki = write_pki(tmp_path)

    async def body() -> None:
        async with FakeUpstream(tls=pki) as fake:
            spec = tls_spec(fake.port, pki.ca_cert_path, pki.client.cert_path, pki.client.key_path)
            async with open_channel(spec) as channel:
                assert (await register(channel)).accepted
                assert channel.tls_files_usable()
                transport = channel._slots[0]._protocol.connection._transport
                assert transport.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"

    run(body)


def handshake_failure(tmp_path: Path, pki: Pki, spec_for: Callable[[int], ChannelSpec]) -> Any:
    async def body() -> tuple[UpstreamCallError, int]:
        failures: list[int] = []
        async with (
            FakeUpstream(tls=pki) as fake,
            open_channel(
                spec_for(fake.port), on_handshake_failure=lambda: failures.append(1)
            ) as channel,
        ):
            await until(lambda: channel._last_error is not None, what="a failed dial")
            error = await expect_error(register(channel))
            assert channel.tls_files_usable()  # the files are fine: not a file problem
            return error, len(failures)

    return run(body)


def test_a_server_certificate_from_another_ca_is_a_tls_failure(tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "server")
    other = CertAuthority("Other CA")
    other_ca, _ = other.write(tmp_path)
    client = other.issue("gw", client_auth=True, server_auth=False).write(tmp_path, "client")

    error, counted = handshake_failure(
        tmp_path, pki, lambda port: tls_spec(port, other_ca, client.cert_path, client.key_path)
    )
    assert (error.kind, error.detail) == (ResultKind.TLS, "unknown_ca")
    assert counted >= 1


def test_no_client_certificate_for_a_server_that_requires_one(tmp_path: Path) -> None:
    pki = write_pki(tmp_path)
    error, counted = handshake_failure(tmp_path, pki, lambda port: tls_spec(port, pki.ca_cert_path))
    # TLS 1.3: the client's side of the handshake completes, then grpcio's server (BoringSSL)
    # closes the connection without an alert, before its HTTP/2 SETTINGS. The slot is not up
    # until SETTINGS arrive, so this is a failed dial ("closed"), never a live connection.
    assert (error.kind, error.detail) == (ResultKind.TRANSPORT, "closed")
    assert counted == 0


def test_a_missing_ca_file_warns_fails_tls_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = write_pki(tmp_path / "pki")
    ca = tmp_path / "later" / "ca.pem"

    async def body() -> None:
        async with FakeUpstream(tls=pki) as fake:
            spec = tls_spec(fake.port, ca, pki.client.cert_path, pki.client.key_path)
            async with open_channel(spec) as channel:
                await until(lambda: not channel.tls_files_usable(), what="bad TLS options")
                error = await expect_error(register(channel))
                assert (error.kind, error.detail) == (ResultKind.TLS, "bad_tls_options")
                # Several failed attempts (100, 200, 400 ms ...), one ERROR line.
                await until(lambda: channel._slots[0].redial.step_s >= 0.8, what="3 attempts")
                errors = [r for r in caplog.records if r.levelno == logging.ERROR]
                assert [r.getMessage() for r in errors] == [
                    "Upstream channel default_channel: the TLS client options cannot be used, so"
                    f" every connection fails: cacertfile {ca} does not exist (yet). The gateway"
                    " keeps retrying and /readyz stays 503 until this is fixed."
                ]
                # The server creates its certificates: the next attempt works.
                ca.parent.mkdir()
                ca.write_bytes(pki.ca_cert_pem)
                await until(lambda: channel.live_connections() == 1, timeout=4.0, what="up")
                assert channel.tls_files_usable()
                assert (await register(channel)).accepted

    caplog.set_level(logging.INFO, logger="yuzu_gw.upstream.channel")
    run(body)


def test_a_key_that_is_not_a_key_is_named_without_its_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = write_pki(tmp_path)
    not_a_key = tmp_path / "secret-gateway.key"
    not_a_key.write_bytes(b"")

    async def body() -> None:
        async with FakeUpstream(tls=pki) as fake:
            spec = tls_spec(fake.port, pki.ca_cert_path, pki.client.cert_path, not_a_key)
            async with open_channel(spec) as channel:
                await until(lambda: not channel.tls_files_usable(), what="bad TLS options")
        [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert "keyfile is empty" in line
        assert "secret-gateway" not in line

    caplog.set_level(logging.INFO, logger="yuzu_gw.upstream.channel")
    run(body)


def test_a_server_that_is_down_clears_the_tls_file_report(tmp_path: Path) -> None:
    # The TCP connect fails before the TLS options are tried, as on the Erlang gateway.
    async def body() -> None:
        spec = tls_spec(free_port(), tmp_path / "missing.pem")
        async with open_channel(spec) as channel:
            await until(lambda: channel._last_error is not None, what="a failed dial")
            assert channel._last_error.detail == "econnrefused"
            assert channel.tls_files_usable()

    run(body)


# -- the actor ----------------------------------------------------------------------------------


def node_context(tmp_path: Path, upstream_client: str) -> NodeContext:
    config = resolve_section(
        SCHEMA,
        parse_term(f"[{{allow_no_listeners, true}}, {{upstream_client, {upstream_client}}}]."),
        {},
        "test",
    )
    node = NodeArgs("gw@127.0.0.1", "test", "x" * 32, CookieSource.ENV, (), "vm.args")
    return NodeContext(config, node, tmp_path, CollectorRegistry())


def test_the_actor_publishes_the_channel_the_readiness_check_and_the_metrics(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        h = Harness(loop)
        try:
            async with FakeUpstream(max_concurrent_streams=9) as fake:
                ctx = node_context(
                    tmp_path,
                    f'#{{channels => [{{default_channel, [{{http, "127.0.0.1", {fake.port},'
                    " []}], #{}}]}",
                )
                actor = h.create(UpstreamChannelActor, ctx, name=CHANNEL_ACTOR_NAME)
                table = h.base.table(TABLE)
                assert table is not None and list(table) == ["default_channel"]
                channel = upstream_channel(h.base)
                assert channel is table["default_channel"]
                with pytest.raises(PermissionError):
                    table.insert("x", channel)  # protected: only the actor writes
                await until(lambda: channel.server_max_streams() == 9, what="the limit")
                assert ctx.registry.get_sample_value("yuzu_gw_upstream_server_max_streams") == 9
                assert (
                    ctx.registry.get_sample_value(
                        "yuzu_gw_upstream_connections",
                        {"channel": "default_channel", "state": "up"},
                    )
                    == 1
                )
                assert ctx.readiness.evaluate()[READINESS_CHECK] is True
                reply = await channel.unary(
                    methods.PROXY_INVENTORY,
                    agent_pb2.InventoryReport(),
                    agent_pb2.InventoryAck,
                    timeout=2.0,
                )
                assert reply.received
                status = h.instance(actor).format_status()
                assert status["default_channel"]["connections"][0]["state"] == "up"
                # A restart of the actor publishes a fresh channel; nothing registers twice.
                await h.base.stop(actor, 2.0)
                assert h.base.table(TABLE) is None and upstream_channel(h.base) is None
                assert channel.live_connections() == 0  # closed by terminate
                h.create(UpstreamChannelActor, ctx, name=CHANNEL_ACTOR_NAME)
                assert upstream_channel(h.base) is not channel
                assert (
                    ctx.registry.get_sample_value("yuzu_gw_upstream_tls_handshake_failures_total")
                    == 0
                )
        finally:
            h.base.shutdown()

    run(body)


def test_the_actor_reports_unusable_tls_files_to_readiness(tmp_path: Path) -> None:
    pki = write_pki(tmp_path)

    async def body() -> None:
        h = Harness(asyncio.get_running_loop())
        try:
            async with FakeUpstream(tls=pki) as fake:
                ctx = node_context(
                    tmp_path,
                    f'#{{channels => [{{default_channel, [{{https, "127.0.0.1", {fake.port},'
                    f' [{{verify, verify_peer}}, {{cacertfile, "{tmp_path / "no-ca.pem"}"}}]}}],'
                    " #{}}]}",
                )
                h.create(UpstreamChannelActor, ctx, name=CHANNEL_ACTOR_NAME)
                await until(
                    lambda: ctx.readiness.evaluate()[READINESS_CHECK] is False, what="not ready"
                )
        finally:
            h.base.shutdown()

    run(body)


def test_a_node_without_a_channel_boots_and_is_ready(tmp_path: Path) -> None:
    from tests.support.node import running_node

    async def body() -> None:
        async with running_node(tmp_path) as node:
            assert upstream_channel(node.runtime) is None
            assert node.ctx.readiness.evaluate()[READINESS_CHECK] is True
            assert node.ctx.registry.get_sample_value("yuzu_gw_upstream_server_max_streams") == 0

    run(body)


def test_a_key_that_does_not_match_its_certificate_is_named_by_the_tls_library(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = write_pki(tmp_path)

    async def body() -> None:
        async with FakeUpstream(tls=pki) as fake:
            spec = tls_spec(fake.port, pki.ca_cert_path, pki.client.cert_path, pki.server.key_path)
            async with open_channel(spec) as channel:
                await until(lambda: not channel.tls_files_usable(), what="bad TLS options")
        [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert "none of the files (cacertfile, certfile, keyfile) is at fault" in line
        assert "KEY_VALUES_MISMATCH" in line
        assert str(pki.server.key_path) not in line

    caplog.set_level(logging.INFO, logger="yuzu_gw.upstream.channel")
    run(body)
