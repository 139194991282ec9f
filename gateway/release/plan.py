"""From the configuration and a node index to one node of a multi-node host: its name, its
own ports and the environment the release supervisor starts it with.

The release supervisor starts node k of N >= 2 with `YUZU_GW_NODE_INDEX=k`,
`YUZU_GW_NODE_COUNT=N` and `YUZU_GW_REUSEPORT=1`. Boot (`gateway.node.boot.prepare`) applies
`apply_env` to what it loaded, and the supervisor's `nodes.json` comes from `plan`, which calls
the same `for_index`: the node and the record cannot disagree. With one node none of the
variables is set and nothing here changes anything.

Node k is named `<short>-k@<host>` (sent upstream as `gateway_node`) and holds the health,
metrics and cluster ports configured plus k-1; the listener ports are shared, not offset. It
knows N too, so it can tell the cluster ports of its host's other nodes (gateway/cluster/actor.py),
and its memory shedder takes fractional marks of its 1/N share of the memory limit.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from gateway.cluster.advertise import ADVERTISE_VAR
from gateway.config import Config
from gateway.config.keys.cluster import CLUSTER_PORT
from gateway.config.keys.node import HEALTH_PORT, PROMETHEUS_PORT
from gateway.config.keys.shedder import MEMORY_SHEDDING, shared_by
from gateway.config.refusal import BootRefused
from gateway.config.schema import Key, Source
from gateway.config.vm_args import NodeArgs
from gateway.listeners.server import REUSEPORT_VAR

NODE_INDEX_VAR = "YUZU_GW_NODE_INDEX"
NODE_COUNT_VAR = "YUZU_GW_NODE_COUNT"
# The clients' "which node's files" variable (gateway/console/paths.py): never a node's own.
CLIENT_NAME_VAR = "YUZU_GW_NODE_NAME"
INVALID_NODE_INDEX = "invalid_node_index"
# More nodes than this on one host is a typo, not a host (the plan is one node per core).
MAX_NODES = 256
MAX_PORT = 65535

# The ports each node of a host holds alone, configured value + (index - 1). The listener
# ports are shared through SO_REUSEPORT instead. The cluster port too: the nodes of a host are
# members of one cluster, each named in a seed list as host:port (docs/cluster.md).
PER_NODE_PORTS: tuple[Key[int], ...] = (HEALTH_PORT, PROMETHEUS_PORT, CLUSTER_PORT)


def cpu_count() -> int:
    """The cores this process may run on (an affinity mask or a container's cpuset counts)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parse_count(text: str, cpus: int) -> int:
    """`--nodes`: a count 1..MAX_NODES, or `auto` for one node per core. Raises ValueError."""
    if text == "auto":
        return min(max(1, cpus), MAX_NODES)
    if not text.isdecimal() or not 1 <= int(text) <= MAX_NODES:
        raise ValueError(f"--nodes takes a count 1..{MAX_NODES} or auto, not {text!r}")
    return int(text)


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


@attrs.frozen
class NodePlan:
    """One node of the host, as `nodes.json` records it."""

    index: int
    name: str
    health_port: int
    prometheus_port: int
    cluster_port: int

    @property
    def short_name(self) -> str:
        return self.name.split("@", 1)[0]


def plan(config: Config, node: NodeArgs, count: int) -> tuple[NodePlan, ...]:
    """The `count` nodes of a host. Raises BootRefused when a port would pass 65535."""
    plans = []
    for index in range(1, count + 1):
        own, identity = for_index(config, node, index, count)
        ports = (own[HEALTH_PORT], own[PROMETHEUS_PORT], own[CLUSTER_PORT])
        plans.append(NodePlan(index, identity.name, *ports))
    return tuple(plans)


def pin_advertise(env: Mapping[str, str], node: NodeArgs) -> dict[str, str]:
    """The environment the supervisor gives its nodes: with `-name short@${YUZU_GW_ADVERTISE_ADDR}`
    the address the supervisor found, as the Erlang entrypoint exported it before the VM
    started, so every node takes it at step 1 and names the host `nodes.json` records (a
    detection of its own could answer otherwise, with DNS changing in between)."""
    if not node.advertise:
        return dict(env)
    return {**env, ADVERTISE_VAR: node.name.partition("@")[2]}


def node_env(env: Mapping[str, str], index: int, count: int) -> dict[str, str]:
    """The environment node `index` of `count` starts with: the supervisor's, plus its index,
    the count and the shared listener ports."""
    child = {k: v for k, v in env.items() if k != CLIENT_NAME_VAR}
    child[NODE_INDEX_VAR] = str(index)
    child[NODE_COUNT_VAR] = str(count)
    child[REUSEPORT_VAR] = "1"
    return child
