"""How the channel names a failure: the breaker's kind and the Erlang gateway's words."""

from __future__ import annotations

import errno
import socket
import ssl

import pytest
from google.protobuf.message import DecodeError
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from actors.core.breaker import ResultKind
from gateway.upstream.failures import ResponseTooLargeError, call_error, dial_error


def ssl_error(reason: str) -> ssl.SSLError:
    error = ssl.SSLError(1, f"[SSL: {reason}] alert")
    error.reason = reason  # type: ignore[misc]
    return error


def verify_error(code: int) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    error.verify_code = code
    error.reason = "CERTIFICATE_VERIFY_FAILED"  # type: ignore[misc]
    return error


@pytest.mark.parametrize(
    ("error", "kind", "detail"),
    [
        (
            ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
            ResultKind.TRANSPORT,
            "econnrefused",
        ),
        (ConnectionResetError(errno.ECONNRESET, "reset"), ResultKind.TRANSPORT, "econnreset"),
        (OSError(errno.EHOSTUNREACH, "unreachable"), ResultKind.TRANSPORT, "ehostunreach"),
        (socket.gaierror(-2, "Name or service not known"), ResultKind.TRANSPORT, "nxdomain"),
        (TimeoutError(), ResultKind.TRANSPORT, "timeout"),
        (None, ResultKind.TRANSPORT, "closed"),
        (ssl_error("TLSV1_ALERT_UNKNOWN_CA"), ResultKind.TLS, "unknown_ca"),
        (ssl_error("SSLV3_ALERT_BAD_CERTIFICATE"), ResultKind.TLS, "bad_certificate"),
        (ssl_error("TLSV13_ALERT_CERTIFICATE_REQUIRED"), ResultKind.TLS, "certificate_required"),
        (verify_error(20), ResultKind.TLS, "unknown_ca"),
        (verify_error(10), ResultKind.TLS, "certificate_expired"),
        (verify_error(62), ResultKind.TLS, "hostname_check_failed"),
        (RuntimeError("?"), ResultKind.EXCEPTION, "RuntimeError"),
    ],
)
def test_dial_errors(error: BaseException | None, kind: ResultKind, detail: str) -> None:
    mapped = dial_error(error)
    assert (mapped.kind, mapped.detail, mapped.status) == (kind, detail, None)


@pytest.mark.parametrize(
    ("error", "kind", "status", "detail"),
    [
        (GRPCError(Status.UNAVAILABLE, "down"), ResultKind.STATUS, 14, "down"),
        (GRPCError(Status.NOT_FOUND), ResultKind.STATUS, 5, ""),
        (GRPCError(Status.UNKNOWN, "x" * 500), ResultKind.STATUS, 2, "x" * 200),
        (
            GRPCError(Status.UNAVAILABLE, "Received :status = '503'"),
            ResultKind.HTTP,
            None,
            "http status 503",
        ),
        (TimeoutError("Deadline exceeded"), ResultKind.TIMEOUT, None, "deadline exceeded"),
        (
            StreamTerminatedError(
                "Stream reset by remote party, error_code: ErrorCodes.REFUSED_STREAM"
            ),
            ResultKind.TRANSPORT,
            None,
            "stream_error (REFUSED_STREAM)",
        ),
        (
            StreamTerminatedError("Stream reset by remote party, error_code: 7"),
            ResultKind.TRANSPORT,
            None,
            "stream_error (7)",
        ),
        (StreamTerminatedError("Connection lost"), ResultKind.TRANSPORT, None, "closed"),
        (
            StreamTerminatedError("Received GOAWAY frame, closing connection; error_code: 0"),
            ResultKind.TRANSPORT,
            None,
            "closed",
        ),
        (StreamTerminatedError("Protocol error"), ResultKind.TRANSPORT, None, "protocol_error"),
        (
            ConnectionResetError("the upstream connection is closed"),
            ResultKind.TRANSPORT,
            None,
            "closed",
        ),
        (
            NotImplementedError("Compression not implemented"),
            ResultKind.EXCEPTION,
            None,
            "compressed response",
        ),
        (
            ResponseTooLargeError(),
            ResultKind.EXCEPTION,
            None,
            "response larger than max_receive_message_bytes",
        ),
        (DecodeError("bad"), ResultKind.EXCEPTION, None, "undecodable response"),
        (KeyError("x"), ResultKind.EXCEPTION, None, "KeyError"),
    ],
)
def test_call_errors(
    error: BaseException, kind: ResultKind, status: int | None, detail: str
) -> None:
    mapped = call_error(error)
    assert (mapped.kind, mapped.status, mapped.detail) == (kind, status, detail)
