"""The router's pure cores: the timeout clamp (actors/core/command_timeout.py) and the per-command
fan-out tracker (actors/core/command_fanout.py), driven by hypothesis against a model."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from actors.core.command_fanout import (
    CommandFanout,
    Done,
    FanoutError,
    Forget,
    Forward,
    Settle,
    unique_targets,
)
from actors.core.command_timeout import (
    FALLBACK_TIMEOUT_S,
    INVALID_DEFAULT_LOG,
    MAX_TIMEOUT_S,
    TIMEOUT_WARN_INTERVAL_S,
    CommandTimeouts,
    clamp_timeout,
    valid_default,
)

# -- the timeout clamp -----------------------------------------------------------------------------


def test_the_seeds_numbers() -> None:
    assert (MAX_TIMEOUT_S, FALLBACK_TIMEOUT_S, TIMEOUT_WARN_INTERVAL_S) == (3600, 300, 60.0)


@given(st.integers(-(2**31), 2**31 - 1))
def test_a_positive_timeout_is_clamped_and_the_rest_use_the_default(requested: int) -> None:
    clamped = clamp_timeout(requested)
    if requested >= 1:
        assert clamped == min(requested, 3600)
    else:
        assert clamped is None  # zero (missing on the wire) and negative: the default


@pytest.mark.parametrize("requested", [None, 2.5, "30", True, False, 0, -1, -(2**31)])
def test_missing_or_non_integer_uses_the_default(requested: object) -> None:
    timeouts = CommandTimeouts(lambda: 42)
    assert timeouts.resolve(requested, 0.0).seconds == 42


def test_the_default_is_read_per_command_and_only_when_needed() -> None:
    reads: list[int] = []
    configured = [10]

    def read() -> object:
        reads.append(1)
        return configured[0]

    timeouts = CommandTimeouts(read)
    assert timeouts.resolve(5, 0.0).seconds == 5
    assert reads == []  # a command with its own timeout never reads the key
    assert timeouts.resolve(0, 0.0).seconds == 10
    configured[0] = 20
    assert timeouts.resolve(-3, 0.0).seconds == 20  # re-read: the new value applies at once
    assert len(reads) == 2
    assert timeouts.resolve(99_999, 0.0).seconds == 3600


@given(st.one_of(st.integers(-10, 5000), st.none(), st.text(max_size=3), st.floats()))
def test_valid_default_is_an_integer_from_1_to_3600(configured: Any) -> None:
    ok = isinstance(configured, int) and 1 <= configured <= 3600
    assert valid_default(configured) == (configured if ok else None)


def test_an_invalid_default_is_300_and_warned_at_most_once_a_minute() -> None:
    timeouts = CommandTimeouts(lambda: 0)
    first = timeouts.resolve(0, 100.0)
    assert first.seconds == 300 and first.warning == INVALID_DEFAULT_LOG
    for t in (101.0, 130.0, 159.9):
        held = timeouts.resolve(0, t)
        assert held.seconds == 300 and held.warning is None
    later = timeouts.resolve(-1, 160.0)
    assert later.warning is not None and "(3 similar line(s) suppressed" in later.warning
    # A new router (a restart) is a new limiter: it warns again at once; the value is never quoted.
    assert CommandTimeouts(lambda: "marker-77").resolve(0, 161.0).warning == INVALID_DEFAULT_LOG


# -- the fan-out tracker: examples -----------------------------------------------------------------


def test_targets_are_deduplicated_in_order() -> None:
    assert unique_targets(["b", "a", "b", "c", "a"]) == ("b", "a", "c")
    assert CommandFanout(["x", "x"]).targets == ("x",)


def test_a_round_trip_forwards_running_then_final_then_ends() -> None:
    fanout = CommandFanout(["a"])
    fanout.dispatched("a", "owner-a")
    assert fanout.routed() == []
    assert fanout.answered("a", final=False) == [Forward("a", final=False)]
    assert fanout.answered("a", final=True) == [Forward("a", final=True), Done("completed")]
    assert fanout.answered("a", final=True) == []  # a repeated answer is dropped
    assert fanout.expire() == []


def test_no_targets_ends_at_once() -> None:
    assert CommandFanout([]).routed() == [Done("completed")]


def test_refusals_and_failures_are_terminal_failures() -> None:
    fanout = CommandFanout(["a", "b", "c"])
    assert fanout.refused("a", "not_connected") == [Settle("a", "FAILURE", "not_connected")]
    fanout.dispatched("b", "ob")
    # The last decision is a refusal, but b still owes: not done.
    assert fanout.refused("c", "duplicate_command_id") == [
        Settle("c", "FAILURE", "duplicate_command_id")
    ]
    assert fanout.routed() == []
    assert fanout.failed("b", "agent_disconnected") == [
        Settle("b", "FAILURE", "agent_disconnected"),
        Done("completed"),
    ]
    assert fanout.failed("b", "agent_disconnected") == []


def test_expiry_times_out_the_owing_and_tells_their_owners() -> None:
    fanout = CommandFanout(["a", "b", "c"])
    for target in fanout.targets:
        fanout.dispatched(target, f"o-{target}")
    fanout.answered("a", final=True)
    fanout.answered("b", final=False)
    assert fanout.expire() == [
        Settle("b", "TIMEOUT"),
        Forget("b", "o-b"),
        Settle("c", "TIMEOUT"),
        Forget("c", "o-c"),
        Done("timeout"),
    ]
    assert fanout.answered("b", final=True) == []


def test_abandon_forgets_without_answers() -> None:
    fanout = CommandFanout(["a", "b"])
    fanout.dispatched("a", "oa")
    fanout.dispatched("b", "ob")
    fanout.answered("a", final=True)
    assert fanout.abandon() == [Forget("b", "ob")]
    assert fanout.done and fanout.expire() == []


def test_caller_defects_raise() -> None:
    fanout = CommandFanout(["a"])
    with pytest.raises(FanoutError):
        fanout.dispatched("zz", "o")
    with pytest.raises(FanoutError):
        fanout.expire()  # a timer can never fire while targets are undecided
    fanout.dispatched("a", "o")
    with pytest.raises(FanoutError):
        fanout.refused("a", "not_connected")


# -- the fan-out tracker: a state machine against a model ------------------------------------------

AGENTS = ("a", "b", "c", "d", "e")


class FanoutMachine(RuleBasedStateMachine):
    """Whatever order answers, failures, repeats, strangers and the timeout come in: every target
    gets exactly one terminal answer, nothing of a target after its terminal one, Done exactly
    once and only when every target is terminal, and Forget exactly for the targets that still
    owed at the timeout, with their owner's route."""

    @initialize(
        wanted=st.lists(st.sampled_from(AGENTS), max_size=6),
        held=st.sets(st.sampled_from(AGENTS)),
    )
    def route(self, wanted: list[str], held: set[str]) -> None:
        self.fanout = CommandFanout(wanted)
        self.terminal: dict[str, int] = {}
        self.after_terminal = 0
        self.dones: list[Done] = []
        self.forgets: list[Forget] = []
        self.owed_at_expiry: dict[str, Hashable] = {}
        effects = []
        for target in self.fanout.targets:
            if target in held:
                self.fanout.dispatched(target, f"owner-{target}")
            else:
                effects += self.fanout.refused(target, "not_connected")
        effects += self.fanout.routed()
        self.record(effects)

    def record(self, effects: list[Any]) -> None:
        for effect in effects:
            match effect:
                case Forward(agent_id=a, final=final):
                    if a in self.terminal:
                        self.after_terminal += 1
                    if final:
                        self.terminal[a] = self.terminal.get(a, 0) + 1
                case Settle(agent_id=a):
                    if a in self.terminal:
                        self.after_terminal += 1
                    self.terminal[a] = self.terminal.get(a, 0) + 1
                case Forget():
                    self.forgets.append(effect)
                case Done():
                    assert set(self.terminal) == set(self.fanout.targets)
                    self.dones.append(effect)

    @rule(agent=st.sampled_from(AGENTS), final=st.booleans())
    def answer(self, agent: str, final: bool) -> None:
        self.record(self.fanout.answered(agent, final))

    @rule(agent=st.sampled_from(AGENTS))
    def fail(self, agent: str) -> None:
        self.record(self.fanout.failed(agent, "agent_disconnected"))

    @precondition(lambda self: not self.fanout.done)
    @rule()
    def expire(self) -> None:
        self.owed_at_expiry = {a: f"owner-{a}" for a in self.fanout.targets if self.fanout.owes(a)}
        self.record(self.fanout.expire())
        assert self.forgets == [Forget(a, r) for a, r in self.owed_at_expiry.items()]

    @invariant()
    def one_terminal_each(self) -> None:
        assert all(count == 1 for count in self.terminal.values())
        assert self.after_terminal == 0
        assert len(self.dones) <= 1
        assert self.fanout.done == (len(self.dones) == 1)
        if self.fanout.done:
            assert set(self.terminal) == set(self.fanout.targets)
        assert self.fanout.owing + self.fanout.settled == len(self.fanout.targets)


TestFanoutMachine = FanoutMachine.TestCase
TestFanoutMachine.settings = settings(max_examples=300, stateful_step_count=30)
