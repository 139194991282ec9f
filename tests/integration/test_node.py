"""A real node on loopback: the tree's first children, the health and metrics endpoints,
boot refusals and the planned stop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.config.refusal import BootRefused
from gateway.http.server import MAX_CONNECTIONS, REQUEST_TIMEOUT_S
from supervisors.api import which_children
from tests.support.node import ROOT, TEST_CONFIG, http_get, node_env, running_node

pytestmark = pytest.mark.integration


def port_of(node, name: str) -> int:
    return node.ctx.bound[name][1]


def test_endpoints_answer_and_start_first(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as node:
            health, metrics = port_of(node, "health"), port_of(node, "metrics")
            assert await http_get(health, "/healthz") == (200, b"ok\n")
            status, body = await http_get(health, "/readyz")
            assert status == 200
            assert json.loads(body)["status"] == "ready"
            status, body = await http_get(metrics, "/metrics")
            assert status == 200
            assert b"process_resident_memory_bytes" in body
            assert (await http_get(health, "/nope"))[0] == 404
            children = await which_children(node.runtime, node.root)
            # Metrics and health are up before everything else and stopped last.
            assert [c.id for c in children[:2]] == ["metrics", "health"]
            assert node.pid_file.read_text().strip() == str(os.getpid())
        assert not node.pid_file.exists()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", health), timeout=1).close()

    asyncio.run(main())


def test_readyz_names_the_failing_check(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as node:
            healthy = {"ok": True}
            node.ctx.readiness.register("lab_check", lambda: healthy["ok"])
            port = port_of(node, "health")
            assert (await http_get(port, "/readyz"))[0] == 200
            healthy["ok"] = False
            status, body = await http_get(port, "/readyz")
            assert status == 503
            answer = json.loads(body)
            assert answer["status"] == "not_ready"
            assert answer["failing"] == ["lab_check"]
            assert answer["checks"]["lab_check"] is False

    asyncio.run(main())


def test_a_silent_client_does_not_hold_up_probes(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as node:
            port = port_of(node, "health")
            silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            assert (await http_get(port, "/healthz", timeout=1.0))[0] == 200
            # The silent ones are closed after the request timeout.
            reader, writer = silent[0]
            assert await asyncio.wait_for(reader.read(), REQUEST_TIMEOUT_S + 2) == b""
            for _, w in silent:
                w.close()
            del writer

    asyncio.run(main())


def test_at_most_64_connections_are_served_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as node:
            port = port_of(node, "health")
            held = [
                await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_CONNECTIONS)
            ]
            await asyncio.sleep(0.2)
            # Every slot is taken by a silent client: the next request waits in the backlog.
            with pytest.raises(TimeoutError):
                await http_get(port, "/healthz", timeout=0.5)
            # Once the silent ones time out, slots free and requests are answered again.
            assert (await http_get(port, "/healthz", timeout=REQUEST_TIMEOUT_S + 3))[0] == 200
            for _, writer in held:
                writer.close()

    asyncio.run(main())


def test_a_port_in_use_refuses_the_start(tmp_path: Path) -> None:
    blocker = socket.socket()
    blocker.bind(("0.0.0.0", 0))
    blocker.listen()
    config = tmp_path / "busy.config"
    config.write_text(
        TEST_CONFIG.read_text().replace(
            "{health_port, 0}", f"{{health_port, {blocker.getsockname()[1]}}}"
        )
    )

    async def main() -> None:
        with pytest.raises(BootRefused) as refused:
            async with running_node(tmp_path, YUZU_GW_CONFIG=str(config)):
                pass
        assert refused.value.defect == "start_failed"
        assert "failed_to_start_child health" in refused.value.detail

    try:
        asyncio.run(main())
    finally:
        blocker.close()


def _boot(env: dict[str, str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway"],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_boot_refusals_exit_1_with_one_critical_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.config"
    bad.write_text("[{yuzu_gw, [{health_port, 0}, {helth_port, 1}]}].")
    result = _boot(node_env(tmp_path, config=bad))
    assert result.returncode == 1
    critical = [line for line in result.stderr.splitlines() if "CRITICAL" in line]
    assert len(critical) == 1
    assert "unknown_keys" in critical[0]
    assert "helth_port" in critical[0]

    broken = tmp_path / "broken.config"
    broken.write_text("[{yuzu_gw, [{health_port, 0}\n  {prometheus_port, 0}]}].")
    result = _boot(node_env(tmp_path, config=broken))
    assert result.returncode == 1
    assert f"{broken}:2:" in result.stderr

    env = node_env(tmp_path)
    del env["YUZU_GW_COOKIE"]
    result = _boot({**env, "YUZU_GW_COOKIE": ""})
    assert result.returncode == 1
    assert "default_cookie" in result.stderr


def test_sigterm_is_a_planned_stop(tmp_path: Path) -> None:
    env = {**os.environ, **node_env(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway"],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid_file = tmp_path / "yuzu_gw.pid"
        deadline = time.monotonic() + 20
        while not pid_file.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        log = proc.stderr.read() if proc.stderr else ""
        assert "planned stop requested" in log
        assert "crashed" not in log
        assert not pid_file.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_readyz_turns_red_when_agent_sup_is_gone(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as node:
            port = port_of(node, "health")
            status, body = await http_get(port, "/readyz")
            assert status == 200
            assert json.loads(body)["checks"]["agent_sup"] is True
            runtime = node.runtime
            # The kill is synchronous and the root's restart needs a scheduler turn, so the
            # checks read right after it see agent_sup gone.
            runtime.kill(runtime.whereis("agent_sup"))
            assert node.ctx.readiness.evaluate()["agent_sup"] is False
            for _ in range(200):
                if runtime.whereis("agent_sup") is not None:
                    break
                await asyncio.sleep(0.01)
            status, body = await http_get(port, "/readyz")
            assert status == 200

    asyncio.run(main())
