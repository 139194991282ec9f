"""This node's advertise address when the node name leaves it to be found (docs/cluster.md,
"The advertise address"): the vm.args line `-name yuzu_gw@${YUZU_GW_ADVERTISE_ADDR}`, which
is the Erlang release's `vm.args.src` line, where the Erlang container entrypoint exported
the variable before the VM started.

The seed's order ("YUZU_GW_ADVERTISE_ADDR"), first success wins:

1. `YUZU_GW_ADVERTISE_ADDR` itself, if set and not empty: it wins outright.
2. The addresses discovery dials that are this host's own: each of them resolved (IPv4), the
   first that is on a local interface ("which of the addresses my peers see is mine"). Those
   are the hosts of `cluster_seed_nodes` when it is non-empty (it replaces DNS discovery, so
   they are what the peers dial), else the A records of `cluster_seed_dns_name` (default
   `gateway`). The Erlang entrypoint read the seed name only; with a seed list it fell to
   step 3, which can pick an address the peers never dial, and this node's transport listens
   on its advertise address alone.
3. This host's name, resolved: its first IPv4 address.
4. 127.0.0.1, the single-node default.

Pure: the resolver, the interface addresses and the host name are passed in
(gateway/config/local_host.py reads the real ones), so gateway/config/vm_args.py can name
the variable without a cycle.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Sequence

import attrs

__all__ = ["ADVERTISE_VAR", "FALLBACK_ADDR", "Advertised", "LocalHost", "Resolve", "Step", "choose"]

ADVERTISE_VAR = "YUZU_GW_ADVERTISE_ADDR"
# Step 4: what a single node without a name for its host has always advertised.
FALLBACK_ADDR = "127.0.0.1"

# A name -> its IPv4 addresses in the resolver's order; empty when it does not resolve.
Resolve = Callable[[str], Sequence[str]]


class Step(enum.Enum):
    """Which step found the address; the value is what the boot line says of it."""

    EXPLICIT = f"{ADVERTISE_VAR} is set"
    SEED_NODES = "a cluster_seed_nodes address on a local interface"
    SEED_NAME = "an A record of cluster_seed_dns_name on a local interface"
    HOSTNAME = "this host's name resolves to it (no seed address is on a local interface)"
    DEFAULT = "the default: no seed address is local and the host name does not resolve"


@attrs.frozen
class Advertised:
    addr: str
    step: Step


@attrs.frozen
class LocalHost:
    """What this host knows of itself: the effects `choose` is given."""

    resolve: Resolve
    addrs: Collection[str]  # the IPv4 addresses of its interfaces
    hostname: str


def choose(
    explicit: str | None, seed_hosts: Sequence[str], seed_name: str, host: LocalHost
) -> Advertised:
    """The advertise address (module doc). `explicit` is YUZU_GW_ADVERTISE_ADDR, `seed_hosts`
    the hosts of `cluster_seed_nodes` in their order (names or addresses), `seed_name`
    `cluster_seed_dns_name`."""
    if explicit:
        return Advertised(explicit, Step.EXPLICIT)
    names, step = (seed_hosts, Step.SEED_NODES) if seed_hosts else ((seed_name,), Step.SEED_NAME)
    for name in names:
        for addr in host.resolve(name):
            if addr in host.addrs:
                return Advertised(addr, step)
    own = host.resolve(host.hostname)
    if own:
        return Advertised(own[0], Step.HOSTNAME)
    return Advertised(FALLBACK_ADDR, Step.DEFAULT)
