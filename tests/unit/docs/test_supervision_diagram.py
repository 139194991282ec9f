"""The supervision tree drawn in docs/supervision.md is the tree a node runs: the root's
children, in start order, are the diagram's `gateway_sup --> <id>` edges in order."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from supervisors.api import which_children
from tests.support.node import running_node

ROOT = Path(__file__).resolve().parents[3]
EDGE = re.compile(r"^\s+gateway_sup --> (\w+)", re.MULTILINE)


def _diagram() -> list[str]:
    text = (ROOT / "docs" / "supervision.md").read_text()
    [block] = re.findall(r"```mermaid\n(.*?)```", text, re.DOTALL)
    return EDGE.findall(block)


def test_the_diagram_is_the_running_tree(tmp_path: Path) -> None:
    async def children() -> list[str]:
        async with running_node(tmp_path) as node:
            assert node.runtime is not None and node.root is not None
            return [child.id for child in await which_children(node.runtime, node.root)]

    assert _diagram() == asyncio.run(asyncio.wait_for(children(), 60))
