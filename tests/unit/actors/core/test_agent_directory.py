"""The replicated agent directory (actors/core/agent_directory.py): interleavings of joins,
leaves, syncs and purges converge; a stale leave never removes a newer join; the newest entry
is tried first; an unreachable peer's agents are remembered, then forgotten."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.agent_directory import (
    UNREACHABLE_RETENTION_S,
    AgentDirectory,
    Join,
    Leave,
    Record,
    SyncBegin,
    SyncEnd,
)

AGENTS = ("a", "b", "c", "d")
PEERS = ("p1", "p2", "p3")


class _Cluster:
    """Three publishers, one observer; each publisher's records travel on its own ordered link,
    delivered whenever the schedule says so; a link can go down (its undelivered records are
    lost, the observer purges) and come back (a full sync first)."""

    def __init__(self) -> None:
        self.pubs = {p: AgentDirectory() for p in PEERS}
        self.held: dict[str, set[str]] = {p: set() for p in PEERS}
        self.observer = AgentDirectory()
        self.links: dict[str, deque[Record] | None] = {p: deque() for p in PEERS}
        for peer in PEERS:
            self.links[peer].extend(self.pubs[peer].snapshot())  # type: ignore[union-attr]
        self.now = 0.0
        self.wall = 1000

    def step(self, op: tuple[str, str, str]) -> None:
        kind, peer, agent = op
        self.wall += 1
        self.now += 1.0
        link = self.links[peer]
        if kind == "toggle":
            self.held[peer] ^= {agent}
        elif kind == "publish":
            records = self.pubs[peer].observe(frozenset(self.held[peer]), self.wall)
            if link is not None:
                link.extend(records)
        elif kind == "deliver" and link:
            self.observer.apply(peer, link.popleft())
        elif kind == "down" and link is not None:
            self.links[peer] = None
            self.observer.purge(peer, self.now)
        elif kind == "up" and link is None:
            self.links[peer] = deque(self.pubs[peer].snapshot())

    def settle(self) -> None:
        for peer in PEERS:
            link = self.links[peer]
            records = self.pubs[peer].observe(frozenset(self.held[peer]), self.wall)
            if link is not None:
                link.extend(records)
                while link:
                    self.observer.apply(peer, link.popleft())


ops = st.tuples(
    st.sampled_from(("toggle", "publish", "deliver", "deliver", "down", "up")),
    st.sampled_from(PEERS),
    st.sampled_from(AGENTS),
)


@settings(max_examples=300)
@given(st.lists(ops, max_size=60))
def test_any_interleaving_converges_to_what_each_reachable_peer_holds(
    schedule: list[tuple[str, str, str]],
) -> None:
    cluster = _Cluster()
    for op in schedule:
        cluster.step(op)
    cluster.settle()
    observer = cluster.observer
    for agent in AGENTS:
        holders = {p for p in PEERS if cluster.links[p] is not None and agent in cluster.held[p]}
        assert set(observer.candidates(agent)) == holders
        # An agent known only on a down peer is unreachable, never simply absent...
        lost = observer.unreachable_holder(agent)
        if lost is not None:
            assert cluster.links[lost] is None
    # ...and a down peer is named as unreachable until it comes back.
    downs = [p for p in PEERS if cluster.links[p] is None]
    assert observer.unreachable_peers() == sorted(downs)


@settings(max_examples=200)
@given(st.lists(ops, max_size=60))
def test_the_broadcast_plan_names_each_agent_once(schedule: list[tuple[str, str, str]]) -> None:
    cluster = _Cluster()
    for op in schedule:
        cluster.step(op)
    cluster.settle()
    plan, lost = cluster.observer.broadcast_plan(frozenset({"a"}))
    planned = [agent for agents in plan.values() for agent in agents]
    assert len(planned) == len(set(planned))
    assert "a" not in planned  # held here: the local router has it
    for peer, agents in plan.items():
        for agent in agents:
            assert cluster.observer.candidates(agent)[0] == peer
    unreachable = [agent for agents in lost.values() for agent in agents]
    assert not set(unreachable) & set(planned)


def test_a_stale_leave_does_not_remove_a_newer_join() -> None:
    directory = AgentDirectory()
    directory.apply("p1", Join("a", 10))
    directory.apply("p1", Join("a", 20))  # rejoined (a new stamp) before the old leave came
    directory.apply("p1", Leave("a", 10))
    assert directory.candidates("a") == ("p1",)
    directory.apply("p1", Leave("a", 20))
    assert directory.candidates("a") == ()


def test_a_sync_is_applied_whole_at_its_end() -> None:
    directory = AgentDirectory()
    directory.apply("p1", Join("old", 1))
    directory.apply("p1", SyncBegin())
    directory.apply("p1", Join("new", 5))
    assert directory.candidates("old") == ("p1",)  # never half a sync
    assert directory.candidates("new") == ()
    directory.apply("p1", SyncEnd())
    assert directory.candidates("old") == ()
    assert directory.candidates("new") == ("p1",)


def test_the_newest_entry_is_first_whatever_the_wall_clocks_say() -> None:
    slow, fast, observer = AgentDirectory(), AgentDirectory(), AgentDirectory()
    [join_fast] = fast.observe({"a"}, wall_ms=50_000)  # a clock far ahead
    slow.apply("fast", join_fast)
    observer.apply("fast", join_fast)
    # The agent moves to `slow`, whose clock is behind: having seen the join, its own is newer.
    [join_slow] = slow.observe({"a"}, wall_ms=1_000)
    observer.apply("slow", join_slow)
    assert observer.candidates("a") == ("slow", "fast")


def test_an_unreachable_peers_agents_are_remembered_then_forgotten() -> None:
    directory = AgentDirectory()
    directory.apply("p1", Join("a", 1))
    directory.apply("p1", Join("b", 2))
    directory.purge("p1", now=100.0)
    assert directory.candidates("a") == ()
    assert directory.unreachable_holder("a") == "p1"
    assert directory.broadcast_plan(frozenset()) == ({}, {"p1": ["a", "b"]})
    # `b` connects elsewhere: that newer join wins, p1's entry is stale.
    directory.apply("p2", Join("b", 3))
    assert directory.unreachable_holder("b") is None
    assert directory.candidates("b") == ("p2",)
    directory.expire(100.0 + UNREACHABLE_RETENTION_S - 1)
    assert directory.unreachable_holder("a") == "p1"
    directory.expire(100.0 + UNREACHABLE_RETENTION_S)
    assert directory.unreachable_holder("a") is None
    assert directory.unreachable_peers() == []


def test_a_peer_back_replaces_its_unreachable_entries_with_its_sync() -> None:
    directory = AgentDirectory()
    directory.apply("p1", Join("a", 1))
    directory.purge("p1", now=0.0)
    for record in (SyncBegin(), Join("c", 4), SyncEnd()):
        directory.apply("p1", record)
    assert directory.unreachable_holder("a") is None
    assert directory.unreachable_peers() == []
    assert directory.candidates("c") == ("p1",)


def test_observe_publishes_joins_and_leaves_of_this_nodes_agents() -> None:
    directory = AgentDirectory()
    assert directory.observe(["a", "b"], 10) == [Join("a", 10), Join("b", 11)]
    assert directory.snapshot() == [SyncBegin(), Join("a", 10), Join("b", 11), SyncEnd()]
    assert directory.observe(["b"], 12) == [Leave("a", 10)]
    assert directory.observe(["b"], 13) == []
    assert directory.local_count() == 1
