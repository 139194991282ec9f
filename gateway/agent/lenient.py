"""Requests whose text is not valid UTF-8: kept for the method's own rule instead of refused by
the parser.

The generated classes (upb) refuse a string field holding invalid UTF-8 while parsing, and
grpclib would answer any request they refuse INTERNAL before the handler knew what it was. The
seed never does: a heartbeat tag is repaired and counted (heartbeat_invalid), a session id that
is not text is one this node does not hold, an agent id is bounded before anything else, and
only then is the rest of the text the local encode refusal (seed: "Heartbeat Batching" > chunked
flush, "Heartbeat admission", "Known limits"; docs/agent-plane.md).

So the agent service declares each request type as `Tolerant(type)` (gateway/agent/service.py):
the strict parse as before, or an `Undecoded` holding the bytes when it fails. The handler then
reads the fields its rule needs with a lenient class (`actors.core.heartbeat_sanitise`'s
`lenient_class`, every string as bytes; `decode_lenient` for a heartbeat), or `repaired` gives
the message with each invalid sequence replaced by U+FFFD. Bytes that are not protobuf at all
fail those too (`DecodeError`).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import attrs
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

__all__ = ["Tolerant", "Undecoded", "escaped", "repaired"]

M = TypeVar("M", bound=Message)


@attrs.frozen
class Undecoded:
    """A request the strict parse refused: its bytes, kept out of reprs (they are the agent's)."""

    data: bytes = attrs.field(repr=False)


class Tolerant(Generic[M]):
    """A request type for grpclib's codec (`FromString` is all it calls): the message, or
    `Undecoded` when the strict parse refuses the bytes."""

    def __init__(self, message_type: type[M]) -> None:
        self.message_type = message_type

    def FromString(self, data: bytes) -> M | Undecoded:
        try:
            return self.message_type.FromString(data)
        except DecodeError:
            return Undecoded(data)


def escaped(value: bytes) -> str:
    """Bytes that should have been text, as text that no valid id equals: each invalid byte
    becomes a lone surrogate, which a protobuf string never holds."""
    return value.decode("utf-8", "surrogateescape")


def repaired(received: Undecoded, message_type: type[M], lenient: Any) -> M:
    """The message with every invalid UTF-8 sequence in its text replaced by U+FFFD, read with
    `lenient` (`lenient_class(message_type.DESCRIPTOR)`); fields this gateway does not know are
    dropped. Raises `DecodeError` for bytes that are not the message's wire format."""
    loose = lenient.FromString(received.data)
    _repair(loose, message_type.DESCRIPTOR)
    # The lenient message is the same wire format, and its text is valid UTF-8 now.
    return message_type.FromString(loose.SerializeToString())


def _repair(loose: Message, strict: Descriptor) -> None:
    """Repair, in place, every field of `loose` that `strict` declares as text."""
    for field, value in loose.ListFields():
        twin = strict.fields_by_number[field.number]
        repeated = field.is_repeated
        if twin.type == FieldDescriptor.TYPE_STRING:
            if repeated:
                value[:] = [_valid(v) for v in value]
            else:
                setattr(loose, field.name, _valid(value))
        elif twin.type == FieldDescriptor.TYPE_MESSAGE:
            for item in value if repeated else (value,):
                _repair(item, twin.message_type)


def _valid(value: bytes) -> bytes:
    return value.decode("utf-8", "replace").encode("utf-8")
