"""The owner's pending-command map (actors/core/owner_commands.py): answers reach the caller of
their command until a final status, the map is bounded, a Guardian event is never an answer, an id
in flight is a duplicate until its final answer, a forget or its caller's deadline."""

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


def test_an_id_is_in_flight_until_final_forget_or_deadline() -> None:
    pending = PendingCommands()
    pending.expect("c1", "a", deadline=10.0)
    assert pending.in_flight("c1", now=9.9)
    assert not pending.in_flight("c1", now=10.0)  # its caller stopped waiting
    assert not pending.in_flight("c2", now=0.0)
    pending.answer("c1", final=False)
    assert pending.in_flight("c1", now=0.0)
    pending.answer("c1", final=True)
    assert not pending.in_flight("c1", now=0.0)
    pending.expect("c2", "a")  # no deadline: until its final answer or a forget
    assert pending.in_flight("c2", now=1e12)
    pending.forget("c2")
    assert not pending.in_flight("c2", now=0.0)
    # An expired entry of the id is replaced by the new caller.
    pending.expect("c3", "a", deadline=1.0)
    pending.expect("c3", "b", deadline=5.0)
    assert pending.answer("c3", final=True) == "b"


def test_bounded_forget_and_drain() -> None:
    pending = PendingCommands(limit=2)
    assert MAX_PENDING_COMMANDS == 1024
    pending.expect("c1", "a")
    pending.expect("c2", "b")
    assert not pending.has_room(now=0.0)
    with pytest.raises(OverflowError):
        pending.expect("c3", "c")
    pending.forget("c1")
    assert pending.has_room(now=0.0)
    pending.expect("c3", "c")
    assert pending.drain() == [("c2", "b"), ("c3", "c")]
    assert len(pending) == 0


def test_expired_entries_make_room() -> None:
    pending = PendingCommands(limit=2)
    pending.expect("c1", "a", deadline=5.0)
    pending.expect("c2", "b")
    assert not pending.has_room(now=4.0)
    assert pending.has_room(now=5.0)  # c1's caller stopped waiting: its entry goes
    assert pending.drain() == [("c2", "b")]


@given(
    st.lists(
        st.tuples(st.sampled_from("abcdef"), st.booleans(), st.none() | st.floats(0, 10)),
        max_size=60,
    )
)
def test_never_past_the_limit_and_never_two_callers(
    ops: list[tuple[str, bool, float | None]],
) -> None:
    pending = PendingCommands(limit=3)
    for now, (command_id, final, deadline) in enumerate(ops):
        if not pending.in_flight(command_id, now) and pending.has_room(now):
            pending.expect(command_id, "r", deadline)
            assert pending.in_flight(command_id, now) == (deadline is None or now < deadline)
        else:
            pending.answer(command_id, final)
        assert len(pending) <= 3
