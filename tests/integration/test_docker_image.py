"""The top-level Dockerfile builds, and the image says what the deployment files rely on: a
non-root user, SIGTERM as its stop signal, a health check, and a node that answers its
`--version`. Skipped at once where docker is missing or its daemon does not answer (CI);
the build is bounded by BUILD_TIMEOUT_S."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# `docker info` against an absent daemon fails in well under a second; a hung socket must not
# hold the suite.
PROBE_TIMEOUT_S = 5
BUILD_TIMEOUT_S = 600
RUN_TIMEOUT_S = 60


def _docker_or_skip() -> str:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed")
    try:
        probe = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("the docker daemon does not answer")
    if probe.returncode != 0:
        pytest.skip("the docker daemon is unreachable")
    return docker


@pytest.mark.timeout(BUILD_TIMEOUT_S + 2 * RUN_TIMEOUT_S)
def test_the_image_builds_and_runs_as_documented() -> None:
    docker = _docker_or_skip()
    tag = f"yuzu-gateway-test:{uuid.uuid4().hex[:12]}"
    subprocess.run(
        [docker, "build", "-q", "-t", tag, str(ROOT)], check=True, timeout=BUILD_TIMEOUT_S
    )
    try:
        [info] = json.loads(
            subprocess.run(
                [docker, "image", "inspect", tag],
                capture_output=True,
                check=True,
                timeout=RUN_TIMEOUT_S,
            ).stdout
        )
        config = info["Config"]
        assert config["User"] not in ("", "root", "0")
        assert config["StopSignal"] == "SIGTERM"
        assert "/healthz" in " ".join(config["Healthcheck"]["Test"])
        run = subprocess.run(
            [
                docker,
                "run",
                "--rm",
                "--entrypoint",
                ".venv/bin/python",
                tag,
                "-m",
                "gateway",
                "--version",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=RUN_TIMEOUT_S,
        )
        assert run.stdout.startswith("python -m gateway ")
        listed = subprocess.run(
            [docker, "run", "--rm", tag, "help"],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert listed.returncode == 0
        assert "foreground" in listed.stdout
    finally:
        subprocess.run([docker, "image", "rm", "-f", tag], capture_output=True, check=False)
