"""The generated message classes against the wire contract (design/WIRE.md).

Two independent checks:

* the descriptors of the generated modules against a table transcribed by hand from WIRE.md
  (every field with its number and type, nothing extra, oneofs, enum values, packages);
* a cross-stack round trip: every message type, with every field populated, is encoded with the
  generated classes and decoded in a separate Python process by classes that grpcio-tools
  generates from a minimal ``.proto`` rendering of the same table (not from ``protos/``), in
  that process's own descriptor pool. The other side re-encodes; bytes and parsed values must
  match and nothing may arrive as an unknown field.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.common.v1 import common_pb2
from protos.yuzu.gateway.v1 import gateway_pb2
from protos.yuzu.server.v1 import management_pb2

C = "yuzu.common.v1."
A = "yuzu.agent.v1."
G = "yuzu.gateway.v1."
S = "yuzu.server.v1."

# ---------------------------------------------------------------------------------------------
# WIRE.md, transcribed. Types: scalar names, fully qualified message/enum names,
# "repeated <type>", "map<key,value>".
# ---------------------------------------------------------------------------------------------

MESSAGES: dict[str, dict[str, tuple[int, str]]] = {
    # yuzu.common.v1
    C + "Platform": {"os": (1, "string"), "arch": (2, "string"), "version": (3, "string")},
    C + "PluginInfo": {
        "name": (1, "string"),
        "version": (2, "string"),
        "description": (3, "string"),
        "capabilities": (4, "repeated string"),
    },
    C + "ErrorDetail": {
        "code": (1, "string"),
        "message": (2, "string"),
        "metadata": (3, "map<string,string>"),
    },
    C + "Timestamp": {"millis_epoch": (1, "int64")},
    C + "ScopeExpression": {
        "condition": (1, C + "ScopeCondition"),
        "combinator": (2, C + "ScopeCombinator"),
    },
    C + "ScopeCondition": {
        "attribute": (1, "string"),
        "op": (2, "string"),
        "value": (3, "string"),
        "values": (4, "repeated string"),
    },
    C + "ScopeCombinator": {
        "op": (1, C + "ScopeCombinator.Op"),
        "children": (2, "repeated " + C + "ScopeExpression"),
    },
    # yuzu.agent.v1
    A + "AgentInfo": {
        "agent_id": (1, "string"),
        "hostname": (2, "string"),
        "platform": (3, C + "Platform"),
        "agent_version": (4, "string"),
        "plugins": (5, "repeated " + C + "PluginInfo"),
        "scopable_tags": (6, "map<string,string>"),
    },
    A + "RegisterRequest": {
        "info": (1, A + "AgentInfo"),
        "enrollment_token": (2, "string"),
        "machine_certificate": (3, "bytes"),
        "attestation_signature": (4, "bytes"),
        "attestation_provider": (5, "string"),
        "gateway_observed_peer": (6, "string"),
        "csr_pem": (7, "string"),
    },
    A + "RegisterResponse": {
        "session_id": (1, "string"),
        "accepted": (2, "bool"),
        "reject_reason": (3, "string"),
        "pending_commands": (4, "repeated " + A + "CommandRequest"),
        "enrollment_status": (5, "string"),
        "agent_credential": (6, "string"),
        "issued_certificate": (7, "string"),
        "issued_ca_chain": (8, "string"),
    },
    A + "HeartbeatRequest": {
        "session_id": (1, "string"),
        "sent_at": (2, C + "Timestamp"),
        "status_tags": (3, "map<string,string>"),
        "fleet_snapshot_json": (4, "bytes"),
    },
    A + "HeartbeatResponse": {
        "acknowledged": (1, "bool"),
        "server_time": (2, C + "Timestamp"),
        "pending_commands": (3, "repeated " + A + "CommandRequest"),
    },
    A + "CommandRequest": {
        "command_id": (1, "string"),
        "plugin": (2, "string"),
        "action": (3, "string"),
        "parameters": (4, "map<string,string>"),
        "expires_at": (5, C + "Timestamp"),
        "stagger_seconds": (6, "int32"),
        "delay_seconds": (7, "int32"),
        "payload": (8, "bytes"),
        "dispatch_tag": (9, "string"),
    },
    A + "CommandResponse": {
        "command_id": (1, "string"),
        "status": (2, A + "CommandResponse.Status"),
        "output": (3, "string"),
        "exit_code": (4, "int32"),
        "error": (5, C + "ErrorDetail"),
        "sent_at": (6, C + "Timestamp"),
        "plugin": (7, "string"),
        "action": (8, "string"),
        "payload": (9, "bytes"),
    },
    A + "InventoryReport": {
        "session_id": (1, "string"),
        "collected_at": (2, C + "Timestamp"),
        "plugin_data": (3, "map<string,bytes>"),
        "content_hashes": (4, "map<string,string>"),
    },
    A + "InventoryAck": {"received": (1, "bool"), "need_full": (2, "repeated string")},
    A + "CheckForUpdateRequest": {
        "agent_id": (1, "string"),
        "current_version": (2, "string"),
        "platform": (3, C + "Platform"),
    },
    A + "CheckForUpdateResponse": {
        "update_available": (1, "bool"),
        "latest_version": (2, "string"),
        "sha256": (3, "string"),
        "mandatory": (4, "bool"),
        "eligible": (5, "bool"),
        "file_size": (6, "int64"),
    },
    A + "DownloadUpdateRequest": {
        "agent_id": (1, "string"),
        "version": (2, "string"),
        "platform": (3, C + "Platform"),
    },
    A + "DownloadUpdateChunk": {
        "data": (1, "bytes"),
        "offset": (2, "int64"),
        "total_size": (3, "int64"),
    },
    # yuzu.gateway.v1
    G + "BatchHeartbeatRequest": {
        "heartbeats": (1, "repeated " + A + "HeartbeatRequest"),
        "gateway_node": (2, "string"),
    },
    G + "BatchHeartbeatResponse": {
        "acknowledged_count": (1, "int32"),
        "unknown_session_ids": (2, "repeated string"),
        "unknown_session_ids_truncated": (3, "bool"),
    },
    G + "StreamStatusNotification": {
        "agent_id": (1, "string"),
        "session_id": (2, "string"),
        "event": (3, G + "StreamStatusNotification.Event"),
        "peer_addr": (4, "string"),
        "gateway_node": (5, "string"),
        "wire_capabilities": (6, "repeated string"),
        "cluster_id": (7, "string"),
        "stream_home_id": (8, "string"),
    },
    G + "StreamStatusAck": {"acknowledged": (1, "bool")},
    G + "ForwardGuardianRequest": {
        "agent_id": (1, "string"),
        "response": (2, A + "CommandResponse"),
    },
    G + "ForwardGuardianAck": {"acknowledged": (1, "bool")},
    # yuzu.server.v1
    S + "ListAgentsRequest": {
        "filter": (1, "string"),
        "limit": (2, "int32"),
        "cursor": (3, "string"),
    },
    S + "AgentSummary": {
        "agent_id": (1, "string"),
        "hostname": (2, "string"),
        "platform": (3, C + "Platform"),
        "agent_version": (4, "string"),
        "online": (5, "bool"),
        "last_seen": (6, C + "Timestamp"),
    },
    S + "ListAgentsResponse": {
        "agents": (1, "repeated " + S + "AgentSummary"),
        "next_cursor": (2, "string"),
    },
    S + "GetAgentRequest": {"agent_id": (1, "string")},
    S + "GetAgentResponse": {
        "summary": (1, S + "AgentSummary"),
        "plugins": (2, "repeated " + C + "PluginInfo"),
    },
    S + "SendCommandRequest": {
        "agent_ids": (1, "repeated string"),
        "command": (2, A + "CommandRequest"),
        "timeout_seconds": (3, "int32"),
    },
    S + "SendCommandResponse": {
        "agent_id": (1, "string"),
        "response": (2, A + "CommandResponse"),
    },
    S + "WatchEventsRequest": {"agent_ids": (1, "repeated string")},
    S + "AgentEvent": {
        "agent_id": (1, "string"),
        "occurred_at": (2, C + "Timestamp"),
        "connected": (3, S + "AgentConnected"),
        "disconnected": (4, S + "AgentDisconnected"),
        "plugin_loaded": (5, S + "AgentPluginLoaded"),
    },
    S + "AgentConnected": {"session_id": (1, "string")},
    S + "AgentDisconnected": {"reason": (1, "string")},
    S + "AgentPluginLoaded": {"plugin": (1, C + "PluginInfo")},
    S + "QueryInventoryRequest": {"agent_id": (1, "string"), "plugin": (2, "string")},
    S + "QueryInventoryResponse": {
        "agent_id": (1, "string"),
        "plugin_data": (2, "map<string,bytes>"),
        "collected_at": (3, C + "Timestamp"),
    },
}

ONEOFS: dict[str, dict[str, tuple[str, ...]]] = {
    C + "ScopeExpression": {"expr": ("condition", "combinator")},
    S + "AgentEvent": {"event": ("connected", "disconnected", "plugin_loaded")},
}

ENUMS: dict[str, dict[str, int]] = {
    C + "ScopeCombinator.Op": {"AND": 0, "OR": 1, "NOT": 2},
    A + "CommandResponse.Status": {
        "RUNNING": 0,
        "SUCCESS": 1,
        "FAILURE": 2,
        "TIMEOUT": 3,
        "REJECTED": 4,
    },
    G + "StreamStatusNotification.Event": {"CONNECTED": 0, "DISCONNECTED": 1},
}

# package -> (generated module, WIRE.md file name, packages it imports)
PACKAGES: dict[str, tuple[ModuleType, str, tuple[str, ...]]] = {
    "yuzu.common.v1": (common_pb2, "common.proto", ()),
    "yuzu.agent.v1": (agent_pb2, "agent.proto", ("yuzu.common.v1",)),
    "yuzu.gateway.v1": (gateway_pb2, "gateway.proto", ("yuzu.agent.v1", "yuzu.common.v1")),
    "yuzu.server.v1": (management_pb2, "management.proto", ("yuzu.common.v1", "yuzu.agent.v1")),
}

# ---------------------------------------------------------------------------------------------
# Descriptor helpers
# ---------------------------------------------------------------------------------------------

_SCALAR_NAMES = {
    getattr(FieldDescriptor, attr): attr.removeprefix("TYPE_").lower()
    for attr in dir(FieldDescriptor)
    if attr.startswith("TYPE_") and attr not in {"TYPE_MESSAGE", "TYPE_ENUM", "TYPE_GROUP"}
}


def _package_of(full_name: str) -> str:
    return ".".join(full_name.split(".")[:3])


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _type_of(field: FieldDescriptor) -> str:
    if _is_map(field):
        entry = field.message_type
        key = _type_of(entry.fields_by_name["key"])
        value = _type_of(entry.fields_by_name["value"])
        return f"map<{key},{value}>"
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        base = field.message_type.full_name
    elif field.type == FieldDescriptor.TYPE_ENUM:
        base = field.enum_type.full_name
    else:
        base = _SCALAR_NAMES.get(field.type, f"<type {field.type}>")
    return f"repeated {base}" if field.is_repeated else base


def _walk_messages(descriptors: Any) -> Iterator[Descriptor]:
    for desc in descriptors:
        if desc.GetOptions().map_entry:
            continue
        yield desc
        yield from _walk_messages(desc.nested_types)


def _all_generated_messages() -> dict[str, Descriptor]:
    found: dict[str, Descriptor] = {}
    for module, _, _ in PACKAGES.values():
        for desc in _walk_messages(module.DESCRIPTOR.message_types_by_name.values()):
            found[desc.full_name] = desc
    return found


def _all_generated_enums() -> dict[str, EnumDescriptor]:
    found: dict[str, EnumDescriptor] = {}
    for module, _, _ in PACKAGES.values():
        for enum in module.DESCRIPTOR.enum_types_by_name.values():
            found[enum.full_name] = enum
        for desc in _walk_messages(module.DESCRIPTOR.message_types_by_name.values()):
            for enum in desc.enum_types:
                found[enum.full_name] = enum
    return found


GENERATED = _all_generated_messages()


def _class_of(desc: Descriptor) -> type[Message]:
    module = PACKAGES[_package_of(desc.full_name)][0]
    cls: Any = module
    for part in desc.full_name[len(desc.file.package) + 1 :].split("."):
        cls = getattr(cls, part)
    return cls


# ---------------------------------------------------------------------------------------------
# Descriptors against the table
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_file_package_syntax_and_imports(package: str) -> None:
    module, file_name, imports = PACKAGES[package]
    proto = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
    assert proto.package == package
    assert proto.syntax == "proto3"
    assert Path(proto.name).name == file_name
    imported = {dep.package for dep in module.DESCRIPTOR.dependencies}
    assert imported <= set(imports)
    assert not proto.options.ListFields(), "file options are not part of the contract"


def test_no_message_missing_or_extra() -> None:
    assert sorted(GENERATED) == sorted(MESSAGES)


def test_no_enum_missing_or_extra() -> None:
    assert sorted(_all_generated_enums()) == sorted(ENUMS)


@pytest.mark.parametrize("message", sorted(MESSAGES))
def test_fields_match_wire(message: str) -> None:
    desc = GENERATED[message]
    actual = {f.name: (f.number, _type_of(f)) for f in desc.fields}
    assert actual == MESSAGES[message]


@pytest.mark.parametrize("message", sorted(MESSAGES))
def test_oneofs_and_presence_match_wire(message: str) -> None:
    desc = GENERATED[message]
    expected = ONEOFS.get(message, {})
    actual = {o.name: tuple(f.name for f in o.fields) for o in desc.oneofs}
    assert actual == expected
    in_oneof = {name for members in expected.values() for name in members}
    for field in desc.fields:
        singular_message = field.type == FieldDescriptor.TYPE_MESSAGE and not field.is_repeated
        # proto3 without `optional`: only singular messages and oneof members track presence.
        assert field.has_presence == (singular_message or field.name in in_oneof), field.name


@pytest.mark.parametrize("enum", sorted(ENUMS))
def test_enum_values_match_wire(enum: str) -> None:
    desc = _all_generated_enums()[enum]
    assert {v.name: v.number for v in desc.values} == ENUMS[enum]


# ---------------------------------------------------------------------------------------------
# Cross-stack round trip
# ---------------------------------------------------------------------------------------------

MAX_DEPTH = 3


def _scalar_sample(field: FieldDescriptor, salt: int) -> Any:
    tag = field.number * 10 + salt
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return f"{field.containing_type.name}.{field.name}#{salt}-é"
    if kind == FieldDescriptor.TYPE_BYTES:
        return bytes([0, 255, tag % 256]) + field.name.encode()
    if kind == FieldDescriptor.TYPE_BOOL:
        return True
    if kind == FieldDescriptor.TYPE_INT32:
        return -(1000 + tag)  # negative: a 10-byte varint, differs from sint32/uint32
    if kind == FieldDescriptor.TYPE_INT64:
        return (1 << 40) + tag  # beyond 32 bits
    if kind == FieldDescriptor.TYPE_ENUM:
        return max(v.number for v in field.enum_type.values)
    raise AssertionError(f"no sample for {field.full_name} (type {kind})")


def _populate(desc: Descriptor, variant: int, depth: int) -> Message:
    msg = _class_of(desc)()
    chosen = {o.fields[variant % len(o.fields)].name for o in desc.oneofs}
    for field in desc.fields:
        if field.containing_oneof is not None and field.name not in chosen:
            continue
        target: Any = getattr(msg, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            for salt, key in enumerate(("k1", "k2")):
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    if depth < MAX_DEPTH:
                        target[key].CopyFrom(_populate(value_field.message_type, 0, depth + 1))
                else:
                    target[key] = _scalar_sample(value_field, salt)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= MAX_DEPTH:
                continue
            if field.is_repeated:
                for salt in range(2):
                    sub = _populate(field.message_type, salt, depth + 1)
                    target.add().CopyFrom(sub)
            else:
                target.CopyFrom(_populate(field.message_type, 0, depth + 1))
        elif field.is_repeated:
            target.extend(_scalar_sample(field, salt) for salt in range(2))
        else:
            setattr(msg, field.name, _scalar_sample(field, 0))
    return msg


def _samples() -> list[tuple[str, Message]]:
    out: list[tuple[str, Message]] = []
    for name in sorted(MESSAGES):
        desc = GENERATED[name]
        variants = max((len(o.fields) for o in desc.oneofs), default=1)
        out.extend((name, _populate(desc, v, 0)) for v in range(variants))
    return out


def _render_type(wire_type: str) -> str:
    if wire_type.startswith("map<"):
        return wire_type
    repeated = wire_type.startswith("repeated ")
    base = wire_type.removeprefix("repeated ")
    if base not in _SCALAR_NAMES.values():
        base = "." + base  # fully qualified reference
    return f"repeated {base}" if repeated else base


def _render_independent_protos(root: Path) -> list[str]:
    """A minimal .proto per package, straight from the transcribed table."""
    files: list[str] = []
    for package, (_, file_name, imports) in PACKAGES.items():
        name = "indep_" + file_name
        lines = ['syntax = "proto3";', f"package {package};"]
        referenced = {
            _package_of(wire_type.removeprefix("repeated "))
            for message, fields in MESSAGES.items()
            if _package_of(message) == package
            for _, wire_type in fields.values()
            if "." in wire_type
        }
        lines += [f'import "indep_{PACKAGES[dep][1]}";' for dep in imports if dep in referenced]
        for message, fields in MESSAGES.items():
            if _package_of(message) != package:
                continue
            short = message.rsplit(".", 1)[1]
            lines.append(f"message {short} {{")
            for enum, values in ENUMS.items():
                if enum.rsplit(".", 1)[0] == message:
                    body = " ".join(f"{k} = {v};" for k, v in values.items())
                    lines.append(f"  enum {enum.rsplit('.', 1)[1]} {{ {body} }}")
            oneofs = ONEOFS.get(message, {})
            in_oneof = {f for members in oneofs.values() for f in members}
            for field, (number, wire_type) in fields.items():
                if field not in in_oneof:
                    lines.append(f"  {_render_type(wire_type)} {field} = {number};")
            for oneof, members in oneofs.items():
                lines.append(f"  oneof {oneof} {{")
                for field in members:
                    number, wire_type = fields[field]
                    lines.append(f"    {_render_type(wire_type)} {field} = {number};")
                lines.append("  }")
            lines.append("}")
        (root / name).write_text("\n".join(lines) + "\n")
        files.append(name)
    return files


_DECODER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import importlib
    from google.protobuf import descriptor_pool, json_format, message_factory

    for module in sys.argv[2:]:
        importlib.import_module(module)
    assert not any(m == "protos" or m.startswith("protos.") for m in sys.modules)

    pool = descriptor_pool.Default()
    results = []
    for item in json.load(sys.stdin):
        cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(item["type"]))
        msg = cls.FromString(bytes.fromhex(item["hex"]))
        known = cls()
        known.CopyFrom(msg)
        known.DiscardUnknownFields()
        results.append({
            "unknown_fields": known.SerializeToString(deterministic=True)
            != msg.SerializeToString(deterministic=True),
            "values": json_format.MessageToDict(msg, preserving_proto_field_name=True),
            "hex": msg.SerializeToString(deterministic=True).hex(),
        })
    json.dump(results, sys.stdout)
    """
)


