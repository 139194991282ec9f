"""Peer addresses: a seed entry is `host` or `host:port` (an IPv4 address or a host name).

An entry with a port names one node. An entry without one, like an A record of the seed name,
names a host, and a host runs its nodes on consecutive cluster ports (`rel/yuzu_gw start
--nodes N`: node k on the configured port + k - 1), so it names every node of it: how many is
that host's own business, which its nodes advertise to whoever dials them
(gateway/cluster/hosts.py, `seed_target`); `host_ports` are this node's own host's. The config
key (gateway/config/keys/cluster.py) checks the host with `parse_seed`; membership and the
transport (gateway/cluster/) use the rest."""

from __future__ import annotations

import attrs

__all__ = [
    "DEFAULT_CLUSTER_PORT",
    "MAX_PORT",
    "PeerAddr",
    "host_ports",
    "parse_seed",
    "seed_target",
]

# Seed, "Distribution Cookie": the distribution listener range starts at TCP 9100.
DEFAULT_CLUSTER_PORT = 9100
MAX_PORT = 65535


@attrs.frozen(order=True)
class PeerAddr:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_seed(entry: str, default_port: int) -> PeerAddr:
    """`host` or `host:port` (1..65535); ValueError for an empty host or a bad port."""
    host, sep, port_text = entry.partition(":")
    if not host:
        raise ValueError(entry)
    if not sep:
        return PeerAddr(host, default_port)
    if not port_text.isdigit() or not 1 <= int(port_text) <= MAX_PORT:
        raise ValueError(entry)
    return PeerAddr(host, int(port_text))


def host_ports(port: int, index: int, count: int) -> tuple[int, ...]:
    """The cluster ports of every node of a host running `count` nodes, from node `index`'s own
    `port` (gateway/node/multinode.py offsets node k's by k - 1)."""
    first = port - (index - 1)
    return tuple(range(first, first + count))


def seed_target(entry: str, default_port: int) -> PeerAddr | str:
    """What a seed entry names: `host:port` that one node, `host` the host (every node it
    runs, gateway/cluster/hosts.py). ValueError as `parse_seed`."""
    addr = parse_seed(entry, default_port)
    return addr if ":" in entry else addr.host
