"""What yuzu-gw-ctl prints (gateway/ctl/render.py): tables, answer and event lines, and the
--json objects scripts read."""

from __future__ import annotations

import json

from gateway.ctl import render
from protos.typed.yuzu.agent.v1 import CommandResponse
from protos.typed.yuzu.agent.v1 import CommandResponseStatus as S
from protos.typed.yuzu.common.v1 import ErrorDetail, Platform, PluginInfo, Timestamp
from protos.typed.yuzu.server.v1 import (
    AgentConnected,
    AgentDisconnected,
    AgentEvent,
    AgentPluginLoaded,
    AgentSummary,
    GetAgentResponse,
    SendCommandResponse,
)

# 2026-01-02T03:04:05.678Z
MILLIS = 1767323045678


def summary(agent_id: str = "agent-1") -> AgentSummary:
    return AgentSummary(
        agent_id=agent_id,
        hostname="host-1",
        agent_version="1.2.3",
        online=True,
        platform=Platform(os="linux", arch="x86_64", version="6.1"),
        last_seen=Timestamp(millis_epoch=MILLIS),
    )


def answer(status: S, output: str = "done", **fields: object) -> SendCommandResponse:
    # Through the wire, as the CLI receives it: an unset field arrives unset (None).
    response = CommandResponse(command_id="c1", status=status, output=output, **fields)  # type: ignore[arg-type]
    return SendCommandResponse.parse(
        bytes(SendCommandResponse(agent_id="agent-1", response=response))
    )


def test_table_aligns_columns_and_leaves_the_last_unpadded() -> None:
    assert render.table(("A", "BB", "C"), [("xxx", "y", "z"), ("x", "yyyy", "")]) == [
        "A    BB    C",
        "xxx  y     z",
        "x    yyyy  ",
    ]


def test_agent_rows_and_objects() -> None:
    agent = summary()
    assert render.summary_row(agent) == (
        "agent-1",
        "host-1",
        "linux/x86_64 6.1",
        "1.2.3",
        "2026-01-02T03:04:05Z",
    )
    bare = AgentSummary(agent_id="agent-2")
    assert render.summary_row(bare) == ("agent-2", "-", "-", "-", "-")
    obj = json.loads(render.as_json(render.summary_object(agent)))
    assert obj == {
        "agent_id": "agent-1",
        "hostname": "host-1",
        "platform": {"os": "linux", "arch": "x86_64", "version": "6.1"},
        "agent_version": "1.2.3",
        "online": True,
        "last_seen_ms": MILLIS,
    }


def test_agent_details_list_the_plugins() -> None:
    plugin = PluginInfo(name="os", version="1.0", capabilities=["info", "reboot"])
    got = GetAgentResponse(summary=summary(), plugins=[plugin])
    lines = render.agent_details(got)
    assert lines[0] == "agent id       agent-1"
    assert "online         yes" in lines
    assert lines[-2].split() == ["PLUGIN", "VERSION", "CAPABILITIES", "DESCRIPTION"]
    assert lines[-1].split() == ["os", "1.0", "info,", "reboot", "-"]
    assert render.details_object(got)["plugins"] == [
        {"name": "os", "version": "1.0", "description": "", "capabilities": ["info", "reboot"]}
    ]
    alone = render.agent_details(GetAgentResponse(summary=summary()))
    assert alone[-1] == "plugins        none"


def test_answer_lines_carry_agent_status_and_output() -> None:
    line = render.answer_line(answer(S.SUCCESS, "all good"))
    assert line.split(maxsplit=2) == ["agent-1", "SUCCESS", "all good"]
    failed = render.answer_line(
        answer(S.FAILURE, "boom", exit_code=3, error=ErrorDetail(code="E1", message="x"))
    )
    assert failed.endswith("boom (exit 3) [error E1: x]")
    # A multi-line output continues under the output column.
    first, second = render.answer_line(answer(S.RUNNING, "one\ntwo\n")).split("\n")
    assert first.endswith("one") and second.strip() == "two"
    assert second.index("two") == first.index("one")
    assert render.status_name(99) == "99"  # a status newer than the stubs


def test_answer_objects() -> None:
    obj = json.loads(render.as_json(render.answer_object(answer(S.RUNNING, "half"))))
    assert obj == {
        "agent_id": "agent-1",
        "command_id": "c1",
        "status": "RUNNING",
        "final": False,
        "exit_code": 0,
        "output": "half",
    }
    full = render.answer_object(answer(S.FAILURE, payload=b"\x00\x01", error=ErrorDetail(code="E")))
    assert full["final"] is True and full["payload_base64"] == "AAE="
    assert full["error"] == {"code": "E", "message": "", "metadata": {}}


def test_tally() -> None:
    assert render.tally({"SUCCESS": 20}) == "-- 20 targets: 20 SUCCESS"
    assert render.tally({"TIMEOUT": 1, "FAILURE": 2}) == "-- 3 targets: 2 FAILURE, 1 TIMEOUT"
    assert render.tally({"SUCCESS": 1}) == "-- 1 target: 1 SUCCESS"
    assert render.tally({}).startswith("-- no answer")


def test_events_never_show_the_session_id() -> None:
    connected = AgentEvent(
        agent_id="agent-1",
        occurred_at=Timestamp(millis_epoch=MILLIS),
        connected=AgentConnected(session_id="secret-session"),
    )
    line = render.event_line(connected)
    assert line.split() == ["2026-01-02T03:04:05Z", "agent-1", "connected"]
    obj = render.event_object(connected)
    assert obj == {"agent_id": "agent-1", "event": "connected", "occurred_at_ms": MILLIS}
    assert "secret-session" not in line + render.as_json(obj)

    gone = AgentEvent(agent_id="agent-1", disconnected=AgentDisconnected(reason="stream_closed"))
    assert render.event_line(gone).endswith("disconnected (stream_closed)")
    assert render.event_object(gone)["reason"] == "stream_closed"
    loaded = AgentEvent(
        agent_id="agent-1",
        plugin_loaded=AgentPluginLoaded(plugin=PluginInfo(name="os", version="2")),
    )
    assert render.event_line(loaded).endswith("plugin_loaded os 2")
