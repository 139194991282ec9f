"""The files a node keeps in its run directory, named in one place for the node's console
actor and the `yuzu-gw` client (which must not import the node to find them).

`rel/yuzu_gw` (bash) uses the same names; docs/release.md lists them. The pid file's name is
`Node.pid_file`'s; tests/integration/test_console.py holds the two together.

The node's name lives in one place, the configuration (vm.args `-name`, or `node_name` in the
config file); the node names its files by its short name. A client finds that name without
being told, in this order: `--name`, YUZU_GW_NODE_NAME, the one pid file in the run
directory (what is actually running), the configuration as the node would read it, and
last the shipped default.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import attrs

from gateway.config import default_paths, load_config, parse_vm_args
from gateway.config.keys.node import NODE_NAME

DEFAULT_RUN_DIR = "./run"
# The shipped vm.args' `-name yuzu_gw@127.0.0.1`, for when nothing else can be read.
DEFAULT_NODE_NAME = "yuzu_gw"
COOKIE_FILE = "cookie"
PID_SUFFIX = ".pid"


def short_name(full_name: str) -> str:
    return full_name.split("@", 1)[0]


def configured_short_name(env: Mapping[str, str]) -> str | None:
    """The short name the node will take from its configuration, or None if that cannot be
    read (the node itself then refuses to boot and says why; a client need not)."""
    paths = default_paths(env)
    previous = logging.root.manager.disable
    # The config loader logs what it ignores; that is boot's output, not the client's.
    logging.disable(logging.CRITICAL)
    try:
        configured = load_config(paths.config, env)[NODE_NAME]
        return short_name(configured or parse_vm_args(paths.vm_args, env).name)
    except Exception:
        return None
    finally:
        logging.disable(previous)


def alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie answers kill(0) until reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive, and not ours to signal
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True  # no /proc (not Linux): kill(0) is all there is
    return fields[0] != "Z"


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _running_name(run_dir: Path) -> str | None:
    """The short name of the one live node whose pid file is in `run_dir`, if exactly one."""
    live = []
    for path in run_dir.glob(f"*{PID_SUFFIX}"):
        pid = read_pid(path)
        if pid is not None and alive(pid):
            live.append(path.name.removesuffix(PID_SUFFIX))
    return live[0] if len(live) == 1 else None


def resolve_name(env: Mapping[str, str], run_dir: Path, name: str | None = None) -> str:
    return (
        name
        or env.get("YUZU_GW_NODE_NAME")
        or _running_name(run_dir)
        or configured_short_name(env)
        or DEFAULT_NODE_NAME
    )


@attrs.frozen
class RunFiles:
    run_dir: Path
    short_name: str

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], run_dir: str | None = None, name: str | None = None
    ) -> RunFiles:
        directory = Path(run_dir or env.get("YUZU_GW_RUN_DIR") or DEFAULT_RUN_DIR).absolute()
        return cls(directory, resolve_name(env, directory, name))

    @property
    def pid(self) -> Path:
        return self.run_dir / f"{self.short_name}{PID_SUFFIX}"

    @property
    def console(self) -> Path:
        return self.run_dir / f"{self.short_name}.console"

    @property
    def log(self) -> Path:
        return self.run_dir / f"{self.short_name}.log"

    @property
    def cookie(self) -> Path:
        # Beside the pid file, shared by the nodes of one run directory (a cluster shares
        # one cookie).
        return self.run_dir / COOKIE_FILE
