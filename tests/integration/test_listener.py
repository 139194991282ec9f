"""The listener on loopback, driven by grpcio clients (Google's stack, not the one served by)
and, where grpcio cannot misbehave on purpose, by a raw HTTP/2 client built on h2.

The service is a tiny echo: Register answers with what the handler sees of its call
(connection key, attributed origin, TCP peer), so every assertion is about the wire."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.serialization import Encoding
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    RemoteSettingsChanged,
    StreamReset,
    TrailersReceived,
)
from h2.settings import SettingCodes
from prometheus_client import CollectorRegistry

from gateway.config.context import NodeContext
from gateway.config.keys import SCHEMA
from gateway.config.keys import listeners as listener_keys
from gateway.config.listener_spec import parse_listeners
from gateway.config.resolve import resolve_section
from gateway.config.terms import Atom, parse_term
from gateway.config.vm_args import CookieSource, NodeArgs
from gateway.listeners.connection import ConnectionInfo, current_call
from gateway.listeners.h2_closed_streams import CLOSED_STREAMS_KEPT
from gateway.listeners.h2_settings import SettingValues
from gateway.listeners.listener_actor import (
    GetState,
    ListenerActor,
    ListenerArgs,
    ListenerState,
    Resume,
    Suspend,
)
from gateway.listeners.metrics import ListenerMetrics
from gateway.listeners.proxy_header import Command, Family, ProxyHeader, encode_v2
from gateway.listeners.tree import ListenerBoard, listener_child_specs, resolve_routes
from protos.yuzu.agent.v1 import agent_grpc, agent_pb2
from supervisors.errors import InitFailed
from supervisors.supervisor import Supervisor, SupFlags, SupSpec
from tests.support.actors import Harness, run
from tests.support.certs import Pki, write_pki

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

REGISTER = "/yuzu.agent.v1.AgentService/Register"
SUBSCRIBE = "/yuzu.agent.v1.AgentService/Subscribe"
INVENTORY = "/yuzu.agent.v1.AgentService/ReportInventory"
AGENT_SERVICE = "'yuzu.agent.v1.AgentService'"


# -- the service ------------------------------------------------------------------------------


class EchoAgent(agent_grpc.AgentServiceBase):
    """Register echoes `key|origin|peer`; Subscribe echoes each response as a command whose
    id names the connection; ReportInventory is left out (partial routes)."""

    async def Register(self, stream: Any) -> None:
        await stream.recv_message()
        call = current_call()
        seen = f"{call.connection.key}|{call.origin}|{call.connection.peer}"
        await stream.send_message(agent_pb2.RegisterResponse(session_id=seen))

    async def Subscribe(self, stream: Any) -> None:
        async for response in stream:
            key = current_call().connection.key
            await stream.send_message(
                agent_pb2.CommandRequest(command_id=f"{key}:{response.command_id}")
            )

    async def Heartbeat(self, stream: Any) -> None:
        await stream.recv_message()
        await stream.send_message(agent_pb2.HeartbeatResponse(acknowledged=True))

    ExecuteCommand = ReportInventory = CheckForUpdate = DownloadUpdate = Heartbeat


class PartialAgent:
    """Routes Register and Subscribe only: the rest must be UNIMPLEMENTED on the wire."""

    def __init__(self) -> None:
        self.echo = EchoAgent()

    def __mapping__(self) -> dict[str, Any]:
        return {
            path: handler
            for path, handler in self.echo.__mapping__().items()
            if path in (REGISTER, SUBSCRIBE)
        }


HANDLERS = {"echo": PartialAgent()}


# -- starting a listener ------------------------------------------------------------------------


def entry(extra: str = "", ip: str = "{127,0,0,1}") -> str:
    body = (
        f"#{{name => agent, service_protos => [agent_pb], services => #{{{AGENT_SERVICE} => echo}},"
        f" listen => #{{port => 0, ip => {ip}}}"
    )
    return body + (", " + extra if extra else "") + "}"


class Started:
    def __init__(self, h: Harness, address: Any, registry: CollectorRegistry) -> None:
        self.h = h
        self.address = address
        self.registry = registry
        self.actor: ListenerActor = h.instance(address)
        self.port = self.actor.address[1]
        self.closed: list[int] = []

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def start(h: Harness, extra: str = "", board: ListenerBoard | None = None) -> Started:
    [spec] = parse_listeners(parse_term(f"[{entry(extra)}]."))
    registry = CollectorRegistry()
    closed: list[int] = []
    args = ListenerArgs(
        spec,
        resolve_routes(spec, HANDLERS),
        ListenerMetrics(registry),
        board.publish if board is not None else (lambda _n, _t: None),
        on_connection_closed=lambda info: closed.append(info.key),
    )
    started = Started(h, h.create(ListenerActor, args), registry)
    started.closed = closed
    return started


def listener_test(body: Callable[[Harness], Awaitable[None]]) -> None:
    run(body, timeout=20.0)


# -- grpcio clients ----------------------------------------------------------------------------


def channel(
    port: int, *, creds: grpc.ChannelCredentials | None = None, host: str = "127.0.0.1"
) -> grpc.aio.Channel:
    # A local subchannel pool: without it grpcio shares one connection between channels
    # to the same address, and "one channel" would not mean "one connection".
    options = [("grpc.use_local_subchannel_pool", 1)]
    target = f"{host}:{port}"
    if creds is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, creds, options=options)


async def register(
    chan: grpc.aio.Channel,
    metadata: tuple[tuple[str, str], ...] = (),
    timeout: float = 3.0,
    wait_for_ready: bool | None = None,
) -> tuple[int, str, str]:
    call = chan.unary_unary(
        REGISTER,
        request_serializer=agent_pb2.RegisterRequest.SerializeToString,
        response_deserializer=agent_pb2.RegisterResponse.FromString,
    )
    answer = await call(
        agent_pb2.RegisterRequest(gateway_observed_peer="6.6.6.6"),
        metadata=metadata,
        timeout=timeout,
        wait_for_ready=wait_for_ready,
    )
    key, origin, peer = answer.session_id.split("|")
    return int(key), origin, peer


@contextlib.asynccontextmanager
async def channels(*chans: grpc.aio.Channel) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for chan in chans:
            await chan.close()


# -- plaintext, TLS, connection keys -----------------------------------------------------------


def test_calls_see_a_connection_key_per_connection_and_the_peer_as_origin() -> None:
    async def body(h: Harness) -> None:
        listener = start(h)
        one, two = channel(listener.port), channel(listener.port)
        async with channels(one, two):
            first = [await register(one) for _ in range(3)]
            second = [await register(two) for _ in range(2)]
            # Stable across calls on one connection, different between connections.
            assert len({key for key, _, _ in first}) == 1
            assert len({key for key, _, _ in second}) == 1
            assert first[0][0] != second[0][0]
            # transport mode: the TCP peer, bare, whatever the agent claimed in the request
            assert first[0][1:] == ("127.0.0.1", "127.0.0.1")
            # Subscribe is served on the same connection key.
            stream = one.stream_stream(
                SUBSCRIBE,
                request_serializer=agent_pb2.CommandResponse.SerializeToString,
                response_deserializer=agent_pb2.CommandRequest.FromString,
            )()
            await stream.write(agent_pb2.CommandResponse(command_id="c1"))
            reply = await asyncio.wait_for(stream.read(), 3)
            assert reply.command_id == f"{first[0][0]}:c1"
            await stream.done_writing()
            assert await stream.read() is grpc.aio.EOF
            # grpcio keeps a connection open while a call object of it lives.
            del stream
            # A method the module does not route answers UNIMPLEMENTED on the wire.
            assert await _inventory_status(one) is grpc.StatusCode.UNIMPLEMENTED
        # Both connections closed: the hook was told, once each.
        await h.wait_until(lambda: len(listener.closed) == 2, 3, "closed hook")
        assert sorted(listener.closed) == sorted({first[0][0], second[0][0]})
        await h.wait_until(lambda: listener.actor.server.connections == 0, 3)

    listener_test(body)


def test_a_finished_call_leaves_nothing_behind_on_its_connection() -> None:
    """An agent connection sees a Register, then a Subscribe that lasts for days: the finished
    Register's task, stream and buffer must not stay with the connection until later calls."""

    async def body(h: Harness) -> None:
        listener = start(h)
        one = channel(listener.port)
        async with channels(one):
            await register(one)
            [protocol] = listener.actor.server.live()
            await h.wait_until(lambda: not protocol.handler._tasks, 3, "the finished task gone")
            assert not protocol.processor.streams
            # h2's closed stream too, not only at the next stream (protocol.py `_finished`).
            assert not protocol._h2.streams
            # And compacted SETTINGS bookkeeping after the handshake (h2_settings.py).
            assert all(
                type(v) is SettingValues
                for s in (protocol._h2.local_settings, protocol._h2.remote_settings)
                for v in s._settings.values()
            )

    listener_test(body)


