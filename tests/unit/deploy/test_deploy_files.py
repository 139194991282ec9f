"""The deployment files against the shipped configuration: the ports they open and probe are
the ones the config binds, and every stop timeout leaves the planned stop's flush budget room
to finish (the manual, "Stop timeout coupling"; docs/install.md).

Read through the gateway's own loader, so a port or budget changed in sys_config/ without the
files (or the other way round) fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from actors.core.shedder_marks import resolve_marks
from gateway.config import load
from gateway.config.cluster_seeds import DEFAULT_CLUSTER_PORT
from gateway.config.config import Config
from gateway.config.keys.listeners import GRPC_LISTENERS
from gateway.config.keys.node import HEALTH_PORT, PROMETHEUS_PORT, SHUTDOWN_FLUSH_BUDGET_MS
from gateway.config.keys.shedder import MEMORY_SHEDDING

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
# After the budget: the listeners close, the actors stop, /metrics answers last
# (tests/unit/gateway/node/test_stop_timeout_coupling.py).
ROOM_TO_STOP_S = 10
# The issue's floor for Kubernetes' terminationGracePeriodSeconds.
K8S_GRACE_FLOOR_S = 45
UNIT_STOP_S = 40

K8S_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _config(name: str) -> Config:
    config, _ = load(
        ROOT / "sys_config" / name, ROOT / "sys_config" / "vm.args", {"YUZU_GW_COOKIE": "c" * 64}
    )
    return config


@pytest.fixture(scope="module")
def prod() -> Config:
    return _config("sys.config.prod")


def _ports(config: Config) -> dict[str, int]:
    ports = {spec.name: spec.port for spec in config[GRPC_LISTENERS]}
    return {
        **ports,
        "health": config[HEALTH_PORT],
        "metrics": config[PROMETHEUS_PORT],
        "cluster": DEFAULT_CLUSTER_PORT,
    }


def _budget_s(config: Config) -> float:
    return config[SHUTDOWN_FLUSH_BUDGET_MS] / 1000


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _deployment() -> dict[str, Any]:
    [deployment] = [
        d for d in _documents(DEPLOY / "kubernetes" / "gateway.yaml") if d["kind"] == "Deployment"
    ]
    return deployment


def _bytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([KMGT]i)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * K8S_UNITS[unit]


def test_the_shipped_configs_agree_on_ports_and_budget(prod: Config) -> None:
    dev = _config("sys.config")
    assert _ports(dev) == _ports(prod)
    assert _budget_s(dev) == _budget_s(prod)


def test_kubernetes_ports_probes_and_grace(prod: Config) -> None:
    pod = _deployment()["spec"]["template"]["spec"]
    [container] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == _ports(prod)
    named = {"health": ports["health"]}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert named.get(get["port"], get["port"]) == prod[HEALTH_PORT]

    pause = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep"
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= K8S_GRACE_FLOOR_S
    assert grace >= int(pause[1]) + _budget_s(prod) + ROOM_TO_STOP_S

    services = [
        d for d in _documents(DEPLOY / "kubernetes" / "gateway.yaml") if d["kind"] == "Service"
    ]
    for service in services:
        for port in service["spec"]["ports"]:
            assert port["port"] == ports[port["targetPort"]]


def test_kubernetes_memory_limit_fits_the_shedder(prod: Config) -> None:
    [container] = _deployment()["spec"]["template"]["spec"]["containers"]
    resources = container["resources"]
    # requests = limits: the cgroup limit the shedder reads is the memory the pod is given.
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    limit = _bytes(resources["limits"]["memory"])
    shedding = prod[MEMORY_SHEDDING]
    assert shedding.enabled
    marks = resolve_marks(shedding.marks, limit, "cgroup_v2")
    assert marks is not None
    assert marks.low.bytes < marks.high.bytes < limit
    # The runtime needs its baseline below the low mark, or the node sheds at idle.
    assert marks.low.bytes >= 2**30


def test_dockerfile_user_signal_ports_and_healthcheck(prod: Config) -> None:
    text = (ROOT / "Dockerfile").read_text()
    ports = _ports(prod)
    [exposed] = re.findall(r"^EXPOSE (.+)$", text, re.MULTILINE)
    assert {int(p) for p in exposed.split()} == {
        ports["agent"],
        ports["mgmt"],
        ports["health"],
        ports["metrics"],
    }
    assert re.findall(r"^STOPSIGNAL (\S+)$", text, re.MULTILINE) == ["SIGTERM"]
    users = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    [health] = re.findall(r"^HEALTHCHECK .*\n?.*$", text, re.MULTILINE)
    assert f"127.0.0.1:{ports['health']}/healthz" in health
    [stop] = re.findall(r'stop-timeout-seconds="(\d+)"', text)
    assert int(stop) >= _budget_s(prod) + ROOM_TO_STOP_S


def test_compose_stop_grace_and_ports(prod: Config) -> None:
    [compose] = _documents(DEPLOY / "docker" / "compose.yaml")
    gateway = compose["services"]["gateway"]
    grace = int(re.fullmatch(r"(\d+)s", gateway["stop_grace_period"]).group(1))  # type: ignore[union-attr]
    assert grace >= _budget_s(prod) + ROOM_TO_STOP_S
    published = {int(p.split(":")[1]) for p in gateway["ports"]}
    ports = _ports(prod)
    # The management port is for the server's replicas only (docs/tls.md): never published.
    assert ports["mgmt"] not in published
    assert published == {ports["agent"], ports["health"], ports["metrics"]}


@pytest.mark.parametrize("unit", ["yuzu-gateway.service", "yuzu-gateway@.service"])
def test_systemd_units_notify_and_stop_timeout(unit: str, prod: Config) -> None:
    text = (ROOT / "rel" / unit).read_text()

    def values(key: str) -> list[str]:
        return re.findall(rf"^{key}=(.*)$", text, re.MULTILINE)

    assert values("Type") == ["notify"]
    assert values("NotifyAccess") == ["main"]
    assert values("KillSignal") == ["SIGTERM"]
    [stop] = values("TimeoutStopSec")
    assert int(stop) == UNIT_STOP_S
    assert int(stop) >= _budget_s(prod) + ROOM_TO_STOP_S
    [watchdog] = values("WatchdogSec")
    assert int(watchdog) > 0
    if unit.endswith("@.service"):
        assert "YUZU_GW_NODE_INDEX=%i" in values("Environment")
        assert "YUZU_GW_REUSEPORT=1" in values("Environment")
