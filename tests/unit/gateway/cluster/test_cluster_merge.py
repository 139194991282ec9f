"""The merge of a forwarded command's peer answers (gateway/cluster/merge.py), against a model:
each target gets exactly one terminal outcome, and the right one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cluster.merge import Answer, Fail, RemoteMerge

PEERS = ("a", "b", "c")
TARGETS = ("x1", "x2", "x3", "x4")


def test_the_holding_peers_frames_pass_and_the_others_silence_is_ignored() -> None:
    m = RemoteMerge(["x1"], PEERS)
    assert m.frame("a", "x1", held=False, final=True) == []
    assert m.frame("b", "x1", held=True, final=False) == [Answer("x1", False)]
    assert m.frame("b", "x1", held=True, final=True) == [Answer("x1", True)]
    assert m.done
    # Late words about a settled target are dropped.
    assert m.frame("c", "x1", held=True, final=True) == []


def test_not_connected_only_when_every_peer_said_so() -> None:
    m = RemoteMerge(["x1"], PEERS)
    assert m.frame("a", "x1", held=False, final=True) == []
    assert m.frame("b", "x1", held=False, final=True) == []
    assert m.frame("c", "x1", held=False, final=True) == [Fail("x1", "not_connected")]


def test_a_peer_that_leaves_mid_command_yields_agent_disconnected() -> None:
    m = RemoteMerge(["x1", "x2"], ("a", "b"))
    m.frame("a", "x1", held=True, final=False)
    m.frame("b", "x1", held=False, final=True)
    m.frame("b", "x2", held=False, final=True)
    assert m.peer_ended("a") == [Fail("x1", "agent_disconnected"), Fail("x2", "agent_disconnected")]
    assert m.done


word = st.tuples(
    st.sampled_from(PEERS),
    st.sampled_from(TARGETS),
    st.sampled_from(["not_held", "running", "final", "end"]),
)


@settings(max_examples=300)
@given(st.lists(word, max_size=40))
def test_exactly_one_terminal_outcome_per_target(words: list[tuple[str, str, str]]) -> None:
    m = RemoteMerge(TARGETS, PEERS)
    terminal: dict[str, object] = {}
    said: dict[str, set[str]] = {t: set() for t in TARGETS}
    ended: set[str] = set()
    lost: set[str] = set()
    for peer, target, kind in words:
        if kind == "end":
            if peer in ended:
                continue
            ended.add(peer)
            effects = m.peer_ended(peer)
            for t in TARGETS:
                if t not in terminal and peer not in said[t]:
                    lost.add(t)
        elif peer in ended:
            continue
        else:
            effects = m.frame(peer, target, held=kind != "not_held", final=kind != "running")
            if kind == "not_held" and target not in terminal:
                said[target].add(peer)
        for effect in effects:
            if isinstance(effect, Answer) and not effect.final:
                assert effect.agent_id not in terminal
                continue
            assert effect.agent_id not in terminal, "two terminal outcomes"
            terminal[effect.agent_id] = effect
            if isinstance(effect, Fail):
                # Settled unheld only when every peer has given its word or gone.
                assert said[effect.agent_id] | ended >= set(PEERS)
                expected = "agent_disconnected" if effect.agent_id in lost else "not_connected"
                assert effect.reason == expected
    if ended == set(PEERS):
        assert m.done and set(terminal) == set(TARGETS)
    assert m.owing() == frozenset(TARGETS) - set(terminal)
