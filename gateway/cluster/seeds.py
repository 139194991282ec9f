"""Peer addresses: a seed entry is `host` or `host:port` (an IPv4 address or a host name).

An entry without a port takes the node's `cluster_port`, so one address names one node per host
in the common case, and an entry with a port names one of several nodes of a host. The config
key (gateway/config/keys/cluster.py) checks the host; this module imports nothing of the
config, so the key can use it."""

from __future__ import annotations

import attrs

__all__ = ["DEFAULT_CLUSTER_PORT", "PeerAddr", "parse_seed"]

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
