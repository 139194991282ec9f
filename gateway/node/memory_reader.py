"""The node's memory as /proc/self/status gives it: what the memory shedder samples (its anonymous
resident memory, `RssAnon`), what mem_reclaim logs around a pass, and the `rss` and `rss_anon`
kinds of the node gauges (actors/node/metrics.py). The actors get these readers in their Args
(gateway/node/children/): only gateway/ reads files.

The Erlang gateway samples `erlang:memory(total)`, the memory its VM has allocated, and the seed
gives the reasons ("Node-wide memory load shedding"): it is what agent connections cost and what
shedding them relieves, and it does not move with the page cache (the cgroup's memory.current
does, so log writes alone could trip it). The Python measure with those properties is `RssAnon`
from `/proc/self/status`: the resident pages of the heap and of every anonymous mapping
(pymalloc's arenas, malloc's heaps and mmaps, OpenSSL's buffers, thread stacks).

- It leaves out file-backed pages (the interpreter's code, shared libraries, the page cache),
  which the kernel drops before it kills anything.
- Unlike `erlang:memory(total)` it includes what the allocators hold free but have not given
  back, so it sits nearer the cgroup's working set than the VM figure did; the default 0.75
  mark leaves the rest of the limit for kernel socket buffers and the page cache.
- It does not fall when Python frees memory, and neither does any other reading for garbage
  in reference cycles, which stays allocated until a full collection (measured, issue 21 §2:
  50,000 cyclic connection objects held 309 MiB of RssAnon after they were dropped, 66 MiB after
  `gc.collect()`, 6 MiB after `malloc_trim(0)`). So mem_reclaim runs those two while the node
  sheds (actors/memory/reclaim.py), and this reading falls back with memory in use.
- `tracemalloc` would see only Python objects (not OpenSSL's or grpc's C heaps), slows every
  allocation and doubled RssAnon in that measurement; `sys.getallocatedblocks()` counts
  pymalloc's blocks, not bytes, and `mallinfo2` only malloc's, glibc only.
- Cost: one read of a ~1.5 KB procfs file per sample, tens of microseconds.

Off Linux there is no `/proc/self/status`: `rss_anon_bytes` answers None and the shedder runs
inactive (`memory_sample_unavailable`).

`READER` is the reader the shedder actor is given when the tree starts. Tests that run a node
in-process replace it with `monkeypatch.setattr(memory_reader, "READER", fake)` before the node
starts; nothing else writes it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

from actors.node.metrics import RSS, RSS_ANON

__all__ = [
    "READER",
    "STATUS_PATH",
    "Reader",
    "process_memory",
    "rss_anon_bytes",
    "rss_anon_kb",
]

STATUS_PATH = Path("/proc/self/status")
# The /proc/self/status fields read, and the node gauges' kind for each.
_FIELDS: Final = {"VmRSS:": RSS, "RssAnon:": RSS_ANON}

# Bytes of memory in use now, or None when it cannot be read.
Reader = Callable[[], "int | None"]


def _status_kb(status_path: Path) -> dict[str, int]:
    """The fields of `_FIELDS` found, in kB (the kernel's unit); {} without the file."""
    try:
        text = status_path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return {}
    found: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0] in _FIELDS and fields[1].isdecimal():
            found[fields[0]] = int(fields[1])
    return found


def rss_anon_kb(status_path: Path = STATUS_PATH) -> int | None:
    """`RssAnon` in kB, or None off Linux or before kernel 4.5."""
    return _status_kb(status_path).get("RssAnon:")


def process_memory(status_path: Path = STATUS_PATH) -> dict[str, int]:
    """`rss` and `rss_anon` in bytes from one read of /proc/self/status; {} off Linux."""
    return {_FIELDS[field]: kb * 1024 for field, kb in _status_kb(status_path).items()}


def rss_anon_bytes(status_path: Path = STATUS_PATH) -> int | None:
    kb = rss_anon_kb(status_path)
    return None if kb is None else kb * 1024


READER: Reader = rss_anon_bytes
