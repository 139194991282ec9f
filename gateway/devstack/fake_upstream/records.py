"""What the fake Yuzu server records and answers with: its methods, a call as recorded, a
scripted fault, how a session was presented, and its session tables."""

from __future__ import annotations

import enum
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import grpc.aio
from google.protobuf.message import Message

from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2

SERVICE = "yuzu.gateway.v1.GatewayUpstream"

#: method name -> (request class, response class)
METHODS: dict[str, tuple[type[Message], type[Message]]] = {
    "ProxyRegister": (agent_pb2.RegisterRequest, agent_pb2.RegisterResponse),
    "BatchHeartbeat": (gateway_pb2.BatchHeartbeatRequest, gateway_pb2.BatchHeartbeatResponse),
    "ProxyInventory": (agent_pb2.InventoryReport, agent_pb2.InventoryAck),
    "NotifyStreamStatus": (gateway_pb2.StreamStatusNotification, gateway_pb2.StreamStatusAck),
    "ForwardGuardianMessage": (gateway_pb2.ForwardGuardianRequest, gateway_pb2.ForwardGuardianAck),
}

SESSION_METADATA_KEY = "x-yuzu-session-id"
SESSION_PREFIX = "gw-session-"
UNKNOWN_CAP = 4096  # the server lists at most this many unknown session ids
MAX_LISTED_ID_BYTES = 64  # longer (and empty) ids are never listed


class KeyPair(Protocol):
    @property
    def cert_pem(self) -> bytes: ...

    @property
    def key_pem(self) -> bytes: ...


class ServerTls(Protocol):
    """What the fake reads of a PKI: the server leaf it presents and the CA it trusts for client
    certificates (the dev stack's `DevPki` and the tests' `Pki` both have them)."""

    @property
    def server(self) -> KeyPair: ...

    @property
    def ca_cert_pem(self) -> bytes: ...


def method_path(method: str) -> str:
    """The gRPC path of a method, ``/yuzu.gateway.v1.GatewayUpstream/<method>``."""
    return f"/{SERVICE}/{method}"


def mint_session_id() -> str:
    """A session id as the server mints them: ``gw-session-`` and 32 lowercase hex."""
    return SESSION_PREFIX + secrets.token_hex(16)


@dataclass(frozen=True)
class Fault:
    """A gRPC error to answer with: status code, details and trailing metadata."""

    code: grpc.StatusCode
    details: str = ""
    trailers: tuple[tuple[str, str | bytes], ...] = ()


#: What a call can be answered with: an error, or a response message of the method's type.
Outcome = Fault | Message


class Presented(enum.Enum):
    """How ProxyRegister treats a session presented in ``x-yuzu-session-id``."""

    ADOPT = "adopt"  # answer accepted=true with that session id
    REFUSE = "refuse"  # answer accepted=false with the configured reason
    SUPERSEDED = "superseded"  # fail with FAILED_PRECONDITION


@dataclass
class Call:
    """One RPC the fake received. ``code`` is None until it is answered."""

    method: str
    request: Any  # the parsed request message
    metadata: dict[str, str | bytes]  # invocation metadata, last value per key
    received_at: float  # time.monotonic()
    peer: str  # e.g. "ipv4:127.0.0.1:51234"
    deadline: float | None  # seconds left of the client's deadline on arrival; None: none
    code: grpc.StatusCode | None = None  # OK, the scripted status, or CANCELLED
    response: Any = None  # the response message sent, when OK
    answered_at: float | None = None


class Sessions:
    """session id <-> agent id, one session per agent (a newer one supersedes the older)."""

    def __init__(self) -> None:
        self.by_session: dict[str, str] = {}
        self.by_agent: dict[str, str] = {}

    def bind(self, session_id: str, agent_id: str) -> None:
        self.drop(session_id)
        old = self.by_agent.get(agent_id)
        if old is not None:
            del self.by_session[old]
        self.by_session[session_id] = agent_id
        self.by_agent[agent_id] = session_id

    def drop(self, session_id: str) -> None:
        agent_id = self.by_session.pop(session_id, None)
        if agent_id is not None and self.by_agent.get(agent_id) == session_id:
            del self.by_agent[agent_id]

    def clear(self) -> None:
        self.by_session.clear()
        self.by_agent.clear()


def check_methods(methods: Iterable[str]) -> tuple[str, ...]:
    methods = tuple(methods)
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"unknown GatewayUpstream method {m!r}; one of {sorted(METHODS)}")
    return methods or tuple(METHODS)


def trailers_of(
    trailers: Mapping[str, str | bytes] | Sequence[tuple[str, str | bytes]] | None,
) -> tuple[tuple[str, str | bytes], ...]:
    if not trailers:
        return ()
    items = trailers.items() if isinstance(trailers, Mapping) else trailers
    return tuple((k, v) for k, v in items)
