"""The release supervisor's shell (gateway/release/supervisor.py) against fake nodes: small
shell scripts standing in for `python -m gateway`, each behaving as its FAKE_MODE_<index>
says. Real nodes are in tests/integration/test_multinode.py."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from gateway.console.paths import alive
from gateway.release import runfile
from gateway.release.plan import NodePlan
from gateway.release.restart_policy import RestartPolicy
from gateway.release.supervisor import (
    EXIT_FAILED,
    EXIT_GAVE_UP,
    EXIT_STOPPED,
    EXIT_UNCLEAN,
    Logs,
    ReleaseSupervisor,
)

pytestmark = pytest.mark.timeout(60)

# serve: run until SIGTERM, then exit 0 (a planned stop); refuse: exit 1 at once (a refused
# boot); crash: exit 2 at once; stubborn: ignore SIGTERM.
FAKE_NODE = """#!/bin/bash
mode_var=FAKE_MODE_$YUZU_GW_NODE_INDEX
echo "fake node $YUZU_GW_NODE_INDEX pid $$ reuseport=$YUZU_GW_REUSEPORT args=$*"
case ${!mode_var:-serve} in
    serve) trap 'exit 0' TERM ;;
    refuse) exit 1 ;;
    crash) exit 2 ;;
    stubborn) trap '' TERM ;;
esac
while :; do sleep 0.02; done
"""


def plans(count: int) -> tuple[NodePlan, ...]:
    return tuple(
        NodePlan(k, f"gw-{k}@127.0.0.1", 8080 + k, 9560 + k, 9100 + k) for k in range(1, count + 1)
    )


def supervisor(tmp_path: Path, count: int, **modes: str) -> ReleaseSupervisor:
    fake = tmp_path / "fake_node"
    fake.write_text(FAKE_NODE)
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], **{f"FAKE_MODE_{k}": v for k, v in modes.items()}}
    return ReleaseSupervisor(
        plans(count),
        env,
        tmp_path,
        logs=Logs.FILES,
        stop_timeout_s=1.0,
        policy=RestartPolicy(intensity=3, backoff_first_s=0.01, backoff_cap_s=0.05),
        python=str(fake),
    )


async def until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def record(tmp_path: Path) -> runfile.ReleaseRecord:
    found = runfile.read(tmp_path)
    assert found is not None
    return found


def state_of(tmp_path: Path, index: int) -> str | None:
    found = runfile.read(tmp_path)
    return None if found is None else found.node(index).state


def running_pids(tmp_path: Path) -> list[int]:
    found = runfile.read(tmp_path)
    if found is None:
        return []
    return [n.pid for n in found.nodes if n.pid is not None and n.state == "running"]


def logged_pids(tmp_path: Path, short_name: str) -> list[int]:
    text = (tmp_path / f"{short_name}.log").read_text()
    return [int(pid) for pid in re.findall(r"^fake node \d+ pid (\d+)", text, re.MULTILINE)]


def run_with(
    sup: ReleaseSupervisor, scenario: Callable[[asyncio.Task[int]], Awaitable[None]]
) -> int:
    async def body() -> int:
        task = asyncio.get_running_loop().create_task(sup.run())
        await scenario(task)
        return await asyncio.wait_for(task, 10)

    return asyncio.run(body())


def test_a_killed_node_is_restarted_and_a_planned_stop_ends_all(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, 2)
    seen: list[int] = []

    async def scenario(_task: asyncio.Task[int]) -> None:
        await until(lambda: len(running_pids(tmp_path)) == 2, "two nodes")
        first = record(tmp_path)
        assert first.supervisor_pid == os.getpid()
        assert [(n.name, n.health_port, n.cluster_port) for n in first.nodes] == [
            ("gw-1@127.0.0.1", 8081, 9101),
            ("gw-2@127.0.0.1", 8082, 9102),
        ]
        victim = first.node(2).pid
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        await until(
            lambda: (
                record(tmp_path).node(2).pid not in (None, victim)
                and record(tmp_path).node(2).state == "running"
            ),
            "node 2 restarted",
        )
        assert record(tmp_path).node(2).restarts == 1
        assert record(tmp_path).node(1).pid == first.node(1).pid  # untouched
        seen.extend(running_pids(tmp_path))
        sup.request_stop()

    assert run_with(sup, scenario) == EXIT_STOPPED
    assert not any(alive(pid) for pid in seen)
    assert runfile.read(tmp_path) is None  # the record goes with the supervisor
    log = (tmp_path / "gw-2.log").read_text()
    # Each start is marked; the node got its index and the shared-port switch.
    assert log.count("--- start ") == 2
    assert re.search(r"^fake node 2 pid \d+ reuseport=1 args=-m gateway$", log, re.MULTILINE)


def test_a_refused_boot_is_not_restarted_and_the_others_keep_running(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, 2, **{"2": "refuse"})

    async def scenario(task: asyncio.Task[int]) -> None:
        await until(lambda: state_of(tmp_path, 2) == "boot refused", "node 2 left")
        await asyncio.sleep(0.2)
        assert record(tmp_path).node(2).restarts == 0
        assert record(tmp_path).node(1).state == "running" and not task.done()
        pid = record(tmp_path).node(1).pid
        assert pid is not None
        # The last node stopping on its own (exit 0) ends the supervisor.
        os.kill(pid, signal.SIGTERM)

    assert run_with(sup, scenario) == EXIT_FAILED


def test_restart_intensity_gives_up_and_stops_the_others(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, 2, **{"1": "crash"})

    async def scenario(_task: asyncio.Task[int]) -> None:
        pass

    assert run_with(sup, scenario) == EXIT_GAVE_UP
    # Started, then 3 restarts (the intensity); the 4th exit gave up.
    assert len(logged_pids(tmp_path, "gw-1")) == 4
    [survivor] = logged_pids(tmp_path, "gw-2")
    assert not alive(survivor)


def test_a_node_that_ignores_sigterm_is_killed_at_the_stop_timeout(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, 2, **{"2": "stubborn"})
    seen: list[int] = []

    async def scenario(_task: asyncio.Task[int]) -> None:
        await until(lambda: len(running_pids(tmp_path)) == 2, "two nodes")
        await asyncio.sleep(0.1)  # the stubborn one has set its trap
        seen.extend(running_pids(tmp_path))
        sup.request_stop()

    assert run_with(sup, scenario) == EXIT_UNCLEAN
    assert not any(alive(pid) for pid in seen)
