from protos.yuzu.agent.v1 import agent_pb2 as _agent_pb2
from protos.yuzu.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListAgentsRequest(_message.Message):
    __slots__ = ("filter", "limit", "cursor")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    filter: str
    limit: int
    cursor: str
    def __init__(self, filter: _Optional[str] = ..., limit: _Optional[int] = ..., cursor: _Optional[str] = ...) -> None: ...

class AgentSummary(_message.Message):
    __slots__ = ("agent_id", "hostname", "platform", "agent_version", "online", "last_seen")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ONLINE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    hostname: str
    platform: _common_pb2.Platform
    agent_version: str
    online: bool
    last_seen: _common_pb2.Timestamp
    def __init__(self, agent_id: _Optional[str] = ..., hostname: _Optional[str] = ..., platform: _Optional[_Union[_common_pb2.Platform, _Mapping]] = ..., agent_version: _Optional[str] = ..., online: _Optional[bool] = ..., last_seen: _Optional[_Union[_common_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListAgentsResponse(_message.Message):
    __slots__ = ("agents", "next_cursor")
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[AgentSummary]
    next_cursor: str
    def __init__(self, agents: _Optional[_Iterable[_Union[AgentSummary, _Mapping]]] = ..., next_cursor: _Optional[str] = ...) -> None: ...

class GetAgentRequest(_message.Message):
    __slots__ = ("agent_id",)
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    def __init__(self, agent_id: _Optional[str] = ...) -> None: ...

class GetAgentResponse(_message.Message):
    __slots__ = ("summary", "plugins")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    summary: AgentSummary
    plugins: _containers.RepeatedCompositeFieldContainer[_common_pb2.PluginInfo]
    def __init__(self, summary: _Optional[_Union[AgentSummary, _Mapping]] = ..., plugins: _Optional[_Iterable[_Union[_common_pb2.PluginInfo, _Mapping]]] = ...) -> None: ...

class SendCommandRequest(_message.Message):
    __slots__ = ("agent_ids", "command", "timeout_seconds")
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    command: _agent_pb2.CommandRequest
    timeout_seconds: int
    def __init__(self, agent_ids: _Optional[_Iterable[str]] = ..., command: _Optional[_Union[_agent_pb2.CommandRequest, _Mapping]] = ..., timeout_seconds: _Optional[int] = ...) -> None: ...

class SendCommandResponse(_message.Message):
    __slots__ = ("agent_id", "response")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    response: _agent_pb2.CommandResponse
    def __init__(self, agent_id: _Optional[str] = ..., response: _Optional[_Union[_agent_pb2.CommandResponse, _Mapping]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("agent_ids",)
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, agent_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AgentEvent(_message.Message):
    __slots__ = ("agent_id", "occurred_at", "connected", "disconnected", "plugin_loaded")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    DISCONNECTED_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_LOADED_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    occurred_at: _common_pb2.Timestamp
    connected: AgentConnected
    disconnected: AgentDisconnected
    plugin_loaded: AgentPluginLoaded
    def __init__(self, agent_id: _Optional[str] = ..., occurred_at: _Optional[_Union[_common_pb2.Timestamp, _Mapping]] = ..., connected: _Optional[_Union[AgentConnected, _Mapping]] = ..., disconnected: _Optional[_Union[AgentDisconnected, _Mapping]] = ..., plugin_loaded: _Optional[_Union[AgentPluginLoaded, _Mapping]] = ...) -> None: ...

class AgentConnected(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class AgentDisconnected(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class AgentPluginLoaded(_message.Message):
    __slots__ = ("plugin",)
    PLUGIN_FIELD_NUMBER: _ClassVar[int]
    plugin: _common_pb2.PluginInfo
    def __init__(self, plugin: _Optional[_Union[_common_pb2.PluginInfo, _Mapping]] = ...) -> None: ...

class QueryInventoryRequest(_message.Message):
    __slots__ = ("agent_id", "plugin")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    plugin: str
    def __init__(self, agent_id: _Optional[str] = ..., plugin: _Optional[str] = ...) -> None: ...

class QueryInventoryResponse(_message.Message):
    __slots__ = ("agent_id", "plugin_data", "collected_at")
    class PluginDataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_DATA_FIELD_NUMBER: _ClassVar[int]
    COLLECTED_AT_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    plugin_data: _containers.ScalarMap[str, bytes]
    collected_at: _common_pb2.Timestamp
    def __init__(self, agent_id: _Optional[str] = ..., plugin_data: _Optional[_Mapping[str, bytes]] = ..., collected_at: _Optional[_Union[_common_pb2.Timestamp, _Mapping]] = ...) -> None: ...
