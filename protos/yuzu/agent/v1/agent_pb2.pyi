from protos.yuzu.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentInfo(_message.Message):
    __slots__ = ("agent_id", "hostname", "platform", "agent_version", "plugins", "scopable_tags")
    class ScopableTagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    SCOPABLE_TAGS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    hostname: str
    platform: _common_pb2.Platform
    agent_version: str
    plugins: _containers.RepeatedCompositeFieldContainer[_common_pb2.PluginInfo]
    scopable_tags: _containers.ScalarMap[str, str]
    def __init__(self, agent_id: _Optional[str] = ..., hostname: _Optional[str] = ..., platform: _Optional[_Union[_common_pb2.Platform, _Mapping]] = ..., agent_version: _Optional[str] = ..., plugins: _Optional[_Iterable[_Union[_common_pb2.PluginInfo, _Mapping]]] = ..., scopable_tags: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("info", "enrollment_token", "machine_certificate", "attestation_signature", "attestation_provider", "gateway_observed_peer", "csr_pem")
    INFO_FIELD_NUMBER: _ClassVar[int]
    ENROLLMENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MACHINE_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    ATTESTATION_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    ATTESTATION_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_OBSERVED_PEER_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    info: AgentInfo
    enrollment_token: str
    machine_certificate: bytes
    attestation_signature: bytes
    attestation_provider: str
    gateway_observed_peer: str
    csr_pem: str
    def __init__(self, info: _Optional[_Union[AgentInfo, _Mapping]] = ..., enrollment_token: _Optional[str] = ..., machine_certificate: _Optional[bytes] = ..., attestation_signature: _Optional[bytes] = ..., attestation_provider: _Optional[str] = ..., gateway_observed_peer: _Optional[str] = ..., csr_pem: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("session_id", "accepted", "reject_reason", "pending_commands", "enrollment_status", "agent_credential", "issued_certificate", "issued_ca_chain")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECT_REASON_FIELD_NUMBER: _ClassVar[int]
    PENDING_COMMANDS_FIELD_NUMBER: _ClassVar[int]
    ENROLLMENT_STATUS_FIELD_NUMBER: _ClassVar[int]
    AGENT_CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    ISSUED_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    ISSUED_CA_CHAIN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    accepted: bool
    reject_reason: str
    pending_commands: _containers.RepeatedCompositeFieldContainer[CommandRequest]
    enrollment_status: str
    agent_credential: str
    issued_certificate: str
    issued_ca_chain: str
    def __init__(self, session_id: _Optional[str] = ..., accepted: _Optional[bool] = ..., reject_reason: _Optional[str] = ..., pending_commands: _Optional[_Iterable[_Union[CommandRequest, _Mapping]]] = ..., enrollment_status: _Optional[str] = ..., agent_credential: _Optional[str] = ..., issued_certificate: _Optional[str] = ..., issued_ca_chain: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("session_id", "sent_at", "status_tags", "fleet_snapshot_json")
    class StatusTagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    STATUS_TAGS_FIELD_NUMBER: _ClassVar[int]
    FLEET_SNAPSHOT_JSON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    sent_at: _common_pb2.Timestamp
    status_tags: _containers.ScalarMap[str, str]
    fleet_snapshot_json: bytes
    def __init__(self, session_id: _Optional[str] = ..., sent_at: _Optional[_Union[_common_pb2.Timestamp, _Mapping]] = ..., status_tags: _Optional[_Mapping[str, str]] = ..., fleet_snapshot_json: _Optional[bytes] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("acknowledged", "server_time", "pending_commands")
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    PENDING_COMMANDS_FIELD_NUMBER: _ClassVar[int]
    acknowledged: bool
    server_time: _common_pb2.Timestamp
    pending_commands: _containers.RepeatedCompositeFieldContainer[CommandRequest]
    def __init__(self, acknowledged: _Optional[bool] = ..., server_time: _Optional[_Union[_common_pb2.Timestamp, _Mapping]] = ..., pending_commands: _Optional[_Iterable[_Union[CommandRequest, _Mapping]]] = ...) -> None: ...

class CommandRequest(_message.Message):
    __slots__ = ("command_id", "plugin", "action", "parameters", "expires_at", "stagger_seconds", "delay_seconds", "payload", "dispatch_tag")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    STAGGER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DELAY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_TAG_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    plugin: str
    action: str
    parameters: _containers.ScalarMap[str, str]
    expires_at: _common_pb2.Timestamp
    stagger_seconds: int
    delay_seconds: int
    payload: bytes
    dispatch_tag: str
    def __init__(self, command_id: _Optional[str] = ..., plugin: _Optional[str] = ..., action: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ..., expires_at: _Optional[_Union[_common_pb2.Timestamp, _Mapping]] = ..., stagger_seconds: _Optional[int] = ..., delay_seconds: _Optional[int] = ..., payload: _Optional[bytes] = ..., dispatch_tag: _Optional[str] = ...) -> None: ...

class CommandResponse(_message.Message):
    __slots__ = ("command_id", "status", "output", "exit_code", "error", "sent_at", "plugin", "action", "payload")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        RUNNING: _ClassVar[CommandResponse.Status]
        SUCCESS: _ClassVar[CommandResponse.Status]
        FAILURE: _ClassVar[CommandResponse.Status]
        TIMEOUT: _ClassVar[CommandResponse.Status]
        REJECTED: _ClassVar[CommandResponse.Status]
    RUNNING: CommandResponse.Status
    SUCCESS: CommandResponse.Status
    FAILURE: CommandResponse.Status
    TIMEOUT: CommandResponse.Status
    REJECTED: CommandResponse.Status
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    status: CommandResponse.Status
    output: str
    exit_code: int
    error: _common_pb2.ErrorDetail
    sent_at: _common_pb2.Timestamp
    plugin: str
    action: str
    payload: bytes
    def __init__(self, command_id: _Optional[str] = ..., status: _Optional[_Union[CommandResponse.Status, str]] = ..., output: _Optional[str] = ..., exit_code: _Optional[int] = ..., error: _Optional[_Union[_common_pb2.ErrorDetail, _Mapping]] = ..., sent_at: _Optional[_Union[_common_pb2.Timestamp, _Mapping]] = ..., plugin: _Optional[str] = ..., action: _Optional[str] = ..., payload: _Optional[bytes] = ...) -> None: ...

class InventoryReport(_message.Message):
    __slots__ = ("session_id", "collected_at", "plugin_data", "content_hashes")
    class PluginDataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    class ContentHashesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTED_AT_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_DATA_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASHES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    collected_at: _common_pb2.Timestamp
    plugin_data: _containers.ScalarMap[str, bytes]
    content_hashes: _containers.ScalarMap[str, str]
    def __init__(self, session_id: _Optional[str] = ..., collected_at: _Optional[_Union[_common_pb2.Timestamp, _Mapping]] = ..., plugin_data: _Optional[_Mapping[str, bytes]] = ..., content_hashes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class InventoryAck(_message.Message):
    __slots__ = ("received", "need_full")
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    NEED_FULL_FIELD_NUMBER: _ClassVar[int]
    received: bool
    need_full: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, received: _Optional[bool] = ..., need_full: _Optional[_Iterable[str]] = ...) -> None: ...

class CheckForUpdateRequest(_message.Message):
    __slots__ = ("agent_id", "current_version", "platform")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    current_version: str
    platform: _common_pb2.Platform
    def __init__(self, agent_id: _Optional[str] = ..., current_version: _Optional[str] = ..., platform: _Optional[_Union[_common_pb2.Platform, _Mapping]] = ...) -> None: ...

class CheckForUpdateResponse(_message.Message):
    __slots__ = ("update_available", "latest_version", "sha256", "mandatory", "eligible", "file_size")
    UPDATE_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    MANDATORY_FIELD_NUMBER: _ClassVar[int]
    ELIGIBLE_FIELD_NUMBER: _ClassVar[int]
    FILE_SIZE_FIELD_NUMBER: _ClassVar[int]
    update_available: bool
    latest_version: str
    sha256: str
    mandatory: bool
    eligible: bool
    file_size: int
    def __init__(self, update_available: _Optional[bool] = ..., latest_version: _Optional[str] = ..., sha256: _Optional[str] = ..., mandatory: _Optional[bool] = ..., eligible: _Optional[bool] = ..., file_size: _Optional[int] = ...) -> None: ...

class DownloadUpdateRequest(_message.Message):
    __slots__ = ("agent_id", "version", "platform")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    version: str
    platform: _common_pb2.Platform
    def __init__(self, agent_id: _Optional[str] = ..., version: _Optional[str] = ..., platform: _Optional[_Union[_common_pb2.Platform, _Mapping]] = ...) -> None: ...

class DownloadUpdateChunk(_message.Message):
    __slots__ = ("data", "offset", "total_size")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    total_size: int
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., total_size: _Optional[int] = ...) -> None: ...