def test_a_connection_remembers_a_bounded_number_of_closed_streams() -> None:
    """An agent connection opens a stream per heartbeat for weeks: h2's record of how each
    closed stream ended must stay bounded (gateway/listeners/h2_closed_streams.py), not grow to
    h2's 65,536 entries per connection."""
    calls = CLOSED_STREAMS_KEPT + 40

    async def body(h: Harness) -> None:
        listener = start(h)
        one = channel(listener.port)
        async with channels(one):
            for _ in range(calls):
                assert await _inventory_status(one) is grpc.StatusCode.UNIMPLEMENTED
            [protocol] = listener.actor.server.live()
            await h.wait_until(lambda: not protocol.handler._tasks, 3, "the finished tasks gone")
            assert len(protocol._h2._closed_streams) == CLOSED_STREAMS_KEPT

    listener_test(body)


async def _inventory_status(chan: grpc.aio.Channel) -> grpc.StatusCode:
    # A function of its own: the error holds its call, and the call its connection.
    inventory = chan.unary_unary(
        INVENTORY,
        request_serializer=agent_pb2.InventoryReport.SerializeToString,
        response_deserializer=agent_pb2.InventoryAck.FromString,
    )
    try:
        await inventory(agent_pb2.InventoryReport(), timeout=3)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def _tls_extra(pki: Pki, verify: str, fail: str) -> str:
    return (
        f'tls => #{{certfile => "{pki.server.cert_path}", keyfile => "{pki.server.key_path}",'
        f' cacertfile => "{pki.ca_cert_path}", verify => {verify}, fail_if_no_peer_cert => {fail}}}'
    )


