"""Node k of a multi-node host: its name and its own ports, from the host's configuration.

The release supervisor (gateway/release/) starts node k of N >= 2 with `YUZU_GW_NODE_INDEX=k`
and `YUZU_GW_NODE_COUNT=N`; boot (`gateway.node.boot.prepare`) applies `apply_env` to what it
loaded, and the supervisor's `nodes.json` (gateway/release/plan.py) comes from the same
`for_index`: the node and the record cannot disagree. With one node neither variable is set
and nothing here changes anything.

Node k is named `<short>-k@<host>` (sent upstream as `gateway_node`) and holds the health,
metrics and cluster ports configured plus k-1; the listener ports are shared, not offset. It
knows N too, so it can tell the cluster ports of its host's other nodes (gateway/cluster/actor.py),
and its memory shedder takes fractional marks of its 1/N share of the memory limit.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from gateway.config import Config
from gateway.config.keys.cluster import CLUSTER_PORT
from gateway.config.keys.node import HEALTH_PORT, PROMETHEUS_PORT
from gateway.config.keys.shedder import MEMORY_SHEDDING, shared_by
from gateway.config.refusal import BootRefused
from gateway.config.schema import Key, Source
from gateway.config.vm_args import NodeArgs

NODE_INDEX_VAR = "YUZU_GW_NODE_INDEX"
NODE_COUNT_VAR = "YUZU_GW_NODE_COUNT"
INVALID_NODE_INDEX = "invalid_node_index"
# More nodes than this on one host is a typo, not a host (the plan is one node per core).
MAX_NODES = 256
MAX_PORT = 65535

# The ports each node of a host holds alone, configured value + (index - 1). The listener
# ports are shared through SO_REUSEPORT instead. The cluster port too: the nodes of a host are
# members of one cluster, each named in a seed list as host:port (docs/cluster.md).
PER_NODE_PORTS: tuple[Key[int], ...] = (HEALTH_PORT, PROMETHEUS_PORT, CLUSTER_PORT)


def indexed_name(name: str, index: int) -> str:
    """`yuzu_gw@10.0.0.5`, 2 -> `yuzu_gw-2@10.0.0.5`."""
    short, _, host = name.partition("@")
    return f"{short}-{index}@{host}"


def offset_port(port: int, index: int) -> int:
    """The configured port + index - 1; 0 (a free port, in tests) stays 0 for every node.
    Raises ValueError past 65535."""
    if port == 0:
        return 0
    shifted = port + index - 1
    if shifted > MAX_PORT:
        raise ValueError(f"port {port} + {index - 1} is above {MAX_PORT}")
    return shifted


def for_index(config: Config, node: NodeArgs, index: int, count: int) -> tuple[Config, NodeArgs]:
    """Node `index` of `count`: its configuration and identity, from the host's."""
    for key in PER_NODE_PORTS:
        try:
            port = offset_port(config[key], index)
        except ValueError as exc:
            raise BootRefused(INVALID_NODE_INDEX, f"node {index}: {key.name}: {exc}") from None
        config = config.with_value(key, port, Source.ENV)
    shedding = shared_by(config[MEMORY_SHEDDING], count)
    config = config.with_value(MEMORY_SHEDDING, shedding, config.source_of(MEMORY_SHEDDING))
    name = indexed_name(node.name, index)
    source = f"{node.name_source}, node {index} ({NODE_INDEX_VAR})"
    evolved = attrs.evolve(node, name=name, name_source=source, index=index, host_nodes=count)
    return config, evolved


def _number(env: Mapping[str, str], var: str, low: int) -> int:
    text = env.get(var, "")
    if not text.isdecimal() or not low <= int(text) <= MAX_NODES:
        raise BootRefused(INVALID_NODE_INDEX, f"{var} must be {low}..{MAX_NODES}")
    return int(text)


def index_from_env(env: Mapping[str, str]) -> tuple[int, int] | None:
    """(k, N) from `YUZU_GW_NODE_INDEX` and `YUZU_GW_NODE_COUNT`; None without an index. A node
    started by hand with an index and no count takes N = k (nodes 1..k are all it can know)."""
    if not env.get(NODE_INDEX_VAR):
        return None
    index = _number(env, NODE_INDEX_VAR, 1)
    if not env.get(NODE_COUNT_VAR):
        return index, index
    return index, _number(env, NODE_COUNT_VAR, index)


def apply_env(config: Config, node: NodeArgs, env: Mapping[str, str]) -> tuple[Config, NodeArgs]:
    """What boot does: node k's name and ports when `YUZU_GW_NODE_INDEX` says k."""
    found = index_from_env(env)
    return (config, node) if found is None else for_index(config, node, *found)
