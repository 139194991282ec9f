"""gateway/agent/lenient.py: a request the strict parse refuses is kept as bytes, and `repaired`
gives it back with its invalid UTF-8 replaced, nested messages and map keys included."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from actors.core.heartbeat_sanitise import lenient_class
from gateway.agent.lenient import Tolerant, Undecoded, escaped, repaired
from protos.yuzu.agent.v1 import agent_pb2

Frame = agent_pb2.CommandResponse
LENIENT_FRAME = lenient_class(Frame.DESCRIPTOR)
PLACEHOLDER = "Q" * 4


def spoiled(message: Frame) -> bytes:
    """`message` on the wire with every placeholder text replaced by 0xFF bytes."""
    return message.SerializeToString().replace(PLACEHOLDER.encode(), b"\xff" * len(PLACEHOLDER))


def test_tolerant_keeps_what_the_strict_parse_refuses() -> None:
    tolerant = Tolerant(Frame)
    good = Frame(command_id="c1", output="ok")
    assert tolerant.FromString(good.SerializeToString()) == good
    data = spoiled(Frame(command_id="c1", output=PLACEHOLDER))
    with pytest.raises(DecodeError):
        Frame.FromString(data)
    assert tolerant.FromString(data) == Undecoded(data)
    assert "\\xff" not in repr(Undecoded(data))  # the agent's bytes stay out of reprs


def test_repaired_replaces_every_text_field_at_any_depth() -> None:
    frame = Frame(command_id="c1", status=Frame.Status.FAILURE, output=f"a{PLACEHOLDER}b")
    frame.error.message = PLACEHOLDER
    frame.error.metadata[PLACEHOLDER] = PLACEHOLDER
    frame.error.metadata["kept"] = "v"
    frame.payload = b"\xff raw bytes stay"
    fixed = repaired(Undecoded(spoiled(frame)), Frame, LENIENT_FRAME)
    bad = "\ufffd" * len(PLACEHOLDER)
    assert fixed.command_id == "c1" and fixed.status == Frame.Status.FAILURE
    assert fixed.output == f"a{bad}b"
    assert fixed.error.message == bad
    assert dict(fixed.error.metadata) == {bad: bad, "kept": "v"}
    assert fixed.payload == b"\xff raw bytes stay"  # a bytes field is not text


def test_repaired_refuses_bytes_that_are_not_protobuf() -> None:
    with pytest.raises(DecodeError):
        repaired(Undecoded(b"\x0a\x05ab"), Frame, LENIENT_FRAME)  # a length past the end


@given(
    st.text(),
    st.text(),
    st.dictionaries(st.text(), st.text(), max_size=4),
    st.lists(st.text(), max_size=3),
)
def test_a_valid_message_is_repaired_to_itself(
    command_id: str, output: str, metadata: dict[str, str], capabilities: list[str]
) -> None:
    frame = Frame(command_id=command_id, output=output)
    frame.error.metadata.update(metadata)
    assert repaired(Undecoded(frame.SerializeToString()), Frame, LENIENT_FRAME) == frame
    register = agent_pb2.RegisterRequest()
    register.info.plugins.add(name=output, capabilities=capabilities)
    lenient_register = lenient_class(agent_pb2.RegisterRequest.DESCRIPTOR)
    again = repaired(Undecoded(register.SerializeToString()), type(register), lenient_register)
    assert again == register


@given(st.binary(max_size=64))
def test_escaped_bytes_equal_valid_text_only_when_they_are_valid(value: bytes) -> None:
    text = escaped(value)
    try:
        valid = value.decode("utf-8")
    except UnicodeDecodeError:
        # No id a protobuf string holds can equal it: it carries a lone surrogate.
        with pytest.raises(UnicodeEncodeError):
            text.encode("utf-8")
    else:
        assert text == valid


def test_a_lenient_register_reads_the_agent_id_as_received() -> None:
    request = agent_pb2.RegisterRequest()
    request.info.agent_id = "Q" * 300
    data = request.SerializeToString().replace(b"Q" * 300, b"\xff" * 300)
    loose = lenient_class(agent_pb2.RegisterRequest.DESCRIPTOR).FromString(data)
    assert loose.info.agent_id == b"\xff" * 300
