"""agent_sup's stop (a planned stop's step 3; seed: "Planned stop"): every owner ends through its
own `terminate` and sends its session's DISCONNECTED, however long the fleet takes to stop on one
loop, and an owner whose notify step faults still sends it (nothing restarts an owner during the
stop). The tree is the one of test_agent_owner.py: the real registry, a recording `upstream`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from actors.agents.api import AGENT_SUP_NAME, StreamEnd, StreamHandle, owner_row
from actors.core.notify_store import Event
from actors.core.owner_lifecycle import STOPPING_DETAILS
from supervisors.api import terminate_child
from supervisors.supervisor import DEFAULT_WORKER_SHUTDOWN_S
from tests.supervision.test_agent_owner import UNAVAILABLE, drain, tree
from tests.support.actors import Harness, actor_test

# Owners whose stream ends cost the loop this long each (a loaded node's Subscribe trailers):
# together they outlast OTP's bound on one worker's stop, which a single owner never comes near.
OWNERS = 60
END_COST_S = DEFAULT_WORKER_SHUTDOWN_S * 1.2 / OWNERS


class SlowStream(StreamHandle):
    def close(self, end: StreamEnd) -> None:
        time.sleep(END_COST_S)
        super().close(end)


@actor_test(timeout=30.0)
async def test_a_fleet_that_stops_slower_than_one_owners_bound_sends_every_disconnected(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="supervisors.supervisor")
    t = tree(h)
    streams = [
        (await t.owner(f"s{i}", f"c{i}", f"agent-{i}", stream=SlowStream()))[1]
        for i in range(OWNERS)
    ]
    caplog.clear()
    await terminate_child(h.base, t.root, AGENT_SUP_NAME, timeout=DEFAULT_WORKER_SHUTDOWN_S * 3)
    await h.settle()
    # No owner was killed for waiting its turn: each one's terminate ran.
    assert not [r.getMessage() for r in caplog.records if "did not stop" in r.getMessage()]
    sessions = sorted(n.session_id for n in t.notes(Event.DISCONNECTED))
    assert sessions == sorted(f"s{i}" for i in range(OWNERS))
    assert all(stream.ended for stream in streams)


@actor_test
async def test_an_owner_whose_notify_step_faults_during_the_stop_still_sends_its_disconnected(
    h: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    t = tree(h)
    await t.owner("s1", "c1", "agent-1")
    faulty, stream = await t.owner("s2", "c2", "agent-2")
    home = h.instance(faulty).stream_home_id

    real_publish = __import__("actors.agents.watch", fromlist=["publish"]).publish

    def publish(runtime: Any, agent_id: str, session_id: str, event: Event, reason: str) -> None:
        if session_id == "s2" and event is Event.DISCONNECTED:
            raise RuntimeError("boom")  # a defect in the owner's notify step
        real_publish(runtime, agent_id, session_id, event, reason)

    monkeypatch.setattr("actors.agents.owner.publish", publish)
    await terminate_child(h.base, t.root, AGENT_SUP_NAME, timeout=5.0)
    await h.settle()
    disconnected = [n for n in t.notes(Event.DISCONNECTED) if n.session_id == "s2"]
    assert [(n.agent_id, n.stream_home_id) for n in disconnected] == [("agent-2", home)]
    # The rest of its settling ran too: its row is gone and its agent was told to go.
    assert owner_row(h.base, "s2") is None
    [end] = drain(stream)
    assert (end.status, end.details) == (UNAVAILABLE, STOPPING_DETAILS)
    # The fault is reported (the class only), not hidden.
    assert any("terminate of" in r.getMessage() for r in caplog.records)
