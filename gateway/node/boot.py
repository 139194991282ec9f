"""From the environment to a ready-to-start node: the files to read, the configuration,
the cookie guard and the node's context. Every refusal here is a `BootRefused`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector

from gateway.config import default_paths, load
from gateway.config.context import NodeContext
from gateway.node.multinode import apply_env
from gateway.node.process_collector import ProcessCollector
from gateway.upstream.boot_check import check_upstream

# Where the pid file, log, console socket and trial cookie live (`YUZU_GW_RUN_DIR`).
DEFAULT_RUN_DIR = "run"


def run_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get("YUZU_GW_RUN_DIR") or DEFAULT_RUN_DIR)


def node_registry() -> CollectorRegistry:
    """A registry per node (two nodes in one test process never share series), with the
    process (its descriptor count made cheap: gateway/node/process_collector.py), platform and
    garbage-collector collectors of prometheus-client."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def prepare(env: Mapping[str, str]) -> NodeContext:
    paths = default_paths(env)
    config, node_args = load(paths.config, paths.vm_args, env)
    # Node k of a multi-node host (YUZU_GW_NODE_INDEX, docs/multinode.md): its name and ports.
    config, node_args = apply_env(config, node_args, env)
    # Before any actor starts or any listener binds (seed: "What the gateway refuses at boot").
    check_upstream(config, env)
    return NodeContext(config, node_args, run_dir(env), node_registry())
