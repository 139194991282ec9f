"""`python -m tests.support.grpcio_probe HOST:PORT SERVICE...`: ask a gRPC server with grpcio's
own Health stub (grpcio-health-checking) and reflection client (grpcio-reflection), print JSON:

    {"health": {SERVICE: "SERVING" | "NOT_SERVING" | <status code name>, ...},
     "services": [every service reflection lists],
     "agent_methods": [the AgentService's methods, as reflection describes them] | null}

A process of its own: the generated classes of those packages declare the same protobuf names
as grpclib's health and reflection modules, and one descriptor pool refuses the second set, so
they never load in a process that runs a node.
"""

from __future__ import annotations

import json
import sys

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

AGENT_SERVICE = "yuzu.agent.v1.AgentService"
TIMEOUT_S = 5.0


def probe(target: str, services: list[str]) -> dict[str, object]:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        health: dict[str, str] = {}
        for service in services:
            request = health_pb2.HealthCheckRequest(service=service)
            try:
                answer = stub.Check(request, timeout=TIMEOUT_S)
            except grpc.RpcError as error:
                health[service] = error.code().name
            else:
                health[service] = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
        database = ProtoReflectionDescriptorDatabase(channel)
        listed = sorted(database.get_services())
        methods = None
        if AGENT_SERVICE in listed:
            described = DescriptorPool(database).FindServiceByName(AGENT_SERVICE)
            methods = sorted(method.name for method in described.methods)
    return {"health": health, "services": listed, "agent_methods": methods}


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1], sys.argv[2:])))
