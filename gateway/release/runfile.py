"""`<run_dir>/nodes.json`: the release supervisor's record of its nodes.

Written by the supervisor when it starts and at every change of a node (atomically: a reader
never sees half a file), removed when it exits. `rel/yuzu_gw` and `python -m gateway.release`
read it to find node K (`ping --node K`) and to stop the release. Its presence with a live
supervisor is what "a multi-node release runs in this run directory" means; each node's own
files (`<short>.pid`, `<short>.console`, `<short>.log`) sit beside it, named by node.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import attrs

from gateway.console.paths import alive

RELEASE_FILE = "nodes.json"
# The supervisor's own output under `rel/yuzu_gw start --nodes N`.
RELEASE_LOG = "release.log"
# The supervisor's command line names its module; `stop` signals nothing else (a reused pid).
SUPERVISOR_MARK = b"gateway.release"


class NodeState:
    RUNNING = "running"  # its process was started (it may still be booting)
    RESTARTING = "restarting"  # ended; waiting for its backoff
    STOPPED = "stopped"  # ended with exit 0 (a planned stop) and left stopped
    REFUSED = "boot refused"  # ended with exit 1 and left stopped
    STOPPING = "stopping"  # the release's planned stop is under way


# States in which a node will not come back by itself.
ENDED = frozenset({NodeState.STOPPED, NodeState.REFUSED})


@attrs.frozen
class NodeRecord:
    index: int
    name: str
    short_name: str
    health_port: int
    prometheus_port: int
    cluster_port: int
    state: str
    pid: int | None = None
    restarts: int = 0


@attrs.frozen
class ReleaseRecord:
    supervisor_pid: int
    nodes: tuple[NodeRecord, ...]

    def node(self, index: int) -> NodeRecord:
        return self.nodes[index - 1]


def path(run_dir: Path) -> Path:
    return run_dir / RELEASE_FILE


def write(run_dir: Path, record: ReleaseRecord) -> None:
    target = path(run_dir)
    temporary = target.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(attrs.asdict(record), indent=1) + "\n")
    os.replace(temporary, target)


def read(run_dir: Path) -> ReleaseRecord | None:
    """The record, or None when there is none (or it cannot be read)."""
    try:
        raw: dict[str, Any] = json.loads(path(run_dir).read_text())
        nodes = tuple(NodeRecord(**node) for node in raw["nodes"])
        return ReleaseRecord(supervisor_pid=int(raw["supervisor_pid"]), nodes=nodes)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove(run_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path(run_dir).unlink()


def supervisor_alive(record: ReleaseRecord) -> bool:
    """The recorded supervisor still runs (and the pid was not reused by another program)."""
    pid = record.supervisor_pid
    if not alive(pid):
        return False
    try:
        return SUPERVISOR_MARK in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (not Linux): trust the record


def running(run_dir: Path) -> ReleaseRecord | None:
    """The record of the release running in `run_dir`, None when none runs."""
    record = read(run_dir)
    return record if record is not None and supervisor_alive(record) else None
