"""The memory limit the shedder's fractions apply to, read once at start.

Seed, "Node-wide memory load shedding" (SPEC_INDEX MS-05): the smaller of the host's memory and
every cgroup memory limit from the gateway's own cgroup up to the root of the cgroup mount, so a
container's limit (docker run --memory, a Kubernetes limit) and a systemd MemoryMax= on the unit
or its slice are all seen.

- host: MemTotal in `/proc/meminfo`; on macOS the physical memory (`hw.memsize`, read through
  `sysconf`), since there is no /proc;
- cgroup v2: `memory.max` (`max` means no limit), in the directory `/proc/self/cgroup` names on
  its `0::` line and in each parent up to and including the mount root;
- cgroup v1: `memory.limit_in_bytes` under the `memory` controller's mount, likewise; a value of
  2^62 or more means no limit (the kernel's "unlimited" is a page-rounded LONG_MAX);
- `memory.high` is a throttling threshold, not a kill, and is not read.

A cgroup file that exists but cannot be read or parsed is skipped with a WARNING (the host's
memory may then be too high a limit; the docs say to set byte marks). A file that does not exist
is skipped silently: a path from /proc/self/cgroup outside this mount namespace (cgroup v1
without a cgroup namespace) simply has no file, and the mount root still has the container's.

The roots are parameters so tests build fake /proc and /sys/fs/cgroup trees. Nothing here logs:
the caller logs the returned lines.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path, PurePosixPath
from typing import Literal

import attrs

from actors.core import LogLine

__all__ = [
    "CGROUP_ROOT",
    "PROC_ROOT",
    "V1_UNLIMITED",
    "LimitSource",
    "MemoryLimit",
    "read_memory_limit",
]

PROC_ROOT = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Seed, "Node-wide memory load shedding": a v1 limit of 2^62 or more means no limit.
V1_UNLIMITED = 2**62
V2_FILE = "memory.max"
V1_FILE = "memory.limit_in_bytes"
V1_CONTROLLER = "memory"

LimitSource = Literal["cgroup_v2", "cgroup_v1", "host"]


@attrs.frozen
class MemoryLimit:
    """`limit_bytes` and where it came from, as the shedder's start-up line names it."""

    limit_bytes: int
    source: LimitSource


def read_memory_limit(
    proc_root: Path = PROC_ROOT,
    cgroup_root: Path = CGROUP_ROOT,
    platform: str = sys.platform,
) -> tuple[MemoryLimit | None, list[LogLine]]:
    """The smallest limit found (None when none can be read) and the warnings to log."""
    warnings: list[LogLine] = []
    found: list[MemoryLimit] = []
    host = _host_memory(proc_root, platform, warnings)
    if host is not None:
        found.append(MemoryLimit(host, "host"))
    for controller_path, version in _own_cgroups(proc_root, warnings):
        if version == "cgroup_v2":
            mount, name = cgroup_root, V2_FILE
        else:
            mount, name = cgroup_root / V1_CONTROLLER, V1_FILE
        for directory in _self_and_parents(mount, controller_path):
            limit = _cgroup_limit(directory / name, version, warnings)
            if limit is not None:
                found.append(MemoryLimit(limit, version))
    if not found:
        return None, warnings
    return min(found, key=lambda m: m.limit_bytes), warnings


def _warning(path: Path, problem: str) -> LogLine:
    return LogLine(
        "warning",
        f"gateway memory shedding: {path} {problem}; skipped (set high_water_bytes and"
        " low_water_bytes below the memory limit if it was the container's limit)",
    )


def _read(path: Path, warnings: list[LogLine]) -> str | None:
    try:
        return path.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        warnings.append(_warning(path, f"cannot be read ({type(exc).__name__})"))
        return None


def _host_memory(proc_root: Path, platform: str, warnings: list[LogLine]) -> int | None:
    text = _read(proc_root / "meminfo", warnings)
    if text is not None:
        for line in text.splitlines():
            name, _, rest = line.partition(":")
            if name == "MemTotal":
                fields = rest.split()
                if len(fields) == 2 and fields[0].isdecimal() and fields[1] == "kB":
                    return int(fields[0]) * 1024
        warnings.append(_warning(proc_root / "meminfo", "has no MemTotal in kB"))
        return None
    if platform == "darwin":
        return _sysconf_memory()
    return None


def _sysconf_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def _own_cgroups(
    proc_root: Path, warnings: list[LogLine]
) -> list[tuple[PurePosixPath, LimitSource]]:
    """The v2 path (`0::/path`) and the v1 memory controller's path, from /proc/self/cgroup."""
    text = _read(proc_root / "self" / "cgroup", warnings)
    if text is None:
        return []
    paths: list[tuple[PurePosixPath, LimitSource]] = []
    for line in text.splitlines():
        hierarchy, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep and sep2 and path.startswith("/")):
            continue
        if hierarchy == "0" and controllers == "":
            paths.append((PurePosixPath(path), "cgroup_v2"))
        elif V1_CONTROLLER in controllers.split(","):
            paths.append((PurePosixPath(path), "cgroup_v1"))
    return paths


def _self_and_parents(mount: Path, cgroup_path: PurePosixPath) -> list[Path]:
    """`mount/<cgroup_path>`, each parent, and `mount` itself; `..` never climbs above it."""
    parts = [p for p in cgroup_path.parts[1:] if p not in ("", ".", "..")]
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _cgroup_limit(path: Path, version: LimitSource, warnings: list[LogLine]) -> int | None:
    text = _read(path, warnings)
    if text is None:
        return None
    value = text.strip()
    if version == "cgroup_v2" and value == "max":
        return None
    if not value.isdecimal():
        warnings.append(_warning(path, "holds no byte count"))
        return None
    limit = int(value)
    if version == "cgroup_v1" and limit >= V1_UNLIMITED:
        return None
    return limit
