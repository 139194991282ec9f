from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Platform(_message.Message):
    __slots__ = ("os", "arch", "version")
    OS_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    os: str
    arch: str
    version: str
    def __init__(self, os: _Optional[str] = ..., arch: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class PluginInfo(_message.Message):
    __slots__ = ("name", "version", "description", "capabilities")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    description: str
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., description: _Optional[str] = ..., capabilities: _Optional[_Iterable[str]] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("code", "message", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Timestamp(_message.Message):
    __slots__ = ("millis_epoch",)
    MILLIS_EPOCH_FIELD_NUMBER: _ClassVar[int]
    millis_epoch: int
    def __init__(self, millis_epoch: _Optional[int] = ...) -> None: ...

class ScopeExpression(_message.Message):
    __slots__ = ("condition", "combinator")
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    COMBINATOR_FIELD_NUMBER: _ClassVar[int]
    condition: ScopeCondition
    combinator: ScopeCombinator
    def __init__(self, condition: _Optional[_Union[ScopeCondition, _Mapping]] = ..., combinator: _Optional[_Union[ScopeCombinator, _Mapping]] = ...) -> None: ...

class ScopeCondition(_message.Message):
    __slots__ = ("attribute", "op", "value", "values")
    ATTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    attribute: str
    op: str
    value: str
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, attribute: _Optional[str] = ..., op: _Optional[str] = ..., value: _Optional[str] = ..., values: _Optional[_Iterable[str]] = ...) -> None: ...

class ScopeCombinator(_message.Message):
    __slots__ = ("op", "children")
    class Op(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        AND: _ClassVar[ScopeCombinator.Op]
        OR: _ClassVar[ScopeCombinator.Op]
        NOT: _ClassVar[ScopeCombinator.Op]
    AND: ScopeCombinator.Op
    OR: ScopeCombinator.Op
    NOT: ScopeCombinator.Op
    OP_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    op: ScopeCombinator.Op
    children: _containers.RepeatedCompositeFieldContainer[ScopeExpression]
    def __init__(self, op: _Optional[_Union[ScopeCombinator.Op, str]] = ..., children: _Optional[_Iterable[_Union[ScopeExpression, _Mapping]]] = ...) -> None: ...
