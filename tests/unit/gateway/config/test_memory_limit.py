"""The memory limit: host MemTotal and every cgroup limit from the gateway's own cgroup up to the
mount root, v2 and v1, read from fake /proc and /sys/fs/cgroup trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.memory_limit import V1_UNLIMITED, MemoryLimit, read_memory_limit

GIB = 1024**3
HOST_KB = 16 * 1024 * 1024  # 16 GiB


class Tree:
    """A fake /proc and /sys/fs/cgroup under tmp_path."""

    def __init__(self, root: Path, *, meminfo_kb: int | None = HOST_KB) -> None:
        self.proc = root / "proc"
        self.cgroup = root / "cgroup"
        (self.proc / "self").mkdir(parents=True)
        self.cgroup.mkdir()
        if meminfo_kb is not None:
            (self.proc / "meminfo").write_text(
                f"MemTotal:       {meminfo_kb} kB\nMemFree:        1000 kB\n"
            )

    def own(self, *lines: str) -> None:
        (self.proc / "self" / "cgroup").write_text("\n".join(lines) + "\n")

    def limit(self, relative: str, name: str, value: str) -> Path:
        directory = self.cgroup / relative if relative else self.cgroup
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / name
        path.write_text(value + "\n")
        return path

    def read(self, platform: str = "linux") -> tuple[MemoryLimit | None, list[str]]:
        limit, lines = read_memory_limit(self.proc, self.cgroup, platform)
        return limit, [line.text for line in lines]


def test_host_memory_alone(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    assert tree.read() == (MemoryLimit(16 * GIB, "host"), [])


def test_v2_own_cgroup_below_the_host_wins(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.own("0::/system.slice/yuzu.service")
    tree.limit("system.slice/yuzu.service", "memory.max", str(2 * GIB))
    assert tree.read() == (MemoryLimit(2 * GIB, "cgroup_v2"), [])


def test_v2_max_means_no_limit(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.own("0::/system.slice/yuzu.service")
    tree.limit("system.slice/yuzu.service", "memory.max", "max")
    tree.limit("system.slice", "memory.max", "max")
    assert tree.read() == (MemoryLimit(16 * GIB, "host"), [])


def test_v2_a_parent_slice_smaller_than_the_unit_wins(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.own("0::/kubepods.slice/pod1/container")
    tree.limit("kubepods.slice/pod1/container", "memory.max", "max")
    tree.limit("kubepods.slice/pod1", "memory.max", str(3 * GIB))
    tree.limit("kubepods.slice", "memory.max", str(8 * GIB))
    assert tree.read() == (MemoryLimit(3 * GIB, "cgroup_v2"), [])


def test_v2_namespace_root_holds_the_container_limit(tmp_path: Path) -> None:
    # With a cgroup namespace the container sees `0::/` and its limit at the mount root.
    tree = Tree(tmp_path)
    tree.own("0::/")
    tree.limit("", "memory.max", str(512 * 1024 * 1024))
    assert tree.read() == (MemoryLimit(512 * 1024 * 1024, "cgroup_v2"), [])


def test_v2_memory_high_is_not_read(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.own("0::/app")
    tree.limit("app", "memory.high", str(GIB))
    assert tree.read() == (MemoryLimit(16 * GIB, "host"), [])


def test_v1_memory_controller_and_parents(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.own("12:cpu,cpuacct:/docker/abc", "4:memory:/docker/abc", "1:name=systemd:/docker/abc")
    tree.limit("memory/docker/abc", "memory.limit_in_bytes", str(V1_UNLIMITED))
    tree.limit("memory/docker", "memory.limit_in_bytes", str(4 * GIB))
    tree.limit("memory", "memory.limit_in_bytes", "9223372036854771712")
    assert tree.read() == (MemoryLimit(4 * GIB, "cgroup_v1"), [])


def test_v1_just_below_two_to_the_62_is_a_limit(tmp_path: Path) -> None:
    tree = Tree(tmp_path, meminfo_kb=None)
    tree.own("4:memory:/")
    tree.limit("memory", "memory.limit_in_bytes", str(V1_UNLIMITED - 1))
    assert tree.read() == (MemoryLimit(V1_UNLIMITED - 1, "cgroup_v1"), [])


def test_v1_path_outside_the_mount_namespace_falls_back_to_the_mount_root(
    tmp_path: Path,
) -> None:
    # Docker without a cgroup namespace: /proc/self/cgroup names the host's path, but the
    # container's own cgroup is mounted at the root.
    tree = Tree(tmp_path)
    tree.own("4:memory:/docker/0123456789")
    tree.limit("memory", "memory.limit_in_bytes", str(GIB))
    assert tree.read() == (MemoryLimit(GIB, "cgroup_v1"), [])


def test_hybrid_v1_and_v2_the_smallest_wins(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.own("4:memory:/svc", "0::/svc")
    tree.limit("memory/svc", "memory.limit_in_bytes", str(6 * GIB))
    tree.limit("svc", "memory.max", str(5 * GIB))
    assert tree.read() == (MemoryLimit(5 * GIB, "cgroup_v2"), [])


def test_dot_dot_never_climbs_above_the_mount(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.own("0::/../../outside")
    (tmp_path / "memory.max").write_text(str(GIB))  # beside the mount: must not be read
    assert tree.read() == (MemoryLimit(16 * GIB, "host"), [])


@pytest.mark.parametrize("content", ["lots", "", "-5", "12.5"])
def test_an_unparsable_cgroup_file_is_warned_and_skipped(tmp_path: Path, content: str) -> None:
    tree = Tree(tmp_path)
    tree.own("0::/app")
    path = tree.limit("app", "memory.max", content)
    limit, lines = tree.read()
    assert limit == MemoryLimit(16 * GIB, "host")
    assert len(lines) == 1
    assert str(path) in lines[0] and "holds no byte count; skipped" in lines[0]


def test_an_unreadable_cgroup_file_is_warned_and_skipped(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.own("0::/app")
    (tree.cgroup / "app" / "memory.max").mkdir(parents=True)  # reading a directory fails
    limit, lines = tree.read()
    assert limit == MemoryLimit(16 * GIB, "host")
    assert len(lines) == 1 and "cannot be read (IsADirectoryError)" in lines[0]


def test_no_limit_anywhere_is_none(tmp_path: Path) -> None:
    tree = Tree(tmp_path, meminfo_kb=None)
    assert tree.read() == (None, [])


def test_meminfo_without_memtotal_is_warned(tmp_path: Path) -> None:
    tree = Tree(tmp_path, meminfo_kb=None)
    (tree.proc / "meminfo").write_text("MemFree: 5 kB\n")
    limit, lines = tree.read()
    assert limit is None
    assert len(lines) == 1 and "has no MemTotal in kB" in lines[0]


def test_macos_reads_physical_memory_without_proc(tmp_path: Path) -> None:
    tree = Tree(tmp_path, meminfo_kb=None)
    limit, _ = tree.read(platform="darwin")
    assert limit is not None and limit.source == "host" and limit.limit_bytes > 0
    assert tree.read(platform="linux")[0] is None


def test_the_real_node_reads_some_limit() -> None:
    # On the Linux hosts the gateway ships for there is always at least /proc/meminfo.
    limit, _ = read_memory_limit()
    assert limit is not None and limit.limit_bytes > 0
