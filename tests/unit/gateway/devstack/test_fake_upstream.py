"""The fake Yuzu server (gateway/devstack/fake_upstream/), driven by a grpcio aio client."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from cryptography import x509

from gateway.devstack import pki as devstack_pki
from gateway.devstack.fake_upstream import (
    METHODS,
    SESSION_METADATA_KEY,
    FakeUpstream,
    Fault,
    Presented,
    method_path,
)
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2
from tests.support.certs import CertAuthority, ensure_pki, write_pki

pytestmark = pytest.mark.timeout(20)

REPO = Path(__file__).resolve().parents[4]
SESSION_RE = re.compile(r"gw-session-[0-9a-f]{32}")
CONNECTED = gateway_pb2.StreamStatusNotification.CONNECTED
DISCONNECTED = gateway_pb2.StreamStatusNotification.DISCONNECTED
Code = grpc.StatusCode


def run(body: Callable[[], Awaitable[None]], timeout: float = 8.0) -> None:
    """Run one test body in a fresh loop, bounded in time."""
    asyncio.run(asyncio.wait_for(body(), timeout))


def client(channel: grpc.aio.Channel, method: str) -> Any:
    req, resp = METHODS[method]
    return channel.unary_unary(
        method_path(method),
        request_serializer=req.SerializeToString,
        response_deserializer=resp.FromString,
    )


def register_request(agent_id: str) -> agent_pb2.RegisterRequest:
    return agent_pb2.RegisterRequest(info=agent_pb2.AgentInfo(agent_id=agent_id))


def heartbeats(*session_ids: str) -> gateway_pb2.BatchHeartbeatRequest:
    return gateway_pb2.BatchHeartbeatRequest(
        heartbeats=[agent_pb2.HeartbeatRequest(session_id=s) for s in session_ids],
        gateway_node="gw1@test",
    )


def test_latency_per_method() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, grpc.aio.insecure_channel(fake.address) as ch:
            fake.set_latency(0.3, "ProxyInventory")
            t0 = time.monotonic()
            assert (await client(ch, "ProxyInventory")(agent_pb2.InventoryReport())).received
            slow = time.monotonic() - t0
            t0 = time.monotonic()
            assert (
                await client(ch, "ForwardGuardianMessage")(
                    gateway_pb2.ForwardGuardianRequest(agent_id="a1")
                )
            ).acknowledged
            fast = time.monotonic() - t0
            assert slow >= 0.3
            assert fast < 0.2
            fake.set_latency(0, "ProxyInventory")
            t0 = time.monotonic()
            await client(ch, "ProxyInventory")(agent_pb2.InventoryReport())
            assert time.monotonic() - t0 < 0.2

    run(body)


def test_scripted_statuses_queue_rule_and_trailers() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, grpc.aio.insecure_channel(fake.address) as ch:
            inventory = client(ch, "ProxyInventory")
            fake.fail(
                "ProxyInventory",
                Code.UNAVAILABLE,
                times=2,
                details="busy",
                trailers={"grpc-retry-pushback-ms": "250"},
            )
            for _ in range(2):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await inventory(agent_pb2.InventoryReport())
                assert err.value.code() == Code.UNAVAILABLE
                assert err.value.details() == "busy"
                assert ("grpc-retry-pushback-ms", "250") in tuple(err.value.trailing_metadata())
            assert (await inventory(agent_pb2.InventoryReport())).received

            # a scripted response message, then a rule that always fails
            fake.script("ProxyInventory", agent_pb2.InventoryAck(received=False, need_full=["x"]))
            fake.fail("ProxyInventory", Code.INVALID_ARGUMENT, times=None)
            assert list((await inventory(agent_pb2.InventoryReport())).need_full) == ["x"]
            for _ in range(3):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await inventory(agent_pb2.InventoryReport())
                assert err.value.code() == Code.INVALID_ARGUMENT
            # a rule that decides per call, falling back to the default with None
            fake.set_rule(
                "ProxyInventory",
                lambda call: Fault(Code.NOT_FOUND) if call.request.session_id == "bad" else None,
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await inventory(agent_pb2.InventoryReport(session_id="bad"))
            assert err.value.code() == Code.NOT_FOUND
            assert (await inventory(agent_pb2.InventoryReport(session_id="good"))).received
            fake.reset_script()
            assert (await inventory(agent_pb2.InventoryReport(session_id="bad"))).received
            codes = [c.code for c in fake.calls("ProxyInventory")]
            assert codes == [Code.UNAVAILABLE] * 2 + [Code.OK] * 2 + [Code.INVALID_ARGUMENT] * 3 + [
                Code.NOT_FOUND,
                Code.OK,
                Code.OK,
            ]
            with pytest.raises(ValueError, match="unknown GatewayUpstream method"):
                fake.fail("ProxyRegistr", Code.INTERNAL)

    run(body)


def test_register_mints_readopts_and_refuses() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, grpc.aio.insecure_channel(fake.address) as ch:
            register = client(ch, "ProxyRegister")
            first = await register(register_request("a1"))
            assert first.accepted
            assert SESSION_RE.fullmatch(first.session_id)
            assert fake.sessions == {first.session_id: "a1"}
            # an agent's own second Register mints a new session, superseding the first
            second = await register(register_request("a1"))
            assert second.session_id != first.session_id
            assert fake.sessions == {second.session_id: "a1"}
            # a replay presents the session: re-adopted, known or not
            replay = await register(
                register_request("a1"), metadata=((SESSION_METADATA_KEY, second.session_id),)
            )
            assert (replay.accepted, replay.session_id) == (True, second.session_id)
            await fake.restart()
            unknown = "gw-session-" + "ab" * 16
            adopted = await register(
                register_request("a2"), metadata=((SESSION_METADATA_KEY, unknown),)
            )
            assert (adopted.accepted, adopted.session_id) == (True, unknown)
            assert fake.session_of("a2") == unknown
            # a session held by another agent: FAILED_PRECONDITION, as the server answers
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await register(register_request("a3"), metadata=((SESSION_METADATA_KEY, unknown),))
            assert err.value.code() == Code.FAILED_PRECONDITION
            # configured answers for presented sessions
            fake.on_presented_session(unknown=Presented.REFUSE, reason="not approved")
            refused = await register(
                register_request("a4"), metadata=((SESSION_METADATA_KEY, "gw-session-x"),)
            )
            assert (refused.accepted, refused.reject_reason) == (False, "not approved")
            fake.on_presented_session(known=Presented.SUPERSEDED)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await register(register_request("a2"), metadata=((SESSION_METADATA_KEY, unknown),))
            assert err.value.code() == Code.FAILED_PRECONDITION
            # rejected agents
            fake.reject_agents("bad-agent", reason="enrollment denied")
            denied = await register(register_request("bad-agent"))
            assert (denied.accepted, denied.reject_reason, denied.session_id) == (
                False,
                "enrollment denied",
                "",
            )
            fake.accept_agents()
            assert (await register(register_request("bad-agent"))).accepted

    run(body)


def test_heartbeat_verdicts_after_restart() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, grpc.aio.insecure_channel(fake.address) as ch:
            register, beat = client(ch, "ProxyRegister"), client(ch, "BatchHeartbeat")
            s1 = (await register(register_request("a1"))).session_id
            s2 = (await register(register_request("a2"))).session_id
            verdict = await beat(heartbeats(s1, s2, s1))
            assert verdict.acknowledged_count == 3
            assert list(verdict.unknown_session_ids) == []
            assert not verdict.unknown_session_ids_truncated

            await fake.restart()  # memory lost, the route directory kept
            stranger = "gw-session-" + "0" * 32
            verdict = await beat(heartbeats(s1, s2, stranger, "", "x" * 65))
            assert verdict.acknowledged_count == 2
            assert list(verdict.unknown_session_ids) == [s1, s2, stranger]

            fake.unknown_cap = 2
            verdict = await beat(heartbeats(s1, s2, stranger))
            assert list(verdict.unknown_session_ids) == [s1, s2]
            assert verdict.unknown_session_ids_truncated

            # the gateway's replay re-adopts s1: no longer listed
            await register(register_request("a1"), metadata=((SESSION_METADATA_KEY, s1),))
            verdict = await beat(heartbeats(s1, s2))
            assert list(verdict.unknown_session_ids) == [s2]
            # a scripted verdict
            fake.script(
                "BatchHeartbeat",
                gateway_pb2.BatchHeartbeatResponse(unknown_session_ids=["gw-session-z"]),
            )
            assert list((await beat(heartbeats(s1))).unknown_session_ids) == ["gw-session-z"]

    run(body)


def test_notifications_refused_by_agent_event_or_predicate() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, grpc.aio.insecure_channel(fake.address) as ch:
            notify = client(ch, "NotifyStreamStatus")

            async def acked(agent_id: str, event: int, session_id: str = "s") -> bool:
                n = gateway_pb2.StreamStatusNotification(
                    agent_id=agent_id, session_id=session_id, event=event
                )
                return (await notify(n)).acknowledged

            assert await acked("a1", CONNECTED)
            fake.refuse_notifications(agent_ids=["a2"], event=CONNECTED)
            assert not await acked("a2", CONNECTED)
            assert await acked("a2", DISCONNECTED)
            assert await acked("a1", CONNECTED)
            fake.refuse_notifications(lambda n: n.session_id not in fake.sessions)
            assert not await acked("a1", DISCONNECTED, session_id="gone")
            fake.acknowledge_notifications()
            assert await acked("a2", CONNECTED)

    run(body)


def test_freeze_until_client_deadline_then_unfreeze() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, grpc.aio.insecure_channel(fake.address) as ch:
            beat = client(ch, "BatchHeartbeat")
            fake.freeze("BatchHeartbeat")
            t0 = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await beat(heartbeats("s1"), timeout=0.3)
            assert err.value.code() == Code.DEADLINE_EXCEEDED
            assert time.monotonic() - t0 < 1.0
            [cancelled] = await fake.wait_for_calls("BatchHeartbeat", answered=True)
            assert cancelled.code == Code.CANCELLED
            # other methods are not frozen
            assert (await client(ch, "ProxyInventory")(agent_pb2.InventoryReport())).received

            pending = asyncio.ensure_future(beat(heartbeats("s2"), timeout=5))
            await fake.wait_for_calls("BatchHeartbeat", 2)
            await asyncio.sleep(0.1)
            assert not pending.done()
            fake.unfreeze()
            verdict = await pending
            assert list(verdict.unknown_session_ids) == ["s2"]
            assert fake.calls("BatchHeartbeat")[-1].code == Code.OK

    run(body)


def test_restart_with_dropped_connections_keeps_the_port() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, grpc.aio.insecure_channel(fake.address) as ch:
            register = client(ch, "ProxyRegister")
            session = (await register(register_request("a1"))).session_id
            port = fake.port
            fake.freeze("ProxyInventory")
            in_flight = asyncio.ensure_future(
                client(ch, "ProxyInventory")(agent_pb2.InventoryReport(), timeout=5)
            )
            await fake.wait_for_calls("ProxyInventory")
            await fake.restart(drop_connections=True)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await in_flight
            assert err.value.code() == Code.UNAVAILABLE
            assert fake.calls("ProxyInventory")[0].code == Code.CANCELLED
            assert fake.port == port
            assert fake.sessions == {}
            fake.unfreeze()
            verdict = await client(ch, "BatchHeartbeat")(
                heartbeats(session), timeout=5, wait_for_ready=True
            )
            assert (verdict.acknowledged_count, list(verdict.unknown_session_ids)) == (1, [session])

    run(body)


def test_max_concurrent_streams() -> None:
    async def body() -> None:
        async with (
            FakeUpstream(max_concurrent_streams=1) as fake,
            grpc.aio.insecure_channel(fake.address) as ch,
        ):
            fake.freeze("ProxyInventory")
            inventory = client(ch, "ProxyInventory")
            first = asyncio.ensure_future(inventory(agent_pb2.InventoryReport(session_id="1")))
            await fake.wait_for_calls("ProxyInventory")
            second = asyncio.ensure_future(inventory(agent_pb2.InventoryReport(session_id="2")))
            await asyncio.sleep(0.3)
            assert len(fake.calls("ProxyInventory")) == 1  # the second waits for a stream
            fake.unfreeze()
            await asyncio.gather(first, second)
            assert [r.session_id for r in fake.requests("ProxyInventory")] == ["1", "2"]

    run(body)


def test_tls_requires_a_client_certificate(tmp_path: Path) -> None:
    pki = write_pki(tmp_path)

    async def body() -> None:
        async with FakeUpstream(tls=pki) as fake:
            good = grpc.ssl_channel_credentials(
                pki.ca_cert_pem, pki.client.key_pem, pki.client.cert_pem
            )
            async with grpc.aio.secure_channel(f"localhost:{fake.port}", good) as ch:
                ack = await client(ch, "ForwardGuardianMessage")(
                    gateway_pb2.ForwardGuardianRequest(agent_id="a1"), timeout=3
                )
                assert ack.acknowledged
            no_cert = grpc.ssl_channel_credentials(pki.ca_cert_pem)
            async with grpc.aio.secure_channel(fake.address, no_cert) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await client(ch, "ForwardGuardianMessage")(
                        gateway_pb2.ForwardGuardianRequest(agent_id="a2"), timeout=3
                    )
                assert err.value.code() == Code.UNAVAILABLE
            other = CertAuthority("Other CA").issue("intruder", dns=["intruder"])
            foreign = grpc.ssl_channel_credentials(pki.ca_cert_pem, other.key_pem, other.cert_pem)
            async with grpc.aio.secure_channel(fake.address, foreign) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await client(ch, "ForwardGuardianMessage")(
                        gateway_pb2.ForwardGuardianRequest(agent_id="a3"), timeout=3
                    )
                assert err.value.code() == Code.UNAVAILABLE
            assert [r.agent_id for r in fake.requests("ForwardGuardianMessage")] == ["a1"]

    run(body)


def test_record_of_calls() -> None:
    async def body() -> None:
        async with FakeUpstream() as fake, grpc.aio.insecure_channel(fake.address) as ch:
            t0 = time.monotonic()
            notification = gateway_pb2.StreamStatusNotification(
                agent_id="a1", session_id="s1", event=CONNECTED, stream_home_id="f" * 32
            )
            await client(ch, "NotifyStreamStatus")(
                notification, timeout=2, metadata=(("x-test", "1"), ("x-bin", b"\x00\x01"))
            )
            await client(ch, "ProxyInventory")(agent_pb2.InventoryReport(session_id="s1"))
            [call] = fake.calls("NotifyStreamStatus")
            assert call.method == "NotifyStreamStatus"
            assert call.request == notification
            assert call.metadata["x-test"] == "1"
            assert call.metadata["x-bin"] == b"\x00\x01"
            assert call.peer.startswith("ipv4:127.0.0.1:")
            assert call.deadline is not None and 1 < call.deadline <= 2.1  # grpc-timeout rounds up
            assert t0 <= call.received_at <= call.answered_at <= time.monotonic()
            assert call.code == Code.OK and call.response.acknowledged
            assert fake.calls("ProxyInventory")[0].deadline is None
            assert [c.method for c in fake.calls()] == ["NotifyStreamStatus", "ProxyInventory"]

            async def later() -> None:
                await asyncio.sleep(0.1)
                await client(ch, "ProxyInventory")(agent_pb2.InventoryReport(session_id="s2"))

            task = asyncio.ensure_future(later())
            found = await fake.wait_for_calls(
                "ProxyInventory", where=lambda c: c.request.session_id == "s2", answered=True
            )
            assert len(found) == 1
            await task
            with pytest.raises(TimeoutError, match="0 of 1 ForwardGuardianMessage"):
                await fake.wait_for_calls("ForwardGuardianMessage", timeout=0.1)
            fake.clear()
            assert fake.calls() == []

    run(body)


def test_standalone_process(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.devstack.fake_upstream",
            "--port",
            "0",
            "--latency-ms",
            "ProxyInventory=200",
            "--tls-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.match(r"fake upstream listening on 127\.0\.0\.1:(\d+) \(tls", line)
        assert match, line
        port = int(match.group(1))
        pki = devstack_pki.load_pki(tmp_path)  # what --tls-dir wrote: the dev stack's files

        async def body() -> None:
            creds = grpc.ssl_channel_credentials(
                pki.ca_cert_pem, pki.gateway.key_pem, pki.gateway.cert_pem
            )
            async with grpc.aio.secure_channel(f"localhost:{port}", creds) as ch:
                t0 = time.monotonic()
                ack = await client(ch, "ProxyInventory")(agent_pb2.InventoryReport(), timeout=3)
                assert ack.received
                assert time.monotonic() - t0 >= 0.2

        run(body)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_certs_sans_usages_and_reload(tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "pki")
    san = pki.server.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    eku = pki.client.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
    assert pki.client.cert.issuer == pki.server.cert.issuer
    assert (pki.directory / "client.key").stat().st_mode & 0o777 == 0o600
    again = ensure_pki(tmp_path / "pki")
    assert again.server.cert == pki.server.cert and again.ca_cert_pem == pki.ca_cert_pem
    assert pki.ca is not None
    leaf = pki.ca.issue(
        "yuzu-server",
        uris=[f"yuzu://{pki.ca.fingerprint_hex}/server"],
        serial=0x0A1B2C,
        key=pki.server.key,
    )
    assert leaf.serial_hex == "A1B2C"
    assert leaf.cert.public_key() == pki.server.cert.public_key()


def test_tls_dir_reuses_a_complete_dev_pki_and_replaces_an_incomplete_one(tmp_path: Path) -> None:
    written = devstack_pki.ensure_pki(tmp_path)
    again = devstack_pki.ensure_pki(tmp_path)
    assert again == written  # the same files, and the identity read back from the CA
    ca = written.ca_cert_pem
    (tmp_path / "gateway.key").unlink()
    fresh = devstack_pki.ensure_pki(tmp_path)
    assert fresh.ca_cert_pem != ca and fresh.identity != written.identity
    assert (tmp_path / "gateway.key").is_file()
