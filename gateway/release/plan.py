"""The nodes of a multi-node host as the release supervisor records and starts them: how many
(`--nodes`), what `nodes.json` says of each (`plan`) and the environment each starts with.

Each node's name and ports come from `gateway.node.multinode.for_index`, the function boot
applies too, so the node and the record cannot disagree. A node gets `YUZU_GW_NODE_INDEX=k`,
`YUZU_GW_NODE_COUNT=N` and `YUZU_GW_REUSEPORT=1` (`node_env`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from gateway.config import Config
from gateway.config.advertise import ADVERTISE_VAR
from gateway.config.keys.cluster import CLUSTER_PORT
from gateway.config.keys.node import HEALTH_PORT, PROMETHEUS_PORT
from gateway.config.vm_args import NodeArgs
from gateway.listeners.server import REUSEPORT_VAR
from gateway.node.multinode import MAX_NODES, NODE_COUNT_VAR, NODE_INDEX_VAR, for_index

# The clients' "which node's files" variable (gateway/console/paths.py): never a node's own.
CLIENT_NAME_VAR = "YUZU_GW_NODE_NAME"


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
