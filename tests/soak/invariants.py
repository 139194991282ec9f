"""The soak's invariants, each a named count that must be 0: pure functions of what the soak
recorded (the fake server's notices, the agents' reports, the node's tables, the commands'
results, the gauges, the RSS samples, the node's log).

Notices. The fake server's acknowledged NotifyStreamStatus calls, per session in the order
received. A repeat of the notice just before it is not counted against the node: delivery is at
least once where a call timed out (seed: "Stream Status Notification", the probe), and a
repeated notice changes nothing at the server; `notice_repeats` reports how many there were. A
session's notices must alternate CONNECTED, DISCONNECTED: an owner killed and recovered sends
its session's DISCONNECTED and then CONNECTED again (seed: "When an agent's owner process
crashes"), and a restarted server is told CONNECTED again after the replay adopts the session.
So, after the repeats are set aside: a session the node still holds ends on CONNECTED, a session
it gave up ends on DISCONNECTED, none starts on DISCONNECTED, and after the planned stop every
session ends on DISCONNECTED.

A session can start on DISCONNECTED without a fault of the node's: a CONNECTED still held (the
breaker open, or the in-flight limit reached) that a DISCONNECTED of the same session replaces is
never sent (seed: "Stream Status Notification", Keys), as when an owner of a session just
registered in a wave is killed and its recovery sends DISCONNECTED, then CONNECTED again. So the
sessions starting on DISCONNECTED are counted beyond the replacements the node counted
(`yuzu_gw_upstream_notify_coalesced_total`). The planned stop comes after the schedule's quiet
tail, once every held notice has gone out, so none of its DISCONNECTEDs may start a session.
The counts read after the stop have keys of their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

CONNECTED = "CONNECTED"
DISCONNECTED = "DISCONNECTED"


def notice_history(notices: Iterable[tuple[str, str]]) -> tuple[dict[str, list[str]], int]:
    """(session id, event) in order received -> each session's events without repeats, and
    how many repeats were set aside."""
    history: dict[str, list[str]] = {}
    repeats = 0
    for session_id, event in notices:
        events = history.setdefault(session_id, [])
        if events and events[-1] == event:
            repeats += 1
        else:
            events.append(event)
    return history, repeats


def current_sessions(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Each agent's subscribed session (agents between sessions are left out)."""
    return {agent: r["current"] for agent, r in reports.items() if r["current"]}


