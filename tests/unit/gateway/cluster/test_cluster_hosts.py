"""Which nodes of each host a node dials, from what the hosts advertised
(gateway/cluster/hosts.py; docs/cluster.md, "Hosts with different node counts").

The cluster is modelled whole: hosts running different numbers of nodes on consecutive ports
from one configured `cluster_port`, some of them older gateways that advertise nothing; every
node runs a `HostPlan`, dials what it plans, learns the advert of each node that answers, and
so on until nothing changes (what the membership rounds do)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cluster.auth import host_proof, new_nonce, verify
from gateway.cluster.hosts import HostAdvert, HostPlan, Target, port_list
from gateway.config.cluster_seeds import PeerAddr, host_ports, seed_target

FIRST = 9100
COOKIE = "c" * 64


@attrs.frozen
class Host:
    name: str
    nodes: int
    advertises: bool = True

    def addrs(self) -> list[PeerAddr]:
        return [PeerAddr(self.name, p) for p in range(FIRST, FIRST + self.nodes)]


@attrs.define
class Node:
    """One node of the model: its plan and its seed targets (as the actor holds them)."""

    addr: PeerAddr
    host: Host
    targets: Sequence[Target]
    plan: HostPlan

    def siblings(self) -> list[PeerAddr]:
        return [a for a in self.host.addrs() if a != self.addr]

    def dials(self) -> set[PeerAddr]:
        return {*self.siblings(), *self.plan.addresses(self.targets)} - {self.addr}


def cluster(hosts: Sequence[Host], targets_of: dict[str, Sequence[Target]]) -> list[Node]:
    nodes = []
    for host in hosts:
        for k, addr in enumerate(host.addrs(), start=1):
            plan = HostPlan(host_ports(addr.port, k, host.nodes))
            nodes.append(Node(addr, host, targets_of[host.name], plan))
    return nodes


def converge(nodes: Sequence[Node]) -> dict[PeerAddr, set[PeerAddr]]:
    """Dial and learn until no plan changes; each node's dial set then."""
    by_addr = {n.addr: n for n in nodes}
    for _ in range(len(nodes) + 2):
        changed = False
        for node in nodes:
            for addr in sorted(node.dials()):
                peer = by_addr.get(addr)
                if peer is None:
                    continue  # nothing listens there: the dial fails
                if not peer.host.advertises:
                    node.plan.unadvertised(addr.host)
                    continue
                advert = HostAdvert(FIRST, peer.host.nodes)
                changed |= node.plan.learn(addr, advert)
        if not changed:
            return {n.addr: n.dials() for n in nodes}
    raise AssertionError("the plans did not settle")