def test_one_way_tls_serves_grpcio_over_tls_1_2_and_1_3(tmp_path: Path) -> None:
    pki = write_pki(tmp_path)

    async def body(h: Harness) -> None:
        listener = start(h, _tls_extra(pki, "verify_none", "false"))
        creds = grpc.ssl_channel_credentials(root_certificates=pki.ca_cert_pem)
        chan = channel(listener.port, creds=creds, host="localhost")
        async with channels(chan):
            _, origin, _ = await register(chan)
            assert origin == "127.0.0.1"
        for version, name in (
            (ssl.TLSVersion.TLSv1_2, "TLSv1.2"),
            (ssl.TLSVersion.TLSv1_3, "TLSv1.3"),
        ):
            assert await _handshake(listener.port, pki, version) == ("h2", name)
        # Plaintext HTTP/2 against a TLS listener is refused.
        plain = channel(listener.port)
        async with channels(plain):
            with pytest.raises(grpc.aio.AioRpcError):
                await register(plain, timeout=1.0)

    listener_test(body)


async def _handshake(port: int, pki: Pki, version: ssl.TLSVersion) -> tuple[str | None, str]:
    context = ssl.create_default_context(cafile=str(pki.ca_cert_path))
    context.minimum_version = context.maximum_version = version
    context.set_alpn_protocols(["h2"])
    _, writer = await asyncio.open_connection("localhost", port, ssl=context)
    ssl_object = writer.get_extra_info("ssl_object")
    result = (ssl_object.selected_alpn_protocol(), ssl_object.version())
    writer.close()
    return result


def test_mutual_tls_requires_a_client_certificate_and_hands_it_to_handlers(
    tmp_path: Path,
) -> None:
    pki = write_pki(tmp_path)

    async def body(h: Harness) -> None:
        listener = start(h, _tls_extra(pki, "verify_peer", "true"))
        anonymous = channel(
            listener.port,
            creds=grpc.ssl_channel_credentials(root_certificates=pki.ca_cert_pem),
            host="localhost",
        )
        with_cert = channel(
            listener.port,
            creds=grpc.ssl_channel_credentials(
                root_certificates=pki.ca_cert_pem,
                private_key=pki.client.key_pem,
                certificate_chain=pki.client.cert_pem,
            ),
            host="localhost",
        )
        async with channels(anonymous, with_cert):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await register(anonymous, timeout=2.0)
            assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
            key, _, _ = await register(with_cert)
            [protocol] = [p for p in listener.actor.server.live() if p.info.key == key]
            der = protocol.info.peer_cert()
            assert der is not None and der == pki.client.cert.public_bytes(Encoding.DER)

    listener_test(body)


