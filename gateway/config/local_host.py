"""The shell of the advertise address (gateway/config/advertise.py): what this host knows of
itself, read for real, and `advertise_node`, which boot calls (gateway/config/loader.py) for a
node name that leaves its host to the advertise address.

- Interface addresses: the local IPv4 addresses of /proc/net/fib_trie (Linux; every address
  of every interface, secondary ones included, which `SIOCGIFADDR` would miss). Where the file
  cannot be read (not Linux) there are none, so step 2 finds nothing and the host name decides.
- Resolution: IPv4 only, as discovery; all of boot's resolutions together get at most
  `RESOLVE_BUDGET_S`, then the steps fall through (a dead resolver must not hold the boot).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from gateway.config.advertise import LocalHost, Resolve, choose
from gateway.config.cluster_seeds import DEFAULT_CLUSTER_PORT, parse_seed
from gateway.config.vm_args import NodeArgs

__all__ = ["advertise_node", "bounded_resolver", "local_ipv4_addrs", "parse_fib_trie"]

log = logging.getLogger("yuzu_gw.cluster")

FIB_TRIE = Path("/proc/net/fib_trie")
# Boot waits at most this long for names in all: a resolver's own timeout (5 s, twice, in a
# default resolv.conf) per name would stall the start of a node whose DNS is down.
RESOLVE_BUDGET_S = 5.0
_LEAF = "|-- "
_LOCAL_HOST_ROUTE = "/32 host LOCAL"


def parse_fib_trie(text: str) -> frozenset[str]:
    """The local addresses in the text of /proc/net/fib_trie: each leaf (`|-- 10.0.0.5`) that
    carries a `/32 host LOCAL` route. A leaf with only a network route (`/8 host LOCAL` on
    127.0.0.0) is a network, not an address."""
    addrs: set[str] = set()
    leaf: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(_LEAF):
            leaf = stripped[len(_LEAF) :]
        elif stripped.startswith("+--"):
            leaf = None
        elif leaf is not None and stripped.startswith(_LOCAL_HOST_ROUTE):
            addrs.add(leaf)
    return frozenset(addrs)


def local_ipv4_addrs(path: Path = FIB_TRIE) -> frozenset[str]:
    try:
        return parse_fib_trie(path.read_text())
    except OSError:
        return frozenset()


def _resolve_ipv4(name: str, timeout: float) -> tuple[str, ...]:
    """`name`'s IPv4 addresses in the resolver's order, or () when it does not resolve within
    `timeout` (the lookup thread is a daemon: a hung lookup never holds the process)."""
    found: list[tuple[str, ...]] = []

    def lookup() -> None:
        try:
            infos = socket.getaddrinfo(name, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return
        found.append(tuple(dict.fromkeys(str(info[4][0]) for info in infos)))

    thread = threading.Thread(target=lookup, name="advertise-resolve", daemon=True)
    thread.start()
    thread.join(timeout)
    return found[0] if found else ()


def bounded_resolver(
    budget_s: float = RESOLVE_BUDGET_S, clock: Callable[[], float] = time.monotonic
) -> Resolve:
    """A resolver whose lookups together take at most `budget_s`."""
    deadline = clock() + budget_s

    def resolve(name: str) -> tuple[str, ...]:
        return _resolve_ipv4(name, max(0.0, deadline - clock()))

    return resolve


def advertise_node(node: NodeArgs, seed_nodes: Sequence[str], seed_name: str) -> NodeArgs:
    """A node name `short@${YUZU_GW_ADVERTISE_ADDR}` with the advertise address as its host,
    and one INFO line naming the step that found it; any other name unchanged. `seed_nodes`
    and `seed_name` are the configured `cluster_seed_nodes` and `cluster_seed_dns_name`."""
    if not node.advertise:
        return node
    short, _, host = node.name.partition("@")
    found = choose(
        host or None,
        [parse_seed(entry, DEFAULT_CLUSTER_PORT).host for entry in seed_nodes],
        seed_name,
        LocalHost(bounded_resolver(), local_ipv4_addrs(), socket.gethostname()),
    )
    log.info("Advertise address %s: %s", found.addr, found.step.value)
    return attrs.evolve(node, name=f"{short}@{found.addr}")
