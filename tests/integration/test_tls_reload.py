"""Certificate reload without a restart (docs/tls.md "Certificate reload"), on a real TLS
listener built the way gateway_sup builds it (the watcher, then the listener): clients keep
calling over their connections while the listener's certificate is renewed in place; the next
handshake sees the new certificate, no connection is dropped; a broken set changes nothing and
is told once."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections import defaultdict
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509

from gateway.listeners.connection import current_call
from protos.yuzu.server.v1 import management_pb2
from tests.integration.test_mgmt_auth import (
    LIST_AGENTS,
    Pki,
    StandInMgmt,
    mgmt_test,
    start,
    wait_for,
)
from tests.support.actors import Harness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CLIENTS = 4
EXPIRY = "yuzu_gw_tls_loaded_cert_expiry_timestamp_seconds"
LABELS = {"kind": "listener", "name": "mgmt"}
IDENTITY = "{mgmt_peer_auth_mode, identity}"


def recording(monkeypatch: pytest.MonkeyPatch) -> defaultdict[str, set[int]]:
    """Which HTTP/2 connections each client's calls came over (the client names itself in
    `filter`), recorded by the stand-in handler."""
    connections: defaultdict[str, set[int]] = defaultdict(set)

    async def list_agents(self: StandInMgmt, stream: Any) -> None:
        request = await stream.recv_message()
        connections[request.filter].add(current_call().connection.key)
        await stream.send_message(management_pb2.ListAgentsResponse())

    monkeypatch.setattr(StandInMgmt, "list_agents", list_agents)
    return connections


def served_serial(pki: Pki, port: int) -> int:
    """The serial of the certificate a new handshake is given."""
    context = ssl.create_default_context(cafile=str(pki.ca_path))
    context.load_cert_chain(str(pki.server.cert_path), str(pki.server.key_path))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def serial_now(pki: Pki, port: int) -> int:
    return await asyncio.to_thread(served_serial, pki, port)


def renew(pki: Pki) -> Any:
    """A new leaf and key for the listener, written over the files it was started with."""
    leaf = pki.ca.issue("yuzu-gateway", dns=["localhost"], ips=["127.0.0.1"], client_auth=False)
    assert pki.listener.key_path is not None and pki.listener.cert_path is not None
    pki.listener.key_path.write_bytes(leaf.key_pem)
    pki.listener.cert_path.write_bytes(leaf.cert_pem)
    return leaf


async def keep_calling(gw: Any, name: str, stop: asyncio.Event, calls: list[str]) -> None:
    async with gw.client(gw.pki.server) as chan:
        stub = chan.unary_unary(
            LIST_AGENTS,
            request_serializer=management_pb2.ListAgentsRequest.SerializeToString,
            response_deserializer=management_pb2.ListAgentsResponse.FromString,
        )
        while not stop.is_set():
            await stub(management_pb2.ListAgentsRequest(filter=name), timeout=5)
            calls.append(name)
            await asyncio.sleep(0.02)


def test_a_renewed_certificate_is_served_to_new_handshakes_and_no_connection_drops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = Pki(tmp_path)
    connections = recording(monkeypatch)

    async def body(h: Harness) -> None:
        gw = start(h, pki, IDENTITY)
        old = pki.listener.cert.serial_number
        assert await serial_now(pki, gw.port) == old
        assert gw.metric(EXPIRY, LABELS) == pki.listener.cert.not_valid_after_utc.timestamp()
        stop, calls = asyncio.Event(), []
        clients = [
            asyncio.create_task(keep_calling(gw, f"agent-{i}", stop, calls)) for i in range(CLIENTS)
        ]

        async def all_calling() -> bool:
            return len(set(calls)) == CLIENTS

        await wait_for(all_calling, "every client calling")
        leaf = renew(pki)

        async def renewed() -> bool:
            return await serial_now(pki, gw.port) == leaf.cert.serial_number

        await wait_for(renewed, "the renewed certificate on a new handshake")
        before = len(calls)
        await wait_for(lambda: _true(len(calls) >= before + 2 * CLIENTS), "calls after")
        stop.set()
        await asyncio.gather(*clients)  # no call failed
        # Each client's calls all came over the one connection it opened before the reload.
        assert {name: len(keys) for name, keys in connections.items()} == {
            f"agent-{i}": 1 for i in range(CLIENTS)
        }
        assert gw.metric(EXPIRY, LABELS) == leaf.cert.not_valid_after_utc.timestamp()
        assert gw.metric("yuzu_gw_tls_reloads_total", {**LABELS, "result": "loaded"}) >= 1
        async with gw.client(pki.server) as chan:  # a new connection works with the new set
            stub = chan.unary_unary(
                LIST_AGENTS,
                request_serializer=management_pb2.ListAgentsRequest.SerializeToString,
                response_deserializer=management_pb2.ListAgentsResponse.FromString,
            )
            await stub(management_pb2.ListAgentsRequest(filter="new"), timeout=5)
        assert old != leaf.cert.serial_number

    mgmt_test(body)


async def _true(value: bool) -> bool:
    return value


def test_a_key_that_does_not_match_changes_nothing_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = Pki(tmp_path)
    caplog.set_level(logging.INFO, logger="yuzu_gw.mgmt_auth")

    async def body(h: Harness) -> None:
        gw = start(h, pki, IDENTITY)
        old = pki.listener.cert.serial_number
        expiry = gw.metric(EXPIRY, LABELS)
        other = pki.ca.issue("yuzu-gateway", dns=["localhost"], client_auth=False)
        assert pki.listener.cert_path is not None
        pki.listener.cert_path.write_bytes(other.cert_pem)  # a certificate without its key

        def refused() -> list[str]:
            return [r.getMessage() for r in caplog.records if "reload refused" in r.getMessage()]

        await wait_for(lambda: _true(bool(refused())), "the refusal")
        await asyncio.sleep(0.5)  # several refreshes more: still one line
        lines = refused()
        assert len(lines) == 1
        assert str(pki.listener.cert_path) in lines[0]
        assert str(pki.listener.key_path) not in lines[0]  # a key's path is never logged
        assert [r.levelname for r in caplog.records if "reload refused" in r.getMessage()] == [
            "WARNING"
        ]
        assert await serial_now(pki, gw.port) == old  # the old certificate still served
        assert gw.metric(EXPIRY, LABELS) == expiry
        assert await gw.call(pki.server) is grpc.StatusCode.OK
        # The matching key arrives: the set is complete and is loaded.
        assert pki.listener.key_path is not None
        pki.listener.key_path.write_bytes(other.key_pem)

        async def renewed() -> bool:
            return await serial_now(pki, gw.port) == other.cert.serial_number

        await wait_for(renewed, "the completed set")

    mgmt_test(body)
