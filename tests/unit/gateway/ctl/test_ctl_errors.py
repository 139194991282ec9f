"""What yuzu-gw-ctl says and exits with for each failure (gateway/ctl/errors.py)."""

from __future__ import annotations

import socket
import ssl

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from gateway.ctl.errors import (
    EXIT_FAILED,
    EXIT_UNREACHABLE,
    Where,
    explain,
)

TARGET = "gw:50063"
CONNECT = Where(TARGET, tls=False, timeout_s=10)
CALL = Where(TARGET, tls=False, timeout_s=10, phase="call")
ANSWERED = Where(TARGET, tls=False, timeout_s=10, phase="call", answered=True)


def test_refused_says_what_to_check() -> None:
    failure = explain(ConnectionRefusedError(111, "Connect call failed"), CONNECT)
    assert failure.code == EXIT_UNREACHABLE
    for hint in ("connection refused", "--target", "127.0.0.1:50063", "rel/yuzu_gw ping"):
        assert hint in failure.message


def test_a_timeout_while_connecting_is_unreachable_and_during_a_call_failed() -> None:
    connecting = explain(TimeoutError(), CONNECT)
    assert connecting.code == EXIT_UNREACHABLE
    assert "no connection to gw:50063 within 10 s" in connecting.message
    assert "firewall" in connecting.message
    calling = explain(TimeoutError(), CALL)
    assert calling.code == EXIT_FAILED and "no answer from gw:50063 in time" in calling.message
    deadline = explain(GRPCError(Status.DEADLINE_EXCEEDED, "late"), CALL)
    assert deadline == calling


def test_unresolvable_and_other_socket_errors() -> None:
    failure = explain(socket.gaierror(-2, "Name or service not known"), CONNECT)
    assert failure.code == EXIT_UNREACHABLE and "cannot resolve" in failure.message
    other = explain(OSError(113, "No route to host"), CONNECT)
    assert other.code == EXIT_UNREACHABLE and "No route to host" in other.message


def test_unauthenticated_points_at_the_peer_authorisation() -> None:
    failure = explain(GRPCError(Status.UNAUTHENTICATED, "management peer not authorized"), CALL)
    assert failure.code == EXIT_UNREACHABLE
    for hint in ("UNAUTHENTICATED", "serverAuth", "yuzu://<install>/server", "docs/mgmt-auth.md"):
        assert hint in failure.message


def test_unavailable_warns_about_lost_answers_only_after_some_came() -> None:
    before = explain(GRPCError(Status.UNAVAILABLE, "command router unavailable"), CALL)
    assert before.code == EXIT_FAILED
    assert "router is restarting or the node is stopping" in before.message
    assert "idempotent" not in before.message
    after = explain(GRPCError(Status.UNAVAILABLE, "command router restarted"), ANSWERED)
    assert "do not blindly repeat" in after.message


@pytest.mark.parametrize(
    ("status", "message", "hint"),
    [
        (Status.NOT_FOUND, "agent not held by this gateway", "does not hold that agent"),
        (Status.INVALID_ARGUMENT, "empty command_id", "refused the request"),
        (Status.UNIMPLEMENTED, "Method not found", "the agent listener (50051)"),
        (Status.UNKNOWN, "Missing content-type header", "the agent listener (50051)"),
        (Status.INTERNAL, "Internal error", "docs/runbook.md"),
        (Status.RESOURCE_EXHAUSTED, "full", "RESOURCE_EXHAUSTED: full"),
    ],
)
def test_gateway_statuses_fail_with_1(status: Status, message: str, hint: str) -> None:
    failure = explain(GRPCError(status, message), CALL)
    assert failure.code == EXIT_FAILED
    assert hint in failure.message and message in failure.message


def test_tls_failures() -> None:
    unverified = ssl.SSLCertVerificationError(1, "certificate verify failed")
    unverified.verify_message = "self-signed certificate in certificate chain"
    failure = explain(unverified, Where(TARGET, tls=True, timeout_s=10))
    assert failure.code == EXIT_UNREACHABLE
    assert "self-signed certificate" in failure.message and "--ca" in failure.message

    plaintext = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    plaintext.reason = "WRONG_VERSION_NUMBER"
    assert "drop --ca, --cert and --key" in explain(plaintext, CONNECT).message

    alert = ssl.SSLError(1, "[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca")
    alert.reason = "TLSV1_ALERT_UNKNOWN_CA"
    refused = explain(alert, CALL)
    assert refused.code == EXIT_UNREACHABLE and "--cert and --key" in refused.message


def test_a_closed_connection_depends_on_tls_and_on_how_far_the_call_got() -> None:
    lost = StreamTerminatedError("Connection lost")
    plain = explain(lost, CALL)
    assert plain.code == EXIT_UNREACHABLE and "pass --ca, --cert and --key" in plain.message
    tls = explain(lost, Where(TARGET, tls=True, timeout_s=10, phase="call"))
    assert tls.code == EXIT_UNREACHABLE and "refused this client's certificate" in tls.message
    midway = explain(ConnectionResetError(104, "reset"), ANSWERED)
    assert midway.code == EXIT_FAILED and "in the middle of the call" in midway.message


def test_anything_else_names_its_class() -> None:
    failure = explain(ValueError("odd"), CALL)
    assert failure.code == EXIT_FAILED and failure.message == "failed: ValueError: odd"
