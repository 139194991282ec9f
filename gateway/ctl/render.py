"""What `yuzu-gw-ctl` prints (pure): tables and lines for people, and with `--json` one JSON
object per line, whose keys are listed in docs/ctl.md.

It reads the typed management API (betterproto2 classes, `protos.typed`): an unset message
field is `None` there, and is read as the empty message, as the wire means it.

The session id an `AgentConnected` event carries is never printed: it is the agent's
credential for its heartbeats, and the gateway keeps session ids out of its logs too.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import betterproto2

from protos.typed.yuzu.agent.v1 import CommandResponse, CommandResponseStatus
from protos.typed.yuzu.common.v1 import ErrorDetail, Platform, PluginInfo, Timestamp
from protos.typed.yuzu.server.v1 import (
    AgentEvent,
    AgentSummary,
    GetAgentResponse,
    SendCommandResponse,
)

__all__ = [
    "AGENT_COLUMNS",
    "SendProgress",
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
    "status_of",
    "summary_object",
    "summary_row",
    "table",
    "tally",
    "timestamp",
]

Status = CommandResponseStatus
AGENT_COLUMNS = ("AGENT ID", "HOSTNAME", "PLATFORM", "VERSION", "LAST SEEN")
PLUGIN_COLUMNS = ("PLUGIN", "VERSION", "CAPABILITIES", "DESCRIPTION")
# Streamed answers cannot be measured first: the agent column is this wide, or the id's width.
AGENT_WIDTH = 20
STATUS_WIDTH = 8


def as_json(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def timestamp(stamp: Timestamp | None) -> str:
    """ISO 8601 UTC to the second, or "" when the field is unset."""
    if stamp is None or not stamp.millis_epoch:
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


def _millis(stamp: Timestamp | None) -> int:
    return stamp.millis_epoch if stamp is not None else 0


def _platform(platform: Platform | None) -> str:
    if platform is None:
        return ""
    text = "/".join(part for part in (platform.os, platform.arch) if part)
    return f"{text} {platform.version}".strip() if platform.version else text


def summary_row(agent: AgentSummary) -> tuple[str, ...]:
    return (
        agent.agent_id,
        agent.hostname or "-",
        _platform(agent.platform) or "-",
        agent.agent_version or "-",
        timestamp(agent.last_seen) or "-",
    )


def summary_object(agent: AgentSummary) -> dict[str, Any]:
    platform = agent.platform or Platform()
    return {
        "agent_id": agent.agent_id,
        "hostname": agent.hostname,
        "platform": {
            "os": platform.os,
            "arch": platform.arch,
            "version": platform.version,
        },
        "agent_version": agent.agent_version,
        "online": agent.online,
        "last_seen_ms": _millis(agent.last_seen),
    }


def _plugin_object(plugin: PluginInfo) -> dict[str, Any]:
    return {
        "name": plugin.name,
        "version": plugin.version,
        "description": plugin.description,
        "capabilities": list(plugin.capabilities),
    }


def plugin_rows(plugins: Iterable[PluginInfo]) -> list[tuple[str, ...]]:
    return [
        (p.name, p.version or "-", ", ".join(p.capabilities) or "-", p.description or "-")
        for p in plugins
    ]


def agent_details(answer: GetAgentResponse) -> list[str]:
    """`agents get` for people: the summary as fields, then the plugins as a table."""
    agent = answer.summary or AgentSummary()
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


def details_object(answer: GetAgentResponse) -> dict[str, Any]:
    return {
        **summary_object(answer.summary or AgentSummary()),
        "plugins": [_plugin_object(p) for p in answer.plugins],
    }


# -- command answers ---------------------------------------------------------------------------


def status_name(status: int) -> str:
    # betterproto2 decodes a status newer than these classes as a member with no name.
    return Status(status).name or str(int(status))


def is_final(response: CommandResponse | None) -> bool:
    return response is not None and response.status != Status.RUNNING


def _response(answer: SendCommandResponse) -> CommandResponse:
    return answer.response or CommandResponse()


def status_of(answer: SendCommandResponse) -> CommandResponseStatus:
    return _response(answer).status


def answer_line(answer: SendCommandResponse) -> str:
    """`AGENT  STATUS  OUTPUT`, plus the exit code when not 0 and the error when there is one;
    the lines of a multi-line output continue under the output column."""
    response = _response(answer)
    error = response.error or ErrorDetail()
    lead = f"{answer.agent_id:<{AGENT_WIDTH}}  {status_name(response.status):<{STATUS_WIDTH}}  "
    notes = []
    if response.exit_code:
        notes.append(f"(exit {response.exit_code})")
    if error.code or error.message:
        notes.append(f"[error {error.code}: {error.message}]".replace(" :", ":"))
    text = " ".join([response.output.rstrip("\n"), *notes]).strip()
    return lead + text.replace("\n", "\n" + " " * len(lead))


def answer_object(answer: SendCommandResponse) -> dict[str, Any]:
    response = _response(answer)
    error = response.error or ErrorDetail()
    obj: dict[str, Any] = {
        "agent_id": answer.agent_id,
        "command_id": response.command_id,
        "status": status_name(response.status),
        "final": is_final(response),
        "exit_code": response.exit_code,
        "output": response.output,
    }
    if error.code or error.message or error.metadata:
        obj["error"] = {
            "code": error.code,
            "message": error.message,
            "metadata": dict(error.metadata),
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


@attrs.define
class SendProgress:
    """The live one-line summary of a send to many targets: each target counts once, by its
    latest answer (a RUNNING frame, then its final one)."""

    _running: set[str] = attrs.field(factory=set)
    _finals: collections.Counter[str] = attrs.field(factory=collections.Counter)

    def add(self, agent_id: str, status: int) -> None:
        if status == Status.RUNNING:
            self._running.add(agent_id)
            return
        self._running.discard(agent_id)
        self._finals[status_name(status)] += 1

    @property
    def finals(self) -> Mapping[str, int]:
        """The final answers by status name, for `tally`."""
        return self._finals

    def line(self) -> str:
        answered = self._finals["SUCCESS"]
        timed_out = self._finals["TIMEOUT"]
        failed = sum(self._finals.values()) - answered - timed_out
        return (
            f"answered {answered}, running {len(self._running)}, failed {failed},"
            f" timed out {timed_out}"
        )


# -- events ------------------------------------------------------------------------------------


def _event(event: AgentEvent) -> tuple[str, dict[str, Any]]:
    """The event's name and its own fields (never the session id: module doc)."""
    kind, _ = betterproto2.which_one_of(event, "event")
    if event.disconnected is not None:
        return kind, {"reason": event.disconnected.reason}
    if event.plugin_loaded is not None:
        return kind, {"plugin": _plugin_object(event.plugin_loaded.plugin or PluginInfo())}
    return kind or "unknown", {}


def event_line(event: AgentEvent) -> str:
    kind, fields = _event(event)
    when = timestamp(event.occurred_at) or "-"
    what = kind
    if "reason" in fields:
        what = f"{kind} ({fields['reason'] or 'no reason'})"
    elif "plugin" in fields:
        what = f"{kind} {fields['plugin']['name']} {fields['plugin']['version']}".rstrip()
    return f"{when:<20}  {event.agent_id:<{AGENT_WIDTH}}  {what}"


def event_object(event: AgentEvent) -> dict[str, Any]:
    kind, fields = _event(event)
    return {
        "agent_id": event.agent_id,
        "event": kind,
        "occurred_at_ms": _millis(event.occurred_at),
        **fields,
    }
