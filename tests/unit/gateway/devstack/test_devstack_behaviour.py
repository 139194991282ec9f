"""What a simulated agent says (gateway/devstack/behaviour.py): pure, so checked directly."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from actors.core.owner_commands import is_guardian_event
from gateway.devstack.behaviour import (
    PLUGINS,
    Backoff,
    answers,
    guard_event,
    heartbeat,
    inventory,
    register_request,
)
from protos.yuzu.agent.v1 import agent_pb2

Status = agent_pb2.CommandResponse.Status
NOW = 1_800_000_000.25


def test_a_command_is_answered_running_then_success_echoing_plugin_and_action() -> None:
    command = agent_pb2.CommandRequest(
        command_id="cmd-1", plugin="script", action="run", parameters={"token": "s3cr3t"}
    )
    running, done = answers(command, "agent-7", NOW)
    assert [running.status, done.status] == [Status.RUNNING, Status.SUCCESS]
    for frame in (running, done):
        assert (frame.command_id, frame.plugin, frame.action) == ("cmd-1", "script", "run")
        assert frame.sent_at.millis_epoch == 1_800_000_000_250
        # The output names what ran, never a parameter value (they may be secrets).
        assert "s3cr3t" not in frame.output
    assert done.exit_code == 0
    assert "script run" in done.output and "agent-7" in done.output
    # Neither frame is mistaken for a Guardian event by the gateway.
    assert not is_guardian_event(done.plugin, done.command_id)


def test_a_guard_event_is_what_the_gateway_forwards_as_a_guardian_event() -> None:
    frame = guard_event("agent-7", 3, NOW)
    assert is_guardian_event(frame.plugin, frame.command_id)
    assert json.loads(frame.output)["sequence"] == 3


def test_registration_heartbeat_and_inventory_carry_the_agent_and_session() -> None:
    request = register_request("agent-7")
    assert request.info.agent_id == "agent-7"
    assert [p.name for p in request.info.plugins] == list(PLUGINS)
    beat = heartbeat("gw-session-1", NOW, 12.9)
    assert beat.session_id == "gw-session-1" and beat.status_tags["uptime_s"] == "12"
    report = inventory("gw-session-1", "agent-7", NOW, 5.0)
    assert report.session_id == "gw-session-1"
    assert json.loads(report.plugin_data["os"])["hostname"].startswith("agent-7.")
    assert len(report.content_hashes["os"]) == 64


@given(
    attempt=st.integers(min_value=0, max_value=10_000),
    draw=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    base=st.floats(min_value=0.01, max_value=5.0),
    cap=st.floats(min_value=5.0, max_value=300.0),
)
def test_backoff_doubles_to_its_cap_and_jitters_down_only(
    attempt: int, draw: float, base: float, cap: float
) -> None:
    backoff = Backoff(base_s=base, cap_s=cap, jitter=0.2)
    ceiling = min(cap, base * 2.0 ** min(attempt, 32))
    delay = backoff.delay(attempt, draw)
    assert 0.8 * ceiling - 1e-9 <= delay <= ceiling
    # Never shorter than the attempt before's shortest: a retry storm cannot speed up.
    if attempt > 0:
        assert delay >= 0.8 * min(cap, base * 2.0 ** min(attempt - 1, 32)) - 1e-9


def test_the_default_backoff_is_quick_for_a_dev_stack() -> None:
    backoff = Backoff()
    assert backoff.delay(0, 0.0) == 1.0
    assert [backoff.delay(n, 0.0) for n in range(1, 6)] == [2.0, 4.0, 8.0, 15.0, 15.0]