# -- HTTP/2 settings and limits, with a raw client ---------------------------------------------


class RawH2:
    """A bare HTTP/2 client: what grpcio will not do (stall, flood, stay silent)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.flush()

    @classmethod
    async def open(cls, port: int) -> RawH2:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())

    async def events(self, timeout: float = 3.0) -> list[Any] | None:
        """The next events; None once the server closed the connection."""
        data = await asyncio.wait_for(self.reader.read(65536), timeout)
        if not data:
            return None
        events = self.conn.receive_data(data)
        self.flush()
        return events

    async def until(self, kind: type, timeout: float = 3.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            events = await self.events(max(deadline - time.monotonic(), 0.01))
            if events is None:
                return None
            for event in events:
                if isinstance(event, kind):
                    return event

    def request(self, path: str = REGISTER) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            stream_id,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        self.flush()
        return stream_id

    def close(self) -> None:
        self.writer.close()


def test_max_concurrent_streams_is_in_the_first_settings_frame() -> None:
    async def body(h: Harness) -> None:
        listener = start(h, "http2 => #{max_concurrent_streams => 7}")
        raw = await RawH2.open(listener.port)
        settings = await raw.until(RemoteSettingsChanged)
        raw.close()
        assert settings.changed_settings[SettingCodes.MAX_CONCURRENT_STREAMS].new_value == 7

    listener_test(body)


def test_a_stalled_request_is_aborted_after_request_timeout_ms() -> None:
    async def body(h: Harness) -> None:
        listener = start(h, "limits => #{request_timeout_ms => 200}")
        raw = await RawH2.open(listener.port)
        stream_id = raw.request()
        # A message prefix announcing 100 bytes, then only 10 of them.
        raw.conn.send_data(stream_id, b"\x00" + (100).to_bytes(4, "big") + b"x" * 10)
        raw.flush()
        began = time.monotonic()
        reset = await raw.until(StreamReset, timeout=3)
        assert reset is not None and reset.error_code == ErrorCodes.CANCEL
        assert 0.15 < time.monotonic() - began < 2.0
        assert listener.metric("yuzu_gw_grpc_recv_timeout_total") == 1
        # The connection itself lives on: a complete request on it is answered.
        again = raw.request()
        body_bytes = agent_pb2.RegisterRequest().SerializeToString()
        raw.conn.send_data(
            again, b"\x00" + len(body_bytes).to_bytes(4, "big") + body_bytes, end_stream=True
        )
        raw.flush()
        trailers = await raw.until(TrailersReceived, timeout=3)
        assert trailers is not None and trailers.stream_id == again
        assert ("grpc-status", "0") in trailers.headers
        raw.close()

    listener_test(body)


def test_a_connection_buffering_past_its_memory_bound_is_killed() -> None:
    async def body(h: Harness) -> None:
        listener = start(h, "limits => #{max_connection_memory_bytes => 65536}")
        raw = await RawH2.open(listener.port)
        await raw.until(RemoteSettingsChanged)
        stream_id = raw.request()
        raw.conn.send_data(stream_id, b"\x00" + (10_000_000).to_bytes(4, "big"))
        raw.flush()
        sent, terminated = 0, None
        deadline = time.monotonic() + 5
        while terminated is None and time.monotonic() < deadline:
            window = min(
                raw.conn.local_flow_control_window(stream_id), raw.conn.max_outbound_frame_size
            )
            if window > 0:
                raw.conn.send_data(stream_id, b"y" * window)
                raw.flush()
                sent += window
            try:
                events = await raw.events(timeout=1.0)
            except TimeoutError:
                continue
            if events is None:
                break
            terminated = next((e for e in events if isinstance(e, ConnectionTerminated)), None)
        raw.close()
        assert terminated is not None and terminated.error_code == ErrorCodes.ENHANCE_YOUR_CALM
        assert sent > 65536
        assert listener.metric("yuzu_gw_grpc_connection_killed_total") == 1

    listener_test(body)


def test_a_quiet_connection_is_closed_after_idle_timeout() -> None:
    async def body(h: Harness) -> None:
        listener = start(h, "http2 => #{idle_timeout => 1000}")
        raw = await RawH2.open(listener.port)
        began = time.monotonic()
        goaway = await raw.until(ConnectionTerminated, timeout=4)
        assert goaway is not None and goaway.error_code == ErrorCodes.NO_ERROR
        assert 0.9 < time.monotonic() - began < 3
        assert await raw.events() is None  # then closed
        raw.close()

    listener_test(body)


# -- suspend and resume, the ceiling -----------------------------------------------------------


def test_suspend_refuses_new_connections_and_keeps_established_ones() -> None:
    async def body(h: Harness) -> None:
        board = ListenerBoard(
            parse_listeners(parse_term(f"[{entry()}].")), allow_no_listeners=False
        )
        listener = start(h, board=board)
        assert board.ready()
        held = channel(listener.port)
        async with channels(held):
            key, _, _ = await register(held)
            state = await h.ask(listener.address, Suspend())
            assert isinstance(state, ListenerState) and state.state == "suspended"
            assert not board.ready()  # /readyz turns red while shedding
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.1", listener.port)
            assert (await register(held))[0] == key  # the established connection serves on
            assert (await h.ask(listener.address, Suspend())).state == "suspended"
            resumed = await h.ask(listener.address, Resume())
            assert resumed.state == "running" and resumed.address[1] == listener.port
            assert board.ready()
            fresh = channel(listener.port)
            async with channels(fresh):
                assert (await register(fresh))[0] != key
            assert (await h.ask(listener.address, GetState())).state == "running"

    listener_test(body)


def test_a_resume_that_cannot_bind_reports_why_and_stays_suspended() -> None:
    async def body(h: Harness) -> None:
        listener = start(h)
        await h.ask(listener.address, Suspend())
        blocker = socket.socket()
        try:
            blocker.bind(("127.0.0.1", listener.port))
            blocker.listen()
            state = await h.ask(listener.address, Resume())
            assert (state.state, state.error) == ("suspended", "eaddrinuse")
        finally:
            blocker.close()
        assert (await h.ask(listener.address, Resume())).state == "running"

    listener_test(body)


def test_max_connections_stops_accepting_until_a_slot_frees() -> None:
    async def body(h: Harness) -> None:
        listener = start(h, "limits => #{max_connections => 2}")
        one, two, three = (channel(listener.port) for _ in range(3))
        async with channels(two, three):
            await register(one)
            await register(two)
            # The third waits in the backlog: no HTTP/2 answer, so its call cannot complete.
            with pytest.raises(grpc.aio.AioRpcError):
                await register(three, timeout=0.5)
            assert listener.actor.server.connections == 2
            await one.close()
            _, origin, _ = await register(three, timeout=5.0, wait_for_ready=True)
            assert origin == "127.0.0.1"

    listener_test(body)


def test_a_listener_whose_port_is_taken_fails_its_start() -> None:
    async def body(h: Harness) -> None:
        blocker = socket.socket()
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        try:
            text = entry().replace("port => 0", f"port => {port}")
            [spec] = parse_listeners(parse_term(f"[{text}]."))
            args = ListenerArgs(
                spec,
                resolve_routes(spec, HANDLERS),
                ListenerMetrics(CollectorRegistry()),
                lambda _n, _t: None,
            )
            with pytest.raises(InitFailed):
                h.create(ListenerActor, args)
        finally:
            blocker.close()

    listener_test(body)


# -- origin: PROXY protocol through a relay, x-forwarded-for ---------------------------------


@contextlib.asynccontextmanager
async def relay(target: int, header: bytes) -> AsyncIterator[int]:
    """A TCP relay that writes `header` to the listener first, then pipes both ways: a
    balancer with send-proxy in front of a grpcio client."""
    tasks: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        writers.extend((writer, up_writer))
        up_writer.write(header)
        for task in (pipe(reader, up_writer), pipe(up_reader, writer)):
            tasks.add(asyncio.create_task(task))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in writers:
            writer.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _v2(address: str, command: Command = Command.PROXY) -> bytes:
    source = ipaddress.ip_address(address)
    family = Family.INET if source.version == 4 else Family.INET6
    destination = ipaddress.ip_address("10.0.0.1" if source.version == 4 else "fd00::1")
    return encode_v2(
        ProxyHeader(2, command, family, source, destination, 40000, 50051), b"\x04\x00\x01z"
    )


PROXY_TRUSTED = "origin => #{mode => proxy_protocol, sources => [{127,0,0,1}]}"


def test_proxy_protocol_v1_and_v2_attribute_the_claimed_client() -> None:
    async def body(h: Harness) -> None:
        listener = start(h, PROXY_TRUSTED)
        cases = [
            (b"PROXY TCP4 203.0.113.7 10.0.0.1 40000 50051\r\n", "203.0.113.7"),
            (b"PROXY TCP6 2001:db8::7 fd00::1 40000 50051\r\n", "2001:db8::7"),
            (_v2("198.51.100.9"), "198.51.100.9"),
            (_v2("::ffff:198.51.100.10"), "198.51.100.10"),
        ]
        for header, expected in cases:
            async with relay(listener.port, header) as port:
                chan = channel(port)
                async with channels(chan):
                    _, origin, peer = await register(chan)
            assert (origin, peer) == (expected, "127.0.0.1")
        assert (
            listener.metric(
                "yuzu_gw_grpc_origin_ignored_total", mode="proxy_protocol", reason="no_claim"
            )
            == 0
        )

    listener_test(body)


def test_proxy_protocol_local_and_unspec_are_not_observed_and_counted() -> None:
    async def body(h: Harness) -> None:
        listener = start(h, PROXY_TRUSTED)
        local = encode_v2(ProxyHeader(2, Command.LOCAL, Family.UNSPEC))
        for header, reason in ((local, "no_claim"), (b"PROXY UNKNOWN\r\n", "bad_claim")):
            async with relay(listener.port, header) as port:
                chan = channel(port)
                async with channels(chan):
                    for _ in range(2):
                        _, origin, _ = await register(chan)
                        assert origin == ""  # never the proxy's own address
            assert (
                listener.metric(
                    "yuzu_gw_grpc_origin_ignored_total", mode="proxy_protocol", reason=reason
                )
                == 2
            )  # per RPC stream

    listener_test(body)


def test_proxy_protocol_from_an_untrusted_peer_is_ignored_and_counted() -> None:
    async def body(h: Harness) -> None:
        listener = start(h, "origin => #{mode => proxy_protocol, sources => [{10,9,9,9}]}")
        async with relay(listener.port, b"PROXY TCP4 203.0.113.7 10.0.0.1 1 2\r\n") as port:
            chan = channel(port)
            async with channels(chan):
                _, origin, _ = await register(chan)
        assert origin == "127.0.0.1"
        assert (
            listener.metric(
                "yuzu_gw_grpc_origin_ignored_total",
                mode="proxy_protocol",
                reason="untrusted_source",
            )
            == 1
        )

    listener_test(body)


def test_a_proxy_protocol_connection_without_a_header_is_closed() -> None:
    async def body(h: Harness) -> None:
        listener = start(h, PROXY_TRUSTED)
        # Silent: closed after about a second.
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        began = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 3) == b""
        assert 0.8 < time.monotonic() - began < 2.5
        writer.close()
        # HTTP/2 straight away (no header): closed at once, nothing answered.
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        began = time.monotonic()
        # Closed with our bytes unread, the kernel may answer with a reset instead of a FIN.
        with contextlib.suppress(ConnectionResetError):
            assert await asyncio.wait_for(reader.read(), 3) == b""
        assert time.monotonic() - began < 0.5
        writer.close()
        await h.wait_until(lambda: listener.actor.server.connections == 0, 2)

    listener_test(body)


FORWARDED = "origin => #{mode => forwarded_for, sources => [{127,0,0,1}], trusted_hops => %d}"


def test_forwarded_for_takes_the_entry_trusted_hops_from_the_right() -> None:
    async def body(h: Harness) -> None:
        zero = start(h, FORWARDED % 0)
        chan = channel(zero.port)
        async with channels(chan):
            xff = (
                ("x-forwarded-for", "192.0.2.66, 198.51.100.1"),
                ("x-forwarded-for", "  203.0.113.9 "),
            )
            assert (await register(chan, xff))[1] == "203.0.113.9"
            one_line = (("x-forwarded-for", "1.1.1.1,2001:db8::5,203.0.113.9"),)
            assert (await register(chan, one_line))[1] == "203.0.113.9"
            scoped = (("x-forwarded-for", "fe80::1%eth0"),)
            assert (await register(chan, scoped))[1] == "fe80::1"
            # Unusable claims from a trusted proxy: not observed, counted.
            assert (await register(chan, (("x-forwarded-for", "203.0.113.9:443"),)))[1] == ""
            assert (await register(chan, (("x-forwarded-for", "unknown"),)))[1] == ""
            assert (await register(chan))[1] == ""
            assert (
                zero.metric(
                    "yuzu_gw_grpc_origin_ignored_total", mode="forwarded_for", reason="bad_claim"
                )
                == 2
            )
            assert (
                zero.metric(
                    "yuzu_gw_grpc_origin_ignored_total", mode="forwarded_for", reason="no_claim"
                )
                == 1
            )

    listener_test(body)


def test_forwarded_for_with_two_proxies_and_too_few_entries() -> None:
    async def body(h: Harness) -> None:
        listener = start(h, FORWARDED % 1)
        chan = channel(listener.port)
        async with channels(chan):
            xff = (("x-forwarded-for", "10.1.1.1, 192.0.2.44, 10.0.0.5"),)
            assert (await register(chan, xff))[1] == "192.0.2.44"
            assert (await register(chan, (("x-forwarded-for", "192.0.2.44"),)))[1] == ""
        assert (
            listener.metric(
                "yuzu_gw_grpc_origin_ignored_total", mode="forwarded_for", reason="bad_claim"
            )
            == 1
        )

    listener_test(body)


def test_forwarded_for_from_an_untrusted_peer_is_ignored_and_counted() -> None:
    async def body(h: Harness) -> None:
        listener = start(h, "origin => #{mode => forwarded_for, sources => [{{10,0,0,0},8}]}")
        chan = channel(listener.port)
        async with channels(chan):
            xff = (("x-forwarded-for", "203.0.113.9"),)
            assert (await register(chan, xff))[1] == "127.0.0.1"
            assert (await register(chan))[1] == "127.0.0.1"  # no claim: nothing ignored
        assert (
            listener.metric(
                "yuzu_gw_grpc_origin_ignored_total", mode="forwarded_for", reason="untrusted_source"
            )
            == 1
        )

    listener_test(body)


# -- the child specs under a supervisor ---------------------------------------------------------


class _Root(Supervisor):
    def supervisor_spec(self, args: Any) -> SupSpec:
        return SupSpec(SupFlags("one_for_one", 3, 5.0), args)


def test_listener_child_specs_start_under_a_supervisor_and_feed_readiness(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        listeners = f"[{entry()}, {entry().replace('name => agent', 'name => agent2')}]"
        config = resolve_section(
            SCHEMA, [(Atom("grpc_listeners"), parse_term(listeners + "."))], {}
        )
        node = NodeArgs("gw@127.0.0.1", "test", "x" * 32, CookieSource.ENV, (), "vm.args")
        ctx = NodeContext(config, node, tmp_path)
        closed: list[ConnectionInfo] = []
        specs = listener_child_specs(ctx, HANDLERS, on_connection_closed=closed.append)
        assert [s.id for s in specs] == ["listener_agent", "listener_agent2"]
        assert ctx.readiness.evaluate() == {"listeners": False}
        root = h.create(_Root, specs)
        assert ctx.readiness.evaluate() == {"listeners": True}
        port = ctx.bound["listener_agent"][1]
        assert config[listener_keys.GRPC_LISTENERS][0].port == 0 and port != 0
        chan = channel(port)
        async with channels(chan):
            key, _, _ = await register(chan)
        await h.wait_until(lambda: [c.key for c in closed] == [key], 3)
        # A listener that is gone reads as not running.
        h.base.kill(h.base.whereis("listener_agent2"))
        assert ctx.readiness.evaluate() == {"listeners": False}
        await h.wait_until(lambda: ctx.readiness.evaluate()["listeners"], 3, "restart")
        await h.base.stop(root, 5.0)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()

    listener_test(body)
