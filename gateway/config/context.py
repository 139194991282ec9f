"""What every actor of a node may need from the node: its configuration, its metric
registry, its readiness checks and where it writes its run files. Passed down the tree
as `init` arguments, so two nodes in one test process never share state."""

from __future__ import annotations

from pathlib import Path

import attrs
from prometheus_client import CollectorRegistry

from actors.node.api import Readiness
from gateway.config import Config
from gateway.config.vm_args import NodeArgs


@attrs.frozen
class NodeContext:
    config: Config
    node: NodeArgs
    run_dir: Path
    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry)
    readiness: Readiness = attrs.field(factory=Readiness)
    # name -> (host, port) actually bound, filled in by the endpoints as they start.
    bound: dict[str, tuple[str, int]] = attrs.field(factory=dict)

    def record_bound(self, name: str, address: tuple[str, int]) -> None:
        self.bound[name] = address
