"""What `yuzu-gw-ctl` prints (pure): tables and lines for people, and with `--json` one JSON
object per line, whose keys are listed in docs/ctl.md.

The session id an `AgentConnected` event carries is never printed: it is the agent's
credential for its heartbeats, and the gateway keeps session ids out of its logs too.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.common.v1 import common_pb2
from protos.yuzu.server.v1 import management_pb2

__all__ = [
    "AGENT_COLUMNS",
    "agent_details",
    "answer_line",
    "answer_object",
    "as_json",
    "details_object",
    "event_line",
    "event_object",
    "is_final",
    "plugin_rows",
    "status_name",
    "summary_object",
    "summary_row",
    "table",
    "tally",
    "timestamp",
]

Status = agent_pb2.CommandResponse.Status
AGENT_COLUMNS = ("AGENT ID", "HOSTNAME", "PLATFORM", "VERSION", "LAST SEEN")
PLUGIN_COLUMNS = ("PLUGIN", "VERSION", "CAPABILITIES", "DESCRIPTION")
# Streamed answers cannot be measured first: the agent column is this wide, or the id's width.
AGENT_WIDTH = 20
STATUS_WIDTH = 8


def as_json(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def timestamp(stamp: common_pb2.Timestamp) -> str:
    """ISO 8601 UTC to the second, or "" when the field is unset."""
    if not stamp.millis_epoch:
        return ""
    when = dt.datetime.fromtimestamp(stamp.millis_epoch / 1000, tz=dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def table(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart; the last column is not padded."""
    body = [list(columns), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in body) for i in range(len(columns) - 1)]
    return [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
        for row in body
    ]


# -- agents ------------------------------------------------------------------------------------


def _platform(platform: common_pb2.Platform) -> str:
    text = "/".join(part for part in (platform.os, platform.arch) if part)
    return f"{text} {platform.version}".strip() if platform.version else text


def summary_row(agent: management_pb2.AgentSummary) -> tuple[str, ...]:
    return (
        agent.agent_id,
        agent.hostname or "-",
        _platform(agent.platform) or "-",
        agent.agent_version or "-",
        timestamp(agent.last_seen) or "-",
    )


def summary_object(agent: management_pb2.AgentSummary) -> dict[str, Any]:
    return {
        "agent_id": agent.agent_id,
        "hostname": agent.hostname,
        "platform": {
            "os": agent.platform.os,
            "arch": agent.platform.arch,
            "version": agent.platform.version,
        },
        "agent_version": agent.agent_version,
        "online": agent.online,
        "last_seen_ms": agent.last_seen.millis_epoch,
    }


def _plugin_object(plugin: common_pb2.PluginInfo) -> dict[str, Any]:
    return {
        "name": plugin.name,
        "version": plugin.version,
        "description": plugin.description,
        "capabilities": list(plugin.capabilities),
    }


def plugin_rows(plugins: Iterable[common_pb2.PluginInfo]) -> list[tuple[str, ...]]:
    return [
        (p.name, p.version or "-", ", ".join(p.capabilities) or "-", p.description or "-")
        for p in plugins
    ]


def agent_details(answer: management_pb2.GetAgentResponse) -> list[str]:
    """`agents get` for people: the summary as fields, then the plugins as a table."""
    agent = answer.summary
    fields = [
        ("agent id", agent.agent_id),
        ("hostname", agent.hostname or "-"),
        ("platform", _platform(agent.platform) or "-"),
        ("agent version", agent.agent_version or "-"),
        ("online", "yes" if agent.online else "no"),
        ("last seen", timestamp(agent.last_seen) or "-"),
    ]
    lines = [f"{name:<14} {value}" for name, value in fields]
    if answer.plugins:
        lines += ["", *table(PLUGIN_COLUMNS, plugin_rows(answer.plugins))]
    else:
        lines.append(f"{'plugins':<14} none")
    return lines


def details_object(answer: management_pb2.GetAgentResponse) -> dict[str, Any]:
    return {
        **summary_object(answer.summary),
        "plugins": [_plugin_object(p) for p in answer.plugins],
    }


# -- command answers ---------------------------------------------------------------------------


def status_name(status: int) -> str:
    try:
        return Status.Name(status)
    except ValueError:
        return str(status)  # a status newer than these stubs


def is_final(response: agent_pb2.CommandResponse) -> bool:
    return response.status != Status.RUNNING


def answer_line(answer: management_pb2.SendCommandResponse) -> str:
    """`AGENT  STATUS  OUTPUT`, plus the exit code when not 0 and the error when there is one;
    the lines of a multi-line output continue under the output column."""
    response = answer.response
    lead = f"{answer.agent_id:<{AGENT_WIDTH}}  {status_name(response.status):<{STATUS_WIDTH}}  "
    notes = []
    if response.exit_code:
        notes.append(f"(exit {response.exit_code})")
    if response.error.code or response.error.message:
        notes.append(f"[error {response.error.code}: {response.error.message}]".replace(" :", ":"))
    text = " ".join([response.output.rstrip("\n"), *notes]).strip()
    return lead + text.replace("\n", "\n" + " " * len(lead))


def answer_object(answer: management_pb2.SendCommandResponse) -> dict[str, Any]:
    response = answer.response
    obj: dict[str, Any] = {
        "agent_id": answer.agent_id,
        "command_id": response.command_id,
        "status": status_name(response.status),
        "final": is_final(response),
        "exit_code": response.exit_code,
        "output": response.output,
    }
    if response.error.code or response.error.message or response.error.metadata:
        obj["error"] = {
            "code": response.error.code,
            "message": response.error.message,
            "metadata": dict(response.error.metadata),
        }
    if response.payload:
        obj["payload_base64"] = base64.b64encode(response.payload).decode("ascii")
    return obj


def tally(finals: Mapping[str, int]) -> str:
    """The summary of a send: `-- 20 targets: 18 SUCCESS, 2 FAILURE`."""
    total = sum(finals.values())
    if not total:
        return "-- no answer: no target (the gateway holds no agent?)"
    counts = ", ".join(f"{n} {status}" for status, n in sorted(finals.items()))
    return f"-- {total} target{'s' if total != 1 else ''}: {counts}"


# -- events ------------------------------------------------------------------------------------


def _event(event: management_pb2.AgentEvent) -> tuple[str, dict[str, Any]]:
    """The event's name and its own fields (never the session id: module doc)."""
    kind = event.WhichOneof("event") or "unknown"
    if kind == "disconnected":
        return kind, {"reason": event.disconnected.reason}
    if kind == "plugin_loaded":
        return kind, {"plugin": _plugin_object(event.plugin_loaded.plugin)}
    return kind, {}


def event_line(event: management_pb2.AgentEvent) -> str:
    kind, fields = _event(event)
    when = timestamp(event.occurred_at) or "-"
    what = kind
    if "reason" in fields:
        what = f"{kind} ({fields['reason'] or 'no reason'})"
    elif "plugin" in fields:
        what = f"{kind} {fields['plugin']['name']} {fields['plugin']['version']}".rstrip()
    return f"{when:<20}  {event.agent_id:<{AGENT_WIDTH}}  {what}"


def event_object(event: management_pb2.AgentEvent) -> dict[str, Any]:
    kind, fields = _event(event)
    return {
        "agent_id": event.agent_id,
        "event": kind,
        "occurred_at_ms": event.occurred_at.millis_epoch,
        **fields,
    }
