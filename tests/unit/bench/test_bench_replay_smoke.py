"""Keeps `python -m tests.bench.replay` from rotting: runs it at a small size (a real node, the
fake server in a subprocess) and checks the shape and the counts of the result, the replay's and
the bare reference's. The bare reference's bounds and order are checked on an in-memory channel.
Speed is not asserted here."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import Message

from actors.agents.api import OwnerRow
from actors.upstream.api import NOTIFY_STREAM_STATUS, PROXY_REGISTER, SESSION_ID_METADATA
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2
from supervisors.address import Address
from tests.bench import replay
from tests.bench.common import format_table

pytestmark = pytest.mark.timeout(120)

REQUIRED_KEYS = {
    "elapsed_s",
    "bound_s",
    "replayed",
    "peak_in_flight",
    "targets_met",
    "bare_elapsed_s",
    "ratio_vs_bare",
    "gateway_cpu_s",
    "bare_gateway_cpu_s",
}


def test_a_small_full_replay_replays_every_session_within_the_permits() -> None:
    result = asyncio.run(replay.run_benchmark(sessions=60, latency_ms=10, quiet=True))

    assert result.keys() >= REQUIRED_KEYS
    assert result["bound_s"] == pytest.approx(60 / 24 * 0.010)
    assert result["replayed"] == result["replay_total"] == result["proxy_register_calls"] == 60
    assert result["failed"] == 0
    assert result["peak_in_flight"] <= 24
    assert result["connected_resent"] == 60  # each adopted session announced again
    assert result["elapsed_s"] >= result["bound_s"] * 0.9
    # The bare reference made the same calls: one ProxyRegister and one CONNECTED per session,
    # all answered, 24 at once, and no faster than the transport allows.
    assert result["bare_proxy_register_calls"] == result["bare_connected_sent"] == 60
    assert result["bare_unsuccessful"] == 0
    assert result["bare_peak_in_flight"] == 24
    assert result["bare_elapsed_s"] >= result["bound_s"] * 0.9
    # The times are rounded to 0.1 ms, a few parts in a thousand of a run this short.
    assert result["ratio_vs_bare"] == pytest.approx(
        result["elapsed_s"] / result["bare_elapsed_s"], rel=0.01
    )
    assert result["gateway_cpu_s"] > 0 and result["bare_gateway_cpu_s"] > 0
    assert set(result["targets_met"]) == {
        "replayed_all",
        "peak_in_flight",
        "elapsed_within_1_05x_bound",
    }
    json.dumps(result)
    table = format_table(replay.table_rows(result))
    assert "first replay call to last answer" in table
    assert "replay / bare" in table


def test_main_ends_stdout_with_one_json_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "replay.json"
    code = replay.main(
        ["--sessions", "30", "--latency-ms", "5", "--quiet", "--json", "--out", str(out)]
    )

    assert code == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["replayed"] == 30
    assert printed["bare_proxy_register_calls"] == 30
    assert json.loads(out.read_text()) == printed


# -- the bare reference on an in-memory channel ----------------------------------------------------


class Recorder:
    """A channel that answers after a per-method delay and records, per method, how many calls
    were in flight at most and when each session's call started and ended."""

    def __init__(self, register_s: float, notify_s: float, refuse: frozenset[str]) -> None:
        self.delay = {PROXY_REGISTER: register_s, NOTIFY_STREAM_STATUS: notify_s}
        self.refuse = refuse
        self.now: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.events: list[tuple[str, str, str]] = []  # (start | end, method, session id)
        self.metadata: dict[str, Mapping[str, str] | None] = {}

    async def unary(
        self,
        method: str,
        request: Message,
        response_type: type[Message],
        *,
        timeout: float,
        metadata: Mapping[str, str] | None = None,
    ) -> Any:
        if method == PROXY_REGISTER:
            assert isinstance(request, agent_pb2.RegisterRequest)
            session = f"gw-session-{request.info.agent_id}"
            self.metadata[session] = metadata
        else:
            assert isinstance(request, gateway_pb2.StreamStatusNotification)
            assert request.event == gateway_pb2.StreamStatusNotification.CONNECTED
            session = request.session_id
        self.events.append(("start", method, session))
        self.now[method] += 1
        self.peak[method] = max(self.peak[method], self.now[method])
        try:
            await asyncio.sleep(self.delay[method])
        finally:
            self.now[method] -= 1
        self.events.append(("end", method, session))
        if method == PROXY_REGISTER:
            return agent_pb2.RegisterResponse(accepted=session not in self.refuse)
        return gateway_pb2.StreamStatusAck(acknowledged=True)


def _rows(n: int) -> list[OwnerRow]:
    rows = []
    for i in range(n):
        request = agent_pb2.RegisterRequest()
        request.info.agent_id = f"agent-{i}"
        session = f"gw-session-agent-{i}"
        rows.append(
            OwnerRow(Address(i + 1), session, f"agent-{i}", None, f"home-{i}", "live", request)
        )
    return rows


def _notice(row: OwnerRow) -> gateway_pb2.StreamStatusNotification:
    return gateway_pb2.StreamStatusNotification(
        agent_id=row.agent_id,
        session_id=row.session_id,
        event=gateway_pb2.StreamStatusNotification.CONNECTED,
        stream_home_id=row.stream_home_id,
    )


def test_the_bare_reference_keeps_the_replays_bounds_and_order() -> None:
    rows = _rows(200)
    # Notifications slower than registrations, so they pile up against their own bound.
    channel = Recorder(register_s=0.002, notify_s=0.01, refuse=frozenset())

    unsuccessful = asyncio.run(replay.bare_replay(channel, rows, _notice, 5.0))  # type: ignore[arg-type]

    assert unsuccessful == 0
    assert channel.peak[PROXY_REGISTER] == replay.REPLAY_PERMITS == 24
    assert channel.peak[NOTIFY_STREAM_STATUS] == replay.BARE_NOTIFY_SLOTS == 9
    sessions = [r.session_id for r in rows]
    assert channel.metadata == {s: {SESSION_ID_METADATA: s} for s in sessions}
    at = {(kind, method, s): i for i, (kind, method, s) in enumerate(channel.events)}
    assert len(at) == len(channel.events) == 4 * len(rows)  # each call once per session
    for s in sessions:
        # A session's CONNECTED leaves only once its ProxyRegister was answered.
        assert at[("end", PROXY_REGISTER, s)] < at[("start", NOTIFY_STREAM_STATUS, s)]
    # Every notice was answered before bare_replay returned.
    assert channel.now[NOTIFY_STREAM_STATUS] == 0


def test_the_bare_reference_announces_no_session_the_server_refused() -> None:
    rows = _rows(30)
    refused = frozenset({rows[3].session_id, rows[17].session_id})
    channel = Recorder(register_s=0.001, notify_s=0.001, refuse=refused)

    unsuccessful = asyncio.run(replay.bare_replay(channel, rows, _notice, 5.0))  # type: ignore[arg-type]

    assert unsuccessful == 2
    announced = {s for kind, method, s in channel.events if method == NOTIFY_STREAM_STATUS}
    assert announced == {r.session_id for r in rows} - refused
