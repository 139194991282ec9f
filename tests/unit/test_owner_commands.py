"""The owner's pending-command map (actors/core/owner_commands.py): answers reach the caller of
their command until a final status, the map is bounded, a Guardian event is never an answer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.owner_commands import (
    GUARDIAN_PLUGIN,
    MAX_PENDING_COMMANDS,
    PendingCommands,
    is_guardian_event,
)


def test_guardian_event_is_plugin_guard_without_command_id() -> None:
    assert GUARDIAN_PLUGIN == "__guard__"
    assert is_guardian_event("__guard__", "")
    assert not is_guardian_event("__guard__", "c1")  # a reply to a Guardian command
    assert not is_guardian_event("shell", "")


def test_answers_until_final() -> None:
    pending = PendingCommands()
    assert pending.expect("c1", "router") is None
    assert pending.answer("c1", final=False) == "router"
    assert pending.answer("c1", final=False) == "router"
    assert pending.answer("c1", final=True) == "router"
    assert pending.answer("c1", final=True) is None
    assert len(pending) == 0


def test_same_id_again_displaces_the_first_caller() -> None:
    pending = PendingCommands()
    pending.expect("c1", "a")
    assert pending.expect("c1", "a") is None
    assert pending.expect("c1", "b") == "a"
    assert pending.answer("c1", final=True) == "b"


def test_bounded_forget_and_drain() -> None:
    pending = PendingCommands(limit=2)
    assert MAX_PENDING_COMMANDS == 1024
    pending.expect("c1", "a")
    pending.expect("c2", "b")
    assert not pending.has_room("c3")
    assert pending.has_room("c1")  # replacing always fits
    with pytest.raises(OverflowError):
        pending.expect("c3", "c")
    pending.forget("c1")
    assert pending.has_room("c3")
    pending.expect("c3", "c")
    assert pending.drain() == [("c2", "b"), ("c3", "c")]
    assert len(pending) == 0


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.booleans()), max_size=60))
def test_never_past_the_limit(ops: list[tuple[str, bool]]) -> None:
    pending = PendingCommands(limit=3)
    for command_id, final in ops:
        if pending.has_room(command_id):
            pending.expect(command_id, "r")
        else:
            pending.answer(command_id, final)
        assert len(pending) <= 3