@pytest.fixture(scope="module")
def independent_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("independent_protos")
    files = _render_independent_protos(root)
    result = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"--python_out={root}", *files],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    modules = [name.removesuffix(".proto") + "_pb2" for name in files]
    return root, modules


def test_sample_messages_populate_every_field() -> None:
    """Guard for the round trip below: every field of every message is exercised somewhere."""
    seen: set[str] = set()

    def visit(msg: Message) -> None:
        for field, value in msg.ListFields():
            seen.add(field.full_name)
            if _is_map(field):
                continue
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                for sub in value if field.is_repeated else [value]:
                    visit(sub)

    for _, msg in _samples():
        visit(msg)
    expected = {f"{m}.{f}" for m, fields in MESSAGES.items() for f in fields}
    assert expected - seen == set()


def test_round_trip_through_independent_grpcio_tools_stack(
    independent_stack: tuple[Path, list[str]],
) -> None:
    root, modules = independent_stack
    samples = _samples()
    payload = [
        {"type": name, "hex": msg.SerializeToString(deterministic=True).hex()}
        for name, msg in samples
    ]
    result = subprocess.run(
        [sys.executable, "-I", "-c", _DECODER, str(root), *modules],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        cwd=root,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    decoded = json.loads(result.stdout)
    assert len(decoded) == len(samples)
    for (name, msg), other in zip(samples, decoded, strict=True):
        original = msg.SerializeToString(deterministic=True)
        assert not other["unknown_fields"], f"{name}: fields unknown to the independent schema"
        assert other["values"] == json_format.MessageToDict(
            msg, preserving_proto_field_name=True
        ), name
        assert bytes.fromhex(other["hex"]) == original, name
        assert type(msg).FromString(bytes.fromhex(other["hex"])) == msg, name
