"""The merge of a forwarded command's answers (gateway/cluster/merge.py): each target goes to
its newest holder only, the next only when that one does not hold it; a stale route's word never
settles a target; each target gets exactly one terminal outcome, and the right one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cluster.merge import Answer, Fail, RemoteMerge, Send

PEERS = ("a", "b", "c")
TARGETS = ("x1", "x2", "x3", "x4")


def test_each_target_goes_to_its_first_candidate_only_one_frame_per_peer() -> None:
    m = RemoteMerge({"x1": ["a", "b"], "x2": ["a"], "x3": ["b"], "x4": []}, lost=["x4"])
    assert m.start() == [
        Fail("x4", "unavailable"),
        Send("a", 1, ("x1", "x2")),
        Send("b", 2, ("x3",)),
    ]


def test_the_live_holders_answer_wins_over_a_stale_ones() -> None:
    # x1 reconnected from b to a: a is its newest entry.
    m = RemoteMerge({"x1": ["a", "b"]})
    [send] = m.start()
    assert send == Send("a", 1, ("x1",))
    # b (a stale session) speaks for x1 without being asked: ignored.
    assert m.frame(("b", 1), "x1", held=True, final=True) == []
    assert m.frame(("a", 1), "x1", held=True, final=False) == [Answer("x1", False)]
    assert m.frame(("a", 1), "x1", held=True, final=True) == [Answer("x1", True)]
    assert m.done
    assert m.frame(("a", 1), "x1", held=True, final=True) == []


def test_not_held_tries_the_next_holder_then_settles() -> None:
    m = RemoteMerge({"x1": ["a", "b"], "x2": ["c"]}, lost=["x2"])
    m.start()
    # a is stopping (or the agent left it): "not held here" is never the answer.
    assert m.frame(("a", 1), "x1", held=False, final=True) == [Send("b", 3, ("x1",))]
    assert m.frame(("a", 1), "x1", held=True, final=True) == []  # the old route is stale now
    assert m.frame(("b", 3), "x1", held=False, final=True) == [Fail("x1", "not_connected")]
    assert m.frame(("c", 2), "x2", held=False, final=True) == [Fail("x2", "unavailable")]
    assert m.done


def test_a_route_that_ends_owes_agent_disconnected_never_a_retry() -> None:
    m = RemoteMerge({"x1": ["a", "b"], "x2": ["a"], "x3": ["b"]})
    m.start()
    assert m.frame(("a", 1), "x1", held=True, final=False) == [Answer("x1", False)]
    assert m.ended(("a", 1)) == [Fail("x1", "agent_disconnected"), Fail("x2", "agent_disconnected")]
    assert m.owing() == frozenset({"x3"})
    assert m.peer_ended("b") == [Fail("x3", "agent_disconnected")]
    assert m.done


words = st.lists(
    st.tuples(
        st.sampled_from(("held", "progress", "not_held", "ended", "peer_ended")),
        st.sampled_from(PEERS),
        st.sampled_from(TARGETS),
        st.integers(1, 6),
    ),
    max_size=40,
)
plans = st.fixed_dictionaries(
    {t: st.lists(st.sampled_from(PEERS), unique=True, max_size=3) for t in TARGETS}
)


@settings(max_examples=300)
@given(plans, st.sets(st.sampled_from(TARGETS)), words)
def test_exactly_one_terminal_outcome_per_target(
    plan: dict[str, list[str]], lost: set[str], schedule: list[tuple[str, str, str, int]]
) -> None:
    m = RemoteMerge(plan, lost)
    terminal: dict[str, list[object]] = {t: [] for t in TARGETS}
    sent_to: dict[str, list[str]] = {t: [] for t in TARGETS}

    def record(effects: list[object]) -> None:
        for effect in effects:
            match effect:
                case Answer(agent_id=a, final=True) | Fail(agent_id=a):
                    terminal[a].append(effect)
                case Send(peer=peer, agent_ids=ids):
                    for a in ids:
                        sent_to[a].append(peer)

    record(m.start())
    for kind, peer, target, wave in schedule:
        route = (peer, wave)
        if kind == "held":
            record(m.frame(route, target, held=True, final=True))
        elif kind == "progress":
            record(m.frame(route, target, held=True, final=False))
        elif kind == "not_held":
            record(m.frame(route, target, held=False, final=True))
        elif kind == "ended":
            record(m.ended(route))
        else:
            record(m.peer_ended(peer))
    for route in m.routes():
        record(m.ended(route))
    assert m.done
    for target in TARGETS:
        assert len(terminal[target]) == 1
        # Sent to its candidates in order, each at most once, and never to any other peer.
        assert sent_to[target] == plan[target][: len(sent_to[target])]
        [outcome] = terminal[target]
        if not plan[target]:
            assert outcome == Fail(target, "unavailable" if target in lost else "not_connected")
