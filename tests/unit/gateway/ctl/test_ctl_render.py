"""What yuzu-gw-ctl prints (gateway/ctl/render.py): tables, answer and event lines, and the
--json objects scripts read."""

from __future__ import annotations

import json

from gateway.ctl import render
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.common.v1 import common_pb2
from protos.yuzu.server.v1 import management_pb2

S = agent_pb2.CommandResponse.Status
# 2026-01-02T03:04:05.678Z
MILLIS = 1767323045678


def summary(agent_id: str = "agent-1", **fields: object) -> management_pb2.AgentSummary:
    agent = management_pb2.AgentSummary(
        agent_id=agent_id,
        hostname="host-1",
        agent_version="1.2.3",
        online=True,
        platform=common_pb2.Platform(os="linux", arch="x86_64", version="6.1"),
        last_seen=common_pb2.Timestamp(millis_epoch=MILLIS),
    )
    for name, value in fields.items():
        setattr(agent, name, value)
    return agent


def answer(
    status: int, output: str = "done", **fields: object
) -> management_pb2.SendCommandResponse:
    response = agent_pb2.CommandResponse(command_id="c1", status=status, output=output)
    for name, value in fields.items():
        if name == "error":
            response.error.CopyFrom(value)  # type: ignore[arg-type]
        else:
            setattr(response, name, value)
    return management_pb2.SendCommandResponse(agent_id="agent-1", response=response)


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
    bare = management_pb2.AgentSummary(agent_id="agent-2")
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
    plugin = common_pb2.PluginInfo(name="os", version="1.0", capabilities=["info", "reboot"])
    got = management_pb2.GetAgentResponse(summary=summary(), plugins=[plugin])
    lines = render.agent_details(got)
    assert lines[0] == "agent id       agent-1"
    assert "online         yes" in lines
    assert lines[-2].split() == ["PLUGIN", "VERSION", "CAPABILITIES", "DESCRIPTION"]
    assert lines[-1].split() == ["os", "1.0", "info,", "reboot", "-"]
    assert render.details_object(got)["plugins"] == [
        {"name": "os", "version": "1.0", "description": "", "capabilities": ["info", "reboot"]}
    ]
    alone = render.agent_details(management_pb2.GetAgentResponse(summary=summary()))
    assert alone[-1] == "plugins        none"


def test_answer_lines_carry_agent_status_and_output() -> None:
    line = render.answer_line(answer(S.SUCCESS, "all good"))
    assert line.split(maxsplit=2) == ["agent-1", "SUCCESS", "all good"]
    failed = render.answer_line(
        answer(S.FAILURE, "boom", exit_code=3, error=common_pb2.ErrorDetail(code="E1", message="x"))
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
    full = render.answer_object(
        answer(S.FAILURE, payload=b"\x00\x01", error=common_pb2.ErrorDetail(code="E"))
    )
    assert full["final"] is True and full["payload_base64"] == "AAE="
    assert full["error"] == {"code": "E", "message": "", "metadata": {}}


def test_tally() -> None:
    assert render.tally({"SUCCESS": 20}) == "-- 20 targets: 20 SUCCESS"
    assert render.tally({"TIMEOUT": 1, "FAILURE": 2}) == "-- 3 targets: 2 FAILURE, 1 TIMEOUT"
    assert render.tally({"SUCCESS": 1}) == "-- 1 target: 1 SUCCESS"
    assert render.tally({}).startswith("-- no answer")


def test_events_never_show_the_session_id() -> None:
    connected = management_pb2.AgentEvent(
        agent_id="agent-1",
        occurred_at=common_pb2.Timestamp(millis_epoch=MILLIS),
        connected=management_pb2.AgentConnected(session_id="secret-session"),
    )
    line = render.event_line(connected)
    assert line.split() == ["2026-01-02T03:04:05Z", "agent-1", "connected"]
    obj = render.event_object(connected)
    assert obj == {"agent_id": "agent-1", "event": "connected", "occurred_at_ms": MILLIS}
    assert "secret-session" not in line + render.as_json(obj)

    gone = management_pb2.AgentEvent(
        agent_id="agent-1", disconnected=management_pb2.AgentDisconnected(reason="stream_closed")
    )
    assert render.event_line(gone).endswith("disconnected (stream_closed)")
    assert render.event_object(gone)["reason"] == "stream_closed"
    loaded = management_pb2.AgentEvent(
        agent_id="agent-1",
        plugin_loaded=management_pb2.AgentPluginLoaded(
            plugin=common_pb2.PluginInfo(name="os", version="2")
        ),
    )
    assert render.event_line(loaded).endswith("plugin_loaded os 2")
