"""The exit statuses of `yuzu-gw-ctl` and what each failure tells the operator to check.

- 0: done (`send`: every target's final answer was SUCCESS; `watch`: ended with Ctrl-C);
- 1: the gateway answered with an error status (NOT_FOUND, INVALID_ARGUMENT, UNAVAILABLE, ...),
  no answer came in time, or the connection was lost in the middle of a call;
- 2: usage: a bad option or argument, or a TLS file that cannot be used;
- 3: no connection, the TLS handshake failed, or the gateway did not authorise this client
  (UNAUTHENTICATED);
- 4: `send`: the command ran, but at least one target's final answer was not SUCCESS;
- 130: interrupted (Ctrl-C) before the end of a `send`, a list or a get.

`explain` is pure: an exception and where it happened in, a message and a status out.
"""

from __future__ import annotations

import socket
import ssl
from typing import Literal

import attrs
from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TARGETS_FAILED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "Failure",
    "Where",
    "explain",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_TARGETS_FAILED = 4
EXIT_INTERRUPTED = 130  # the shell's 128 + SIGINT

_CHECK_NODE = "that the node runs (`rel/yuzu_gw ping`)"
_CHECK_LISTENER = (
    "the address (--target: the management listener, the `mgmt` entry of grpc_listeners;"
    " 127.0.0.1:50063 in the dev config, moved by YUZU_GW_MGMT_PORT)"
)
_WHO_IS_ADMITTED = (
    "The management listener admits only the Yuzu server's certificate: the serverAuth"
    " extended key usage and, per mgmt_peer_auth_mode, the pinned key (mgmt_peer_pins) or the"
    " identity yuzu://<install>/server in a URI SAN (docs/mgmt-auth.md)"
)


@attrs.frozen
class Where:
    """What the command was doing: `phase` connect (TCP and TLS) or call; `answered` once any
    answer (headers or a message) came back."""

    target: str
    tls: bool
    timeout_s: float
    phase: Literal["connect", "call"] = "connect"
    answered: bool = False


@attrs.frozen
class Failure:
    message: str
    code: int


def explain(exc: BaseException, where: Where) -> Failure:
    if isinstance(exc, GRPCError):
        return _status(exc, where)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return Failure(
            f"the gateway's certificate at {where.target} was not accepted"
            f" ({exc.verify_message}): --ca must name the CA that issued the management"
            " listener's certificate (the install CA); use --server-name NAME when the address"
            " you dial is not a name the certificate carries",
            EXIT_UNREACHABLE,
        )
    if isinstance(exc, ssl.SSLError):
        return _tls(exc, where)
    if isinstance(exc, TimeoutError):
        return _timeout(where)
    if isinstance(exc, StreamTerminatedError | ProtocolError | ConnectionError):
        return _closed(exc, where)
    if isinstance(exc, socket.gaierror):
        return Failure(
            f"cannot resolve the host of {where.target} ({exc.strerror}): check --target",
            EXIT_UNREACHABLE,
        )
    if isinstance(exc, OSError) and where.phase == "connect":
        return Failure(
            f"cannot connect to {where.target}: {exc.strerror or exc}. Check {_CHECK_LISTENER}"
            f" and {_CHECK_NODE}",
            EXIT_UNREACHABLE,
        )
    return Failure(f"failed: {type(exc).__name__}: {exc}", EXIT_FAILED)


