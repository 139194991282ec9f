"""What a simulated agent says, as pure functions: its registration, its heartbeats and
inventory reports, its answers to a command, its Guardian events and its reconnect backoff.

A stock agent answers a command on its Subscribe stream with progress and then one terminal
frame; the simulated one answers every command RUNNING, then SUCCESS with exit code 0 and an
output that echoes the plugin and action (never the parameters: they may carry secrets). It
does not honour `delay_seconds`, `stagger_seconds` or `expires_at`. A Guardian event is a
CommandResponse with plugin `__guard__` and no command id (WIRE.md), which the gateway forwards
to the server.

Backoff: the stock agent waits 2, 4, 8 ... s, at most 256 s, between attempts (seed,
"Connection drain"). A dev stack wants its agents back within seconds of a node restart, so it
doubles from `base_s` (1 s) to `cap_s` (15 s) and, unlike the stock agent (#5990), jitters each
delay down by up to 20% so a restarted node does not meet every agent in the same instant.
A refusal that says when to come back (`grpc-retry-pushback-ms`, the gateway's admission and
its other refusals: docs/agent-plane.md "Retry hints") is retried after exactly that long, as
seed 003's daemon does ("bcd and the FakeDaemon wait exactly that long"), and does not advance
the backoff (`retry_delay`).
"""

from __future__ import annotations

import hashlib
import json

import attrs

from actors.core.owner_commands import GUARDIAN_PLUGIN
from protos.yuzu.agent.v1 import agent_pb2

__all__ = [
    "AGENT_VERSION",
    "PLUGINS",
    "PUSHBACK_KEY",
    "Backoff",
    "answers",
    "guard_event",
    "heartbeat",
    "inventory",
    "millis",
    "pushback_ms",
    "register_request",
    "retry_delay",
]

AGENT_VERSION = "0.15.0-devstack"
# What a simulated agent says it runs; a command may name any plugin, the answer echoes it.
PLUGINS = ("os", "hardware", "network", "script")
Status = agent_pb2.CommandResponse.Status
PUSHBACK_KEY = "grpc-retry-pushback-ms"


def millis(now: float) -> int:
    """Wall-clock seconds to a Timestamp's milliseconds since the epoch."""
    return int(now * 1000)


def register_request(agent_id: str) -> agent_pb2.RegisterRequest:
    request = agent_pb2.RegisterRequest()
    info = request.info
    info.agent_id = agent_id
    info.hostname = f"{agent_id}.devstack.invalid"
    info.platform.os, info.platform.arch, info.platform.version = "linux", "x86_64", "6.1"
    info.agent_version = AGENT_VERSION
    for name in PLUGINS:
        info.plugins.add(name=name, version="1.0.0")
    info.scopable_tags["env"] = "devstack"
    return request


def heartbeat(session_id: str, now: float, uptime_s: float) -> agent_pb2.HeartbeatRequest:
    request = agent_pb2.HeartbeatRequest(session_id=session_id)
    request.sent_at.millis_epoch = millis(now)
    request.status_tags["uptime_s"] = str(int(uptime_s))
    return request


def inventory(
    session_id: str, agent_id: str, now: float, uptime_s: float
) -> agent_pb2.InventoryReport:
    report = agent_pb2.InventoryReport(session_id=session_id)
    report.collected_at.millis_epoch = millis(now)
    data = json.dumps(
        {"hostname": f"{agent_id}.devstack.invalid", "os": "linux", "uptime_s": int(uptime_s)},
        sort_keys=True,
    ).encode()
    report.plugin_data["os"] = data
    report.content_hashes["os"] = hashlib.sha256(data).hexdigest()
    return report


def _frame(
    command: agent_pb2.CommandRequest, status: int, output: str, now: float
) -> agent_pb2.CommandResponse:
    frame = agent_pb2.CommandResponse(
        command_id=command.command_id,
        status=status,  # type: ignore[arg-type]
        output=output,
        plugin=command.plugin,
        action=command.action,
    )
    frame.sent_at.millis_epoch = millis(now)
    return frame


def answers(
    command: agent_pb2.CommandRequest, agent_id: str, now: float
) -> tuple[agent_pb2.CommandResponse, agent_pb2.CommandResponse]:
    """The two frames a command gets: RUNNING, then SUCCESS with exit code 0."""
    what = f"{command.plugin} {command.action}"
    running = _frame(command, Status.RUNNING, f"{agent_id}: running {what}", now)
    done = _frame(command, Status.SUCCESS, f"{agent_id}: {what} done", now)
    done.exit_code = 0
    return running, done


def guard_event(agent_id: str, sequence: int, now: float) -> agent_pb2.CommandResponse:
    """An unsolicited Guardian event (no command id), numbered `sequence` for this agent."""
    body = {"event": "policy_check", "agent": agent_id, "sequence": sequence, "compliant": True}
    frame = agent_pb2.CommandResponse(
        status=Status.SUCCESS,
        plugin=GUARDIAN_PLUGIN,
        action="event",
        output=json.dumps(body, sort_keys=True),
    )
    frame.sent_at.millis_epoch = millis(now)
    return frame


@attrs.frozen
class Backoff:
    """Delay before reconnect attempt `attempt` (0 for the first retry): `base_s` doubled per
    attempt up to `cap_s`, then cut by up to `jitter` of itself (`draw` in [0, 1))."""

    base_s: float = 1.0
    cap_s: float = 15.0
    jitter: float = 0.2

    def delay(self, attempt: int, draw: float) -> float:
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(attempt, 32))
        return ceiling * (1.0 - self.jitter * draw)


def pushback_ms(metadata: object) -> int | None:
    """The `grpc-retry-pushback-ms` of a refusal's trailing metadata (pairs of key and value),
    or None when absent or not a whole number."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == PUSHBACK_KEY and isinstance(value, str) and value.isdigit():
            return int(value)
    return None


def retry_delay(hint_ms: int | None, backoff: Backoff, attempt: int, draw: float) -> float:
    """Seconds before the next attempt: exactly the refusal's hint when it gave one, else the
    backoff's delay for `attempt`."""
    if hint_ms is not None:
        return hint_ms / 1000.0
    return backoff.delay(attempt, draw)
