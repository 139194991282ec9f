"""Services of the wire contract (design/WIRE.md): names, methods, types, streaming kinds.

Checked twice: on the protobuf service descriptors, and on the grpclib bases and stubs the
gateway actually serves and calls with (the ``/package.Service/Method`` paths gRPC routes on).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import grpclib.client
import pytest
from grpclib.const import Cardinality

from protos.yuzu.agent.v1 import agent_grpc, agent_pb2
from protos.yuzu.common.v1 import common_pb2
from protos.yuzu.gateway.v1 import gateway_grpc, gateway_pb2
from protos.yuzu.server.v1 import management_grpc, management_pb2

A = "yuzu.agent.v1."
G = "yuzu.gateway.v1."
S = "yuzu.server.v1."

UNARY = Cardinality.UNARY_UNARY
SERVER_STREAM = Cardinality.UNARY_STREAM
BIDI = Cardinality.STREAM_STREAM

# Transcribed from WIRE.md: service -> method -> (request, response, kind)
SERVICES: dict[str, dict[str, tuple[str, str, Cardinality]]] = {
    A + "AgentService": {
        "Register": (A + "RegisterRequest", A + "RegisterResponse", UNARY),
        "Heartbeat": (A + "HeartbeatRequest", A + "HeartbeatResponse", UNARY),
        "ExecuteCommand": (A + "CommandRequest", A + "CommandResponse", SERVER_STREAM),
        # the agent sends responses and receives requests
        "Subscribe": (A + "CommandResponse", A + "CommandRequest", BIDI),
        "ReportInventory": (A + "InventoryReport", A + "InventoryAck", UNARY),
        "CheckForUpdate": (A + "CheckForUpdateRequest", A + "CheckForUpdateResponse", UNARY),
        "DownloadUpdate": (A + "DownloadUpdateRequest", A + "DownloadUpdateChunk", SERVER_STREAM),
    },
    G + "GatewayUpstream": {
        "ProxyRegister": (A + "RegisterRequest", A + "RegisterResponse", UNARY),
        "BatchHeartbeat": (G + "BatchHeartbeatRequest", G + "BatchHeartbeatResponse", UNARY),
        "ProxyInventory": (A + "InventoryReport", A + "InventoryAck", UNARY),
        "NotifyStreamStatus": (G + "StreamStatusNotification", G + "StreamStatusAck", UNARY),
        "ForwardGuardianMessage": (
            G + "ForwardGuardianRequest",
            G + "ForwardGuardianAck",
            UNARY,
        ),
    },
    S + "ManagementService": {
        "ListAgents": (S + "ListAgentsRequest", S + "ListAgentsResponse", UNARY),
        "GetAgent": (S + "GetAgentRequest", S + "GetAgentResponse", UNARY),
        "SendCommand": (S + "SendCommandRequest", S + "SendCommandResponse", SERVER_STREAM),
        "WatchEvents": (S + "WatchEventsRequest", S + "AgentEvent", SERVER_STREAM),
        "QueryInventory": (S + "QueryInventoryRequest", S + "QueryInventoryResponse", UNARY),
    },
}

# service -> (message module, grpclib module)
MODULES: dict[str, tuple[ModuleType, ModuleType]] = {
    A + "AgentService": (agent_pb2, agent_grpc),
    G + "GatewayUpstream": (gateway_pb2, gateway_grpc),
    S + "ManagementService": (management_pb2, management_grpc),
}

_KINDS = {
    (False, False): UNARY,
    (False, True): SERVER_STREAM,
    (True, False): Cardinality.STREAM_UNARY,
    (True, True): BIDI,
}

_STUB_METHOD_CLASSES = {
    UNARY: grpclib.client.UnaryUnaryMethod,
    SERVER_STREAM: grpclib.client.UnaryStreamMethod,
    BIDI: grpclib.client.StreamStreamMethod,
}


def _short(full_name: str) -> str:
    return full_name.rsplit(".", 1)[1]


def test_services_live_in_the_right_files_and_nowhere_else() -> None:
    found = {
        service.full_name
        for module in (common_pb2, agent_pb2, gateway_pb2, management_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
    }
    assert found == set(SERVICES)
    for service, (pb2, _) in MODULES.items():
        assert service in {s.full_name for s in pb2.DESCRIPTOR.services_by_name.values()}


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_service_descriptor_matches_wire(service: str) -> None:
    pb2, _ = MODULES[service]
    desc = pb2.DESCRIPTOR.services_by_name[_short(service)]
    assert desc.full_name == service
    actual = {
        m.name: (
            m.input_type.full_name,
            m.output_type.full_name,
            _KINDS[(m.client_streaming, m.server_streaming)],
        )
        for m in desc.methods
    }
    assert actual == SERVICES[service]


def _concrete_base(service: str) -> Any:
    _, grpc_module = MODULES[service]
    base = getattr(grpc_module, _short(service) + "Base")

    async def handler(self: Any, stream: Any) -> None:
        return None

    assert base.__abstractmethods__ == frozenset(SERVICES[service])
    impl = type("Impl", (base,), dict.fromkeys(base.__abstractmethods__, handler))
    return impl()


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_grpclib_base_routes_match_wire(service: str) -> None:
    mapping = _concrete_base(service).__mapping__()
    expected = {f"/{service}/{name}": spec for name, spec in SERVICES[service].items()}
    assert set(mapping) == set(expected)
    for path, (request, response, kind) in expected.items():
        handler = mapping[path]
        assert handler.cardinality is kind, path
        assert handler.request_type.DESCRIPTOR.full_name == request, path
        assert handler.reply_type.DESCRIPTOR.full_name == response, path


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_grpclib_stub_matches_wire(service: str) -> None:
    _, grpc_module = MODULES[service]
    stub = getattr(grpc_module, _short(service) + "Stub")(object())
    for name, (request, response, kind) in SERVICES[service].items():
        method = getattr(stub, name)
        assert type(method) is _STUB_METHOD_CLASSES[kind], name
        assert method.name == f"/{service}/{name}"
        assert method.request_type.DESCRIPTOR.full_name == request, name
        assert method.reply_type.DESCRIPTOR.full_name == response, name