def _status(exc: GRPCError, where: Where) -> Failure:
    name, detail = exc.status.name, exc.message or "no message"
    said = f"{name}: {detail}"
    match exc.status:
        case Status.UNAUTHENTICATED | Status.PERMISSION_DENIED:
            return Failure(
                f"the gateway did not authorise this client ({said}). {_WHO_IS_ADMITTED}; the"
                " node logs the reason as `management peer refused: <reason>`",
                EXIT_UNREACHABLE,
            )
        case Status.UNAVAILABLE:
            lost = (
                " Answers not printed above are lost, and those agents may still have run the"
                " command: do not blindly repeat a command that is not idempotent."
                if where.answered
                else ""
            )
            return Failure(
                f"the gateway cannot serve this now ({said}): its command router is restarting"
                f" or the node is stopping; try again in a few seconds.{lost}",
                EXIT_FAILED,
            )
        case Status.NOT_FOUND:
            return Failure(
                f"not found ({said}): this gateway does not hold that agent; another gateway"
                " may, or it is offline (`yuzu-gw-ctl agents list`)",
                EXIT_FAILED,
            )
        case Status.INVALID_ARGUMENT:
            return Failure(f"the gateway refused the request ({said})", EXIT_FAILED)
        case Status.UNIMPLEMENTED:
            return _not_management(said, where)
        case Status.UNKNOWN if "content-type" in detail.lower():
            # grpclib's own answer to an unknown method carries no content-type.
            return _not_management(said, where)
        case Status.INTERNAL:
            return Failure(
                f"the gateway failed the call ({said}); its log has an ERROR line"
                " `<Method> failed: ...` (docs/runbook.md)",
                EXIT_FAILED,
            )
        case Status.DEADLINE_EXCEEDED:
            return _timeout(where)
        case _:
            return Failure(f"the call failed ({said})", EXIT_FAILED)


def _not_management(said: str, where: Where) -> Failure:
    return Failure(
        f"{where.target} does not serve the ManagementService ({said}): is --target the"
        " agent listener (50051) instead of the management listener (50063)?",
        EXIT_FAILED,
    )


def _tls(exc: ssl.SSLError, where: Where) -> Failure:
    reason = exc.reason or str(exc)
    if "ALERT" in reason:
        # The gateway's side of the handshake refused what this client presented.
        return Failure(
            f"the gateway refused this client's certificate in the TLS handshake ({reason}):"
            " present one the install CA issued with --cert and --key (docs/mgmt-auth.md)",
            EXIT_UNREACHABLE,
        )
    return Failure(
        f"the TLS handshake with {where.target} failed ({reason}): is the listener plaintext"
        " (the dev config's is)? Then drop --ca, --cert and --key",
        EXIT_UNREACHABLE,
    )


def _timeout(where: Where) -> Failure:
    if where.phase == "connect":
        return Failure(
            f"no connection to {where.target} within {where.timeout_s:g} s. Check"
            f" {_CHECK_LISTENER}, that no firewall drops the packets, and {_CHECK_NODE}",
            EXIT_UNREACHABLE,
        )
    return Failure(
        f"no answer from {where.target} in time (--timeout {where.timeout_s:g} s before the"
        " command word; `send --timeout` is the command's own)",
        EXIT_FAILED,
    )


def _closed(exc: Exception, where: Where) -> Failure:
    if where.phase == "connect" and isinstance(exc, ConnectionRefusedError):
        return Failure(
            f"cannot connect to {where.target}: connection refused. Check {_CHECK_LISTENER},"
            f" {_CHECK_NODE}, and that its configuration has a management listener",
            EXIT_UNREACHABLE,
        )
    if where.answered:
        return Failure(
            f"the connection to {where.target} was lost in the middle of the call ({exc}):"
            f" did the node stop or restart? Check {_CHECK_NODE}",
            EXIT_FAILED,
        )
    if where.tls:
        return Failure(
            f"the connection to {where.target} was closed before the gateway answered ({exc}):"
            " it may have refused this client's certificate in the TLS handshake (none, or"
            " one the install CA did not issue; docs/mgmt-auth.md)",
            EXIT_UNREACHABLE,
        )
    return Failure(
        f"the connection to {where.target} was closed before the gateway answered ({exc}): a"
        " listener that runs TLS (production, `rel/yuzu_gw devstack --tls`) closes a plaintext"
        " client; pass --ca, --cert and --key (docs/tls.md)",
        EXIT_UNREACHABLE,
    )