def owner_of_sessions(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Every session a Register granted -> its agent."""
    return {s: agent for agent, r in reports.items() for s in r["sessions"]}


def notice_counts(
    history: Mapping[str, Sequence[str]], held: Iterable[str], coalesced: int = 0
) -> dict[str, int]:
    """The notice invariants while the node runs. `held`: the sessions the node holds;
    `coalesced`: the notices the node says it replaced while held
    (`yuzu_gw_upstream_notify_coalesced_total`), each of which may have been a session's
    CONNECTED replaced by its DISCONNECTED."""
    held_set = set(held)
    return {
        "notice_starts_disconnected": max(0, _starts_disconnected(history) - coalesced),
        "notice_held_not_connected": sum(
            1 for s in held_set if not history.get(s) or history[s][-1] != CONNECTED
        ),
        "notice_given_up_not_disconnected": sum(
            1 for s, e in history.items() if s not in held_set and e[-1] != DISCONNECTED
        ),
    }


def notice_counts_after_stop(
    history: Mapping[str, Sequence[str]], before: Mapping[str, Sequence[str]]
) -> dict[str, int]:
    """The notice invariants once the planned stop ended the node: nothing is held, so every
    session ends on DISCONNECTED, and none the server had not heard of before the stop
    (`before`: the history read then) starts on it. Keys of their own, so they do not hide the
    counts read before the stop."""
    new = {s: e for s, e in history.items() if s not in before}
    return {
        "notice_starts_disconnected_after_stop": _starts_disconnected(new),
        "notice_connected_after_stop": sum(1 for e in history.values() if e[-1] != DISCONNECTED),
    }


def _starts_disconnected(history: Mapping[str, Sequence[str]]) -> int:
    return sum(1 for e in history.values() if e[0] == DISCONNECTED)


def peer_kill_counts(
    kills: Iterable[Any], reports: Mapping[str, Mapping[str, Any]]
) -> dict[str, int]:
    """Per `peer_kill` (its `owned` and `left_connected` sessions): a node killed without a
    stop leaves the server believing exactly the sessions it owned are CONNECTED (no
    DISCONNECTED can be sent for them), and each of their agents must end holding a newer
    session than the one it lost."""
    agents = owner_of_sessions(reports)
    mismatched = stranded = 0
    for kill in kills:
        mismatched += len(kill.owned ^ kill.left_connected)
        for session in kill.left_connected:
            report = reports.get(agents.get(session, ""))
            sessions = [] if report is None else list(report["sessions"])
            current = "" if report is None else report["current"]
            newer = session in sessions and current in sessions[sessions.index(session) + 1 :]
            stranded += 0 if newer else 1
    return {
        "peer_kill_left_connected_not_owned": mismatched,
        "peer_kill_agents_without_newer_session": stranded,
    }


def registry_counts(
    indexed: Iterable[str], reports: Mapping[str, Mapping[str, Any]]
) -> dict[str, int]:
    """Sessions the registry indexes whose agent has a newer session (or is between two)."""
    latest = {agent: r["sessions"][-1] for agent, r in reports.items() if r["sessions"]}
    agents = owner_of_sessions(reports)
    stale = [s for s in set(indexed) if latest.get(agents.get(s, "")) != s]
    return {"registry_superseded_sessions": len(stale)}


def owner_counts(
    owner_actors: Iterable[str],
    owner_rows: Mapping[str, str],
    held: Iterable[str],
) -> dict[str, int]:
    """`owner_actors`: the live AgentOwner actors' addresses; `owner_rows`: owner address ->
    session, from the owner table; `held`: the agents' subscribed sessions."""
    held_set = set(held)
    actors = list(owner_actors)
    return {
        "owner_actors_of_ended_sessions": sum(
            1 for a in actors if owner_rows.get(a) not in held_set
        ),
        "owner_rows_of_ended_sessions": sum(1 for s in owner_rows.values() if s not in held_set),
    }


def command_counts(
    commands: Iterable[Any], router_kills: Sequence[float], restart_s: float
) -> dict[str, int]:
    """Per operator command: every target answered exactly once with a terminal state, and its
    stream ended. A stream whose life overlaps a router kill (up to `restart_s` after it) may
    end UNAVAILABLE without its answers (seed: "Subscribe Stream Proxy"; actors/router/actor.py)."""
    unanswered = twice = hung = failed = 0
    for c in commands:
        twice += sum(1 for n in c.terminals.values() if n > 1)
        if c.code is None:
            hung += 1
            continue
        if c.code == "OK":
            unanswered += sum(1 for t in c.targets if c.terminals[t] == 0)
            continue
        excused = c.code == "UNAVAILABLE" and any(
            c.started <= k + restart_s and c.ended >= k for k in router_kills
        )
        failed += 0 if excused else 1
    return {
        "command_targets_unanswered": unanswered,
        "command_targets_answered_twice": twice,
        "command_streams_hung": hung,
        "command_streams_failed": failed,
    }


def metric_sum(exposition: str, name: str) -> float:
    """The sum of every sample of `name` (all label sets) in a Prometheus exposition."""
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


# What must be back at 0 once the fleet is quiet: the families on /metrics.
QUIET_GAUGES = (
    "yuzu_gw_upstream_permits_held",
    "yuzu_gw_upstream_permits_waiting",
    "yuzu_gw_mgmt_commands_in_flight",
)


def gauge_counts(exposition: str, console: Mapping[str, int]) -> dict[str, int]:
    """The quiet-time gauges: /metrics' families and the registry's counts from the console."""
    counts = {
        f"gauge_{name[len('yuzu_gw_') :]}": int(metric_sum(exposition, name))
        for name in QUIET_GAUGES
    }
    counts.update({f"gauge_registry_{k}": int(v) for k, v in console.items()})
    return counts


RSS_GROWTH_MAX = 0.10


def rss_counts(first: int, last: int) -> dict[str, int]:
    return {"rss_grew_over_10pct": int(last > first * (1 + RSS_GROWTH_MAX))}


def canary_counts(log: str, canaries: Iterable[str]) -> dict[str, int]:
    marks = tuple(canaries)
    return {
        "log_lines_with_secret": sum(
            1 for line in log.splitlines() if any(m in line for m in marks)
        )
    }