host_counts = st.lists(st.integers(1, 6), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(host_counts, st.data())
def test_hosts_named_without_a_port_form_a_full_symmetric_mesh(
    counts: list[int], data: st.DataObject
) -> None:
    hosts = [Host(f"10.0.0.{i + 1}", n) for i, n in enumerate(counts)]
    names = [h.name for h in hosts]
    # Each host has its own order of the seed list, which may name a host twice.
    targets = {
        h.name: data.draw(st.permutations(names + data.draw(st.lists(st.sampled_from(names)))))
        for h in hosts
    }
    nodes = cluster(hosts, targets)
    dials = converge(nodes)
    every = {n.addr for n in nodes}
    for node in nodes:
        # Every other node of every host, in both directions, and no port nothing listens on.
        assert dials[node.addr] == every - {node.addr}
        assert node.plan.gaps(dials[node.addr] | {node.addr}) == {}


@settings(max_examples=200, deadline=None)
@given(host_counts, st.data())
def test_a_host_named_port_by_port_is_dialled_as_named_and_its_gap_named(
    counts: list[int], data: st.DataObject
) -> None:
    hosts = [Host(f"10.0.0.{i + 1}", n) for i, n in enumerate(counts)]
    every = [a for h in hosts for a in h.addrs()]
    # The same seed list everywhere: some hosts by name, some nodes by host:port.
    by_name = data.draw(st.sets(st.sampled_from([h.name for h in hosts])))
    named = data.draw(st.sets(st.sampled_from(every)))
    targets: list[Target] = [*sorted(by_name), *sorted(named)]
    nodes = cluster(hosts, {h.name: targets for h in hosts})
    dials = converge(nodes)
    for node in nodes:
        dialled = dials[node.addr]
        # Exactly what the seed list names (its hosts whole), and its own host's nodes.
        wanted = {a for a in every if a.host in by_name or a in named}
        own = set(node.host.addrs())
        assert dialled == (wanted | own) - {node.addr}
        # A host is advertised once one of its nodes answered; what of it is not dialled is
        # its gap, and a host named whole has none.
        reached = {a.host for a in dialled}
        gaps = node.plan.gaps(dialled | {node.addr})
        for host in hosts:
            missing = tuple(a.port for a in host.addrs() if a not in dialled | {node.addr})
            if host.name in reached and missing:
                assert gaps[host.name] == missing
            else:
                assert host.name not in gaps


@settings(max_examples=100, deadline=None)
@given(host_counts, st.data())
def test_an_older_gateways_host_is_dialled_on_this_hosts_ports(
    counts: list[int], data: st.DataObject
) -> None:
    hosts = [
        Host(f"10.0.0.{i + 1}", n, advertises=data.draw(st.booleans()))
        for i, n in enumerate(counts)
    ]
    names = [h.name for h in hosts]
    nodes = cluster(hosts, {name: names for name in names})
    dials = converge(nodes)
    for node in nodes:
        for host in hosts:
            if host is node.host:
                continue
            ports = {a.port for a in dials[node.addr] if a.host == host.name}
            if host.advertises:
                assert ports == {a.port for a in host.addrs()}
            else:
                # As before adverts: the dialling node's own host's ports, said once.
                assert ports == set(node.plan.own_ports)
                assert not node.plan.unadvertised(host.name)


def test_a_host_that_says_fewer_nodes_is_dialled_on_fewer_ports() -> None:
    plan = HostPlan((9100, 9101))
    b = "10.0.0.2"
    assert plan.ports_of(b) == (9100, 9101)
    assert plan.learn(PeerAddr(b, 9100), HostAdvert(9100, 4))
    assert plan.ports_of(b) == (9100, 9101, 9102, 9103)
    assert not plan.learn(PeerAddr(b, 9102), HostAdvert(9100, 4))  # nothing new
    assert plan.learn(PeerAddr(b, 9100), HostAdvert(9100, 1))
    assert plan.ports_of(b) == (9100,)
    # A second release on ports of its own is kept beside the first.
    assert plan.learn(PeerAddr(b, 9200), HostAdvert(9200, 2))
    assert plan.ports_of(b) == (9100, 9200, 9201)
    # The configured port stays dialled whatever a node of another range said.
    assert plan.learn(PeerAddr(b, 9100), HostAdvert(9100, 3))
    assert plan.learn(PeerAddr(b, 9101), HostAdvert(9101, 1))
    assert plan.ports_of(b) == (9100, 9101, 9200, 9201)
    assert plan.status() == {b: "9101, 9200..9201"}


def test_an_advert_that_leaves_out_the_port_it_came_from_is_ignored() -> None:
    plan = HostPlan((9100,))
    assert not plan.learn(PeerAddr("10.0.0.2", 9100), HostAdvert(9200, 3))
    assert plan.ports_of("10.0.0.2") == (9100,)


def test_a_gap_is_reported_once_and_again_when_it_reopens() -> None:
    plan = HostPlan((9100,))
    b = "10.0.0.2"
    plan.learn(PeerAddr(b, 9100), HostAdvert(9100, 3))
    only_first = [PeerAddr(b, 9100)]
    assert plan.report(only_first) == {b: (9101, 9102)}
    assert plan.report(only_first) == {}
    assert plan.current_gaps() == {b: (9101, 9102)}
    assert plan.report([*only_first, PeerAddr(b, 9101)]) == {b: (9102,)}
    assert plan.report(PeerAddr(b, p) for p in (9100, 9101, 9102)) == {}
    assert plan.current_gaps() == {}
    assert plan.report(only_first) == {b: (9101, 9102)}


def test_a_host_gone_from_the_discovery_leaves_no_gap() -> None:
    # An A record removed (a container scaled down): its host is named by nothing now, which
    # is not a seed list leaving its nodes out.
    plan = HostPlan((9100,))
    plan.learn(PeerAddr("10.0.0.2", 9100), HostAdvert(9100, 2))
    assert plan.report(PeerAddr("10.0.0.2", p) for p in (9100, 9101)) == {}
    assert plan.report([PeerAddr("10.0.0.3", 9100)]) == {}
    assert plan.current_gaps() == {}


def test_a_peer_with_no_advert_is_said_once_per_host() -> None:
    plan = HostPlan((9100, 9101))
    assert plan.unadvertised("10.0.0.2")
    assert not plan.unadvertised("10.0.0.2")
    assert plan.unadvertised("10.0.0.3")


@given(st.integers(1, 65535), st.integers(1, 65535))
def test_an_advert_reads_back_what_it_wrote(first: int, count: int) -> None:
    advert = HostAdvert(first, count)
    expected = advert if first + count - 1 <= 65535 else None
    assert HostAdvert.decode(advert.encode()) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "9100",
        "9100+",
        "+3",
        "9100+0",
        "0+1",
        "9100+99999",
        "65535+2",
        "a+1",
        "-1+2",
        "9100+3 ",
        "²+1",
        "123456+1",
    ],
)
def test_a_malformed_advert_is_none(text: str) -> None:
    assert HostAdvert.decode(text) is None


def test_the_host_proof_binds_the_ports_the_nonces_the_node_and_the_cookie() -> None:
    cn, sn = new_nonce(), new_nonce()
    proof = host_proof(COOKIE, cn, sn, "node-1", "9100+3")
    assert verify(proof, host_proof(COOKIE, cn, sn, "node-1", "9100+3"))
    for other in (
        host_proof(COOKIE, cn, sn, "node-1", "9100+4"),
        host_proof(COOKIE, new_nonce(), sn, "node-1", "9100+3"),
        host_proof(COOKIE, cn, sn, "node-2", "9100+3"),
        host_proof("d" * 64, cn, sn, "node-1", "9100+3"),
    ):
        assert not verify(proof, other)


def test_ports_are_written_as_runs() -> None:
    assert port_list([9103, 9100, 9101, 9105, 9102]) == "9100..9103, 9105"
    assert port_list([9100]) == "9100"


def test_a_seed_entry_names_a_host_or_one_node() -> None:
    assert seed_target("10.0.0.7", 9100) == "10.0.0.7"
    assert seed_target("gw-2.example", 9100) == "gw-2.example"
    assert seed_target("10.0.0.7:9205", 9100) == PeerAddr("10.0.0.7", 9205)
