"""The membership policy (gateway/cluster/membership.py) against a model, and the seed entries
(gateway/config/cluster_seeds.py)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from gateway.cluster.membership import Dial, Membership, Probe, Resolve
from gateway.config.cluster_seeds import (
    DEFAULT_CLUSTER_PORT,
    PeerAddr,
    host_ports,
    parse_seed,
    seed_target,
)
from gateway.config.converters import BadValue
from gateway.config.keys.cluster import SeedList

ADDRS = [PeerAddr(f"10.0.0.{n}", 9100 + n % 2) for n in range(8)]
addr_sets = st.frozensets(st.sampled_from(ADDRS), max_size=8)
INTERVAL = 5.0


def test_the_default_port_is_the_seeds_first_distribution_port() -> None:
    assert DEFAULT_CLUSTER_PORT == 9100


@pytest.mark.parametrize(
    ("entry", "addr"),
    [
        ("10.0.0.1", PeerAddr("10.0.0.1", 9100)),
        ("10.0.0.1:9102", PeerAddr("10.0.0.1", 9102)),
        ("gw-2.example", PeerAddr("gw-2.example", 9100)),
    ],
)
def test_a_seed_entry_may_carry_a_port(entry: str, addr: PeerAddr) -> None:
    assert parse_seed(entry, 9100) == addr


@given(st.integers(1, 64), st.data())
def test_a_hosts_ports_run_on_from_the_first_nodes(count: int, data: st.DataObject) -> None:
    index = data.draw(st.integers(1, count))
    # Node `index` holds the configured port (9100) + index - 1 (gateway/node/multinode.py).
    ports = host_ports(9100 + index - 1, index, count)
    assert ports == tuple(range(9100, 9100 + count))
    assert host_ports(9100, 1, 1) == (9100,)


@pytest.mark.parametrize("entry", ["", "10.0.0.1:", "10.0.0.1:0", "10.0.0.1:65536", ":9", "h:x"])
def test_a_bad_seed_entry_is_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        parse_seed(entry, 9100)
    with pytest.raises(ValueError):
        seed_target(entry, 9100)
    with pytest.raises(BadValue):
        SeedList()([entry])


@pytest.mark.parametrize("entry", ["a b", "-x:9100", "10.0.0.1:9100:1"])
def test_the_key_refuses_a_bad_host(entry: str) -> None:
    with pytest.raises(BadValue):
        SeedList()([entry])


def test_the_seed_list_converter_keeps_entries_as_written() -> None:
    assert SeedList()([b"10.0.0.1", "10.0.0.2:9101", (10, 0, 0, 3)]) == (
        "10.0.0.1",
        "10.0.0.2:9101",
        "10.0.0.3",
    )
    with pytest.raises(BadValue):
        SeedList()(b"10.0.0.1")


def test_rounds_come_every_interval_with_no_backoff() -> None:
    m = Membership(INTERVAL, 16)
    assert m.tick(0.0) == [Resolve()]
    assert m.tick(4.9) == []
    # Nothing found, a failed resolution: the next round still comes one interval later.
    assert m.resolved([]) == []
    assert m.tick(5.0) == [Resolve()]
    assert m.tick(10.0) == [Resolve()]


def test_a_dial_that_reaches_this_node_is_never_dialled_again() -> None:
    m = Membership(INTERVAL, 16)
    me, peer = ADDRS[0], ADDRS[1]
    assert m.resolved([me, peer]) == [Dial(me), Dial(peer)]
    m.dialed(me, "self")
    assert m.dialed(peer, "up")
    assert (m.peers_resolved, m.peers_connected) == (1, 1)
    assert m.resolved([me, peer]) == [Probe(peer)]


def test_the_lifetime_cap_ignores_fresh_addresses_for_ever() -> None:
    m = Membership(INTERVAL, 2)
    assert m.resolved(ADDRS[:2]) == [Dial(ADDRS[0]), Dial(ADDRS[1])]
    # The seed name rotates: two fresh addresses, past the cap.
    m.dialed(ADDRS[0], "failed")
    m.dialed(ADDRS[1], "failed")
    assert m.resolved(ADDRS[2:4]) == []
    assert m.capped == 2
    # The addresses taken before stay usable.
    assert m.resolved(ADDRS[:4]) == [Dial(ADDRS[0]), Dial(ADDRS[1])]


def test_a_link_outlives_its_address_until_a_probe_fails() -> None:
    m = Membership(INTERVAL, 16)
    m.resolved([ADDRS[0]])
    m.dialed(ADDRS[0], "up")
    # The seed name stops resolving (a DNS hiccup): the link stays, and is probed.
    assert m.resolved([]) == [Probe(ADDRS[0])]
    assert m.peers_connected == 1
    assert m.probed(ADDRS[0], ok=False)
    assert m.peers_connected == 0


def test_a_retarget_dials_the_new_addresses_at_once_and_probes_nothing() -> None:
    m = Membership(INTERVAL, 3)
    assert m.resolved(ADDRS[:1]) == [Dial(ADDRS[0])]
    m.dialed(ADDRS[0], "up")
    # A host told its ports mid-round: its new ones now, the link up neither redialled nor
    # probed, the one under way not dialled twice, and the cap still holds.
    assert m.retarget(ADDRS[:3]) == [Dial(ADDRS[1]), Dial(ADDRS[2])]
    assert m.retarget(ADDRS[:4]) == []
    assert (m.peers_resolved, m.capped) == (3, 1)
    # Fewer ports: the addresses left out are not resolved any more; a link up stays up.
    assert m.retarget(ADDRS[1:2]) == []
    assert (m.peers_resolved, m.peers_connected) == (1, 1)
    assert m.resolved(ADDRS[1:2]) == [Probe(ADDRS[0])]


class MembershipMachine(RuleBasedStateMachine):
    """Against a model: connected = dialled up and not lost since; at most one dial and one
    probe at a time per address; never more distinct addresses than the cap."""

    def __init__(self) -> None:
        super().__init__()
        self.cap = 5
        self.m = Membership(INTERVAL, self.cap)
        self.connected: set[PeerAddr] = set()
        self.dialing: set[PeerAddr] = set()
        self.probing: set[PeerAddr] = set()
        self.selves: set[PeerAddr] = set()
        self.taken: set[PeerAddr] = set()

    def wanted(self, addrs: frozenset[PeerAddr]) -> set[PeerAddr]:
        """The addresses of `addrs` taken on (the cap), this node's excluded."""
        for addr in sorted(addrs - self.selves):
            if addr not in self.taken and len(self.taken) < self.cap:
                self.taken.add(addr)
        return (addrs - self.selves) & self.taken

    @rule(addrs=addr_sets)
    def resolve(self, addrs: frozenset[PeerAddr]) -> None:
        effects = self.m.resolved(addrs)
        wanted = self.wanted(addrs)
        dials = {e.addr for e in effects if isinstance(e, Dial)}
        probes = {e.addr for e in effects if isinstance(e, Probe)}
        assert dials == wanted - self.connected - self.dialing
        assert probes == self.connected - self.probing
        self.dialing |= dials
        self.probing |= probes

    @rule(addrs=addr_sets)
    def retarget(self, addrs: frozenset[PeerAddr]) -> None:
        dials = self.m.retarget(addrs)
        # Dials only: the links up are probed by the rounds.
        assert all(isinstance(e, Dial) for e in dials)
        assert {e.addr for e in dials} == self.wanted(addrs) - self.connected - self.dialing
        self.dialing |= {e.addr for e in dials}

    @rule(data=st.data(), outcome=st.sampled_from(["up", "self", "refused", "failed"]))
    def dial_ends(self, data: st.DataObject, outcome: str) -> None:
        if not self.dialing:
            return
        addr = data.draw(st.sampled_from(sorted(self.dialing)))
        self.dialing.discard(addr)
        up = self.m.dialed(addr, outcome)  # type: ignore[arg-type]
        assert up == (outcome == "up")
        if outcome == "up":
            self.connected.add(addr)
        if outcome == "self":
            self.selves.add(addr)

    @rule(data=st.data(), ok=st.booleans())
    def probe_ends(self, data: st.DataObject, ok: bool) -> None:
        if not self.probing:
            return
        addr = data.draw(st.sampled_from(sorted(self.probing)))
        self.probing.discard(addr)
        went_down = self.m.probed(addr, ok)
        assert went_down == (not ok and addr in self.connected)
        if not ok:
            self.connected.discard(addr)

    @rule(addr=st.sampled_from(ADDRS))
    def call_breaks(self, addr: PeerAddr) -> None:
        assert self.m.lost(addr) == (addr in self.connected)
        self.connected.discard(addr)

    @invariant()
    def agrees(self) -> None:
        assert self.m.connected() == self.connected
        assert self.m.peers_connected == len(self.connected)
        assert len(self.taken) <= self.cap


TestMembership = MembershipMachine.TestCase
TestMembership.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=30))
def test_at_most_one_round_per_interval(times: list[float]) -> None:
    m = Membership(INTERVAL, 4)
    rounds = [t for t in sorted(times) if m.tick(t)]
    assert all(b - a >= INTERVAL for a, b in itertools.pairwise(rounds))
    assert rounds[0] == min(times)
