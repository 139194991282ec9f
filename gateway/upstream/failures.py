"""From what grpclib, h2, ssl and the socket raise to `UpstreamCallError`.

The `kind` is what the circuit breaker classifies (`actors.core.breaker.classify`); the
`detail` names the failure the way the Erlang gateway's log lines did (econnrefused, closed,
an alert name such as unknown_ca), so operators can search for the same words. A detail never
holds request or response contents, metadata values or file paths.

| raised | kind | detail |
| --- | --- | --- |
| a gRPC status from the server | STATUS (`status` = the code) | the server's message, cut |
| an HTTP `:status` other than 200 | HTTP | `http status 503` |
| the call's deadline (grpclib's own timer) | TIMEOUT | `deadline exceeded` |
| the stream reset by the server | TRANSPORT | `stream_error (REFUSED_STREAM)` |
| the connection lost or sent GOAWAY during the call | TRANSPORT | `closed` |
| a dial refused, reset, unreachable, not resolved | TRANSPORT | `econnrefused`, `nxdomain`, ... |
| a TLS handshake failure or alert | TLS | `unknown_ca`, `certificate_required`, ... |
| a compressed or oversized or undecodable response | EXCEPTION | what it was |
"""

from __future__ import annotations

import asyncio
import errno
import re
import socket
import ssl

import h2.exceptions
from google.protobuf.message import DecodeError
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from actors.core.breaker import ResultKind
from actors.upstream.api import UpstreamCallError

__all__ = [
    "ResponseTooLargeError",
    "call_error",
    "dial_error",
    "is_tls_error",
]

# The server's grpc-message is logged by the callers; a server that sends a novel is cut.
_MESSAGE_MAX = 200
_RESET = re.compile(r"error_code: (?:ErrorCodes\.)?(\w+)")
# OpenSSL reason codes of alerts: SSLV3_ALERT_BAD_CERTIFICATE, TLSV1_ALERT_UNKNOWN_CA,
# TLSV13_ALERT_CERTIFICATE_REQUIRED -> bad_certificate, unknown_ca, certificate_required.
_ALERT_PREFIX = re.compile(r"^(?:SSLV3|TLSV1|TLSV13)_ALERT_")
# X509 verification results of the client's own check of the server's certificate, named as
# the Erlang ssl application names the alert it sends.
_VERIFY_CODES = {
    2: "unknown_ca",  # unable to get issuer certificate
    10: "certificate_expired",
    9: "certificate_not_yet_valid",
    18: "unknown_ca",  # self-signed leaf
    19: "unknown_ca",  # self-signed certificate in chain
    20: "unknown_ca",  # unable to get local issuer certificate
    21: "unknown_ca",  # unable to verify the first certificate
    62: "hostname_check_failed",
}


class ResponseTooLargeError(Exception):
    """A response message above the channel's max_receive_message_bytes."""


def _errno_name(error: OSError) -> str:
    if error.errno is not None and error.errno in errno.errorcode:
        return errno.errorcode[error.errno].lower()
    return type(error).__name__


def tls_reason(error: ssl.SSLError) -> str:
    if isinstance(error, ssl.SSLCertVerificationError):
        return _VERIFY_CODES.get(error.verify_code, "bad_certificate")
    reason = getattr(error, "reason", None)
    if isinstance(reason, str) and reason:
        return _ALERT_PREFIX.sub("", reason).lower()
    return "tls_error"


def is_tls_error(error: BaseException) -> bool:
    return isinstance(error, ssl.SSLError)


def dial_error(error: BaseException | None) -> UpstreamCallError:
    """Why a dial did not give a live connection (no TCP, no TLS, or no HTTP/2 settings)."""
    if error is None:
        return UpstreamCallError(ResultKind.TRANSPORT, detail="closed")
    if isinstance(error, ssl.SSLError):
        return UpstreamCallError(ResultKind.TLS, detail=tls_reason(error))
    if isinstance(error, TimeoutError):
        return UpstreamCallError(ResultKind.TRANSPORT, detail="timeout")
    if isinstance(error, socket.gaierror):
        return UpstreamCallError(ResultKind.TRANSPORT, detail="nxdomain")
    if isinstance(error, OSError):
        return UpstreamCallError(ResultKind.TRANSPORT, detail=_errno_name(error))
    return UpstreamCallError(ResultKind.EXCEPTION, detail=type(error).__name__)


def _terminated(error: StreamTerminatedError) -> UpstreamCallError:
    text = str(error)
    if text.startswith("Stream reset"):
        match = _RESET.search(text)
        code = match.group(1) if match else "unknown"
        return UpstreamCallError(ResultKind.TRANSPORT, detail=f"stream_error ({code})")
    if text.startswith("Protocol error"):
        return UpstreamCallError(ResultKind.TRANSPORT, detail="protocol_error")
    return UpstreamCallError(ResultKind.TRANSPORT, detail="closed")


def call_error(error: BaseException) -> UpstreamCallError:
    """Why a call that had a connection failed."""
    if isinstance(error, UpstreamCallError):
        return error
    if isinstance(error, GRPCError):
        message = error.message or ""
        if message.startswith("Received :status"):
            status = message.rpartition("=")[2].strip(" '\"")
            return UpstreamCallError(ResultKind.HTTP, detail=f"http status {status}")
        return UpstreamCallError(ResultKind.STATUS, int(error.status.value), message[:_MESSAGE_MAX])
    if isinstance(error, asyncio.TimeoutError | TimeoutError):
        return UpstreamCallError(ResultKind.TIMEOUT, detail="deadline exceeded")
    if isinstance(error, StreamTerminatedError):
        return _terminated(error)
    if isinstance(error, NotImplementedError):
        # grpclib's answer to a message with the compressed flag: messages are never compressed.
        return UpstreamCallError(ResultKind.EXCEPTION, detail="compressed response")
    if isinstance(error, ResponseTooLargeError):
        return UpstreamCallError(
            ResultKind.EXCEPTION, detail="response larger than max_receive_message_bytes"
        )
    if isinstance(error, DecodeError):
        return UpstreamCallError(ResultKind.EXCEPTION, detail="undecodable response")
    if isinstance(error, ssl.SSLError):
        return UpstreamCallError(ResultKind.TLS, detail=tls_reason(error))
    if isinstance(error, ConnectionError | h2.exceptions.StreamClosedError):
        return UpstreamCallError(ResultKind.TRANSPORT, detail="closed")
    if isinstance(error, OSError):
        return UpstreamCallError(ResultKind.TRANSPORT, detail=_errno_name(error))
    if isinstance(error, ProtocolError | h2.exceptions.ProtocolError):
        return UpstreamCallError(ResultKind.EXCEPTION, detail=f"protocol {type(error).__name__}")
    return UpstreamCallError(ResultKind.EXCEPTION, detail=type(error).__name__)
