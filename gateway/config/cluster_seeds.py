"""Peer addresses: a seed entry is `host` or `host:port` (an IPv4 address or a host name).

An entry with a port names one node. An entry without one, like an A record of the seed name,
names a host, and a host runs its nodes on consecutive cluster ports (`rel/yuzu_gw start
--nodes N`: node k on the configured port + k - 1), so it names every node of it: the ports of
this node's own host stand for theirs (`host_ports`), one port when a host runs one node. The
config key (gateway/config/keys/cluster.py) checks the host with `parse_seed`; membership and
the transport (gateway/cluster/) use the rest."""

from __future__ import annotations

import attrs

__all__ = ["DEFAULT_CLUSTER_PORT", "PeerAddr", "expand_seed", "host_ports", "parse_seed"]

# Seed, "Distribution Cookie": the distribution listener range starts at TCP 9100.
DEFAULT_CLUSTER_PORT = 9100


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
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(entry)
    return PeerAddr(host, int(port_text))


def host_ports(port: int, index: int, count: int) -> tuple[int, ...]:
    """The cluster ports of every node of a host running `count` nodes, from node `index`'s own
    `port` (gateway/node/multinode.py offsets node k's by k - 1)."""
    first = port - (index - 1)
    return tuple(range(first, first + count))


def expand_seed(entry: str, ports: tuple[int, ...]) -> list[PeerAddr]:
    """The peers a seed entry names: `host:port` one node, `host` a node on each of `ports`.
    ValueError as `parse_seed`."""
    addr = parse_seed(entry, ports[0])
    if ":" in entry:
        return [addr]
    return [PeerAddr(addr.host, port) for port in ports]
