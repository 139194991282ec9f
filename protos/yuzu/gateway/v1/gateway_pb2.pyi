from protos.yuzu.agent.v1 import agent_pb2 as _agent_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BatchHeartbeatRequest(_message.Message):
    __slots__ = ("heartbeats", "gateway_node")
    HEARTBEATS_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_NODE_FIELD_NUMBER: _ClassVar[int]
    heartbeats: _containers.RepeatedCompositeFieldContainer[_agent_pb2.HeartbeatRequest]
    gateway_node: str
    def __init__(self, heartbeats: _Optional[_Iterable[_Union[_agent_pb2.HeartbeatRequest, _Mapping]]] = ..., gateway_node: _Optional[str] = ...) -> None: ...

class BatchHeartbeatResponse(_message.Message):
    __slots__ = ("acknowledged_count", "unknown_session_ids", "unknown_session_ids_truncated")
    ACKNOWLEDGED_COUNT_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_SESSION_IDS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    acknowledged_count: int
    unknown_session_ids: _containers.RepeatedScalarFieldContainer[str]
    unknown_session_ids_truncated: bool
    def __init__(self, acknowledged_count: _Optional[int] = ..., unknown_session_ids: _Optional[_Iterable[str]] = ..., unknown_session_ids_truncated: _Optional[bool] = ...) -> None: ...

class StreamStatusNotification(_message.Message):
    __slots__ = ("agent_id", "session_id", "event", "peer_addr", "gateway_node", "wire_capabilities", "cluster_id", "stream_home_id")
    class Event(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CONNECTED: _ClassVar[StreamStatusNotification.Event]
        DISCONNECTED: _ClassVar[StreamStatusNotification.Event]
    CONNECTED: StreamStatusNotification.Event
    DISCONNECTED: StreamStatusNotification.Event
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_NODE_FIELD_NUMBER: _ClassVar[int]
    WIRE_CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_HOME_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    event: StreamStatusNotification.Event
    peer_addr: str
    gateway_node: str
    wire_capabilities: _containers.RepeatedScalarFieldContainer[str]
    cluster_id: str
    stream_home_id: str
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., event: _Optional[_Union[StreamStatusNotification.Event, str]] = ..., peer_addr: _Optional[str] = ..., gateway_node: _Optional[str] = ..., wire_capabilities: _Optional[_Iterable[str]] = ..., cluster_id: _Optional[str] = ..., stream_home_id: _Optional[str] = ...) -> None: ...

class StreamStatusAck(_message.Message):
    __slots__ = ("acknowledged",)
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    acknowledged: bool
    def __init__(self, acknowledged: _Optional[bool] = ...) -> None: ...

class ForwardGuardianRequest(_message.Message):
    __slots__ = ("agent_id", "response")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    response: _agent_pb2.CommandResponse
    def __init__(self, agent_id: _Optional[str] = ..., response: _Optional[_Union[_agent_pb2.CommandResponse, _Mapping]] = ...) -> None: ...

class ForwardGuardianAck(_message.Message):
    __slots__ = ("acknowledged",)
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    acknowledged: bool
    def __init__(self, acknowledged: _Optional[bool] = ...) -> None: ...
