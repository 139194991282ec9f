"""The soak's invariants (tests/soak/invariants.py) on hand-made records."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from tests.soak import invariants as inv

C, D = inv.CONNECTED, inv.DISCONNECTED


def test_a_recovered_owner_and_a_repeat_are_not_faults() -> None:
    # s1: owner killed and recovered (D then C again), then given up; one repeated D.
    # s2: still held.
    history, repeats = inv.notice_history(
        [("s1", C), ("s2", C), ("s1", D), ("s1", C), ("s1", D), ("s1", D)]
    )
    assert repeats == 1
    assert not any(inv.notice_counts(history, ["s2"]).values())


def test_each_broken_notice_rule_is_counted() -> None:
    history, _ = inv.notice_history([("gone", C), ("held", C), ("held", D), ("early", D)])
    counts = inv.notice_counts(history, ["held", "silent"])
    assert counts == {
        "notice_starts_disconnected": 1,  # early
        "notice_held_not_connected": 2,  # held ended on D, silent has none
        "notice_given_up_not_disconnected": 1,  # gone
    }


def test_a_start_on_disconnected_counts_beyond_what_the_node_coalesced() -> None:
    # "early": its CONNECTED, still held, was replaced by its DISCONNECTED (seed: "Stream
    # Status Notification", Keys): the node counted that replacement.
    history, _ = inv.notice_history([("early", D), ("early", C), ("other", D)])
    assert inv.notice_counts(history, ["early"], coalesced=1)["notice_starts_disconnected"] == 1
    assert inv.notice_counts(history, ["early"], coalesced=2)["notice_starts_disconnected"] == 0
    assert inv.notice_counts(history, ["early"], coalesced=5)["notice_starts_disconnected"] == 0


def test_the_counts_after_the_stop_do_not_overwrite_those_before_it() -> None:
    # Before the stop: "early" started on D. The stop's own D for "late", whose CONNECTED was
    # still held and was replaced, is the first the server hears of it; "gone" is still
    # CONNECTED once the node has ended.
    before, _ = inv.notice_history([("gone", C), ("early", D)])
    after, _ = inv.notice_history([("gone", C), ("early", D), ("late", D)])
    counts = inv.notice_counts(before, [])
    counts.update(inv.notice_counts_after_stop(after, before))
    assert counts == {
        "notice_starts_disconnected": 1,
        "notice_held_not_connected": 0,
        "notice_given_up_not_disconnected": 1,
        "notice_starts_disconnected_after_stop": 1,  # late; early is counted before
        "notice_connected_after_stop": 1,
    }


def test_a_killed_peer_leaves_connected_exactly_what_it_owned_and_its_agents_move_on() -> None:
    reports = {
        "a": {"current": "a2", "sessions": ["a1", "a2"]},  # moved on to a newer session
        "b": {"current": "b1", "sessions": ["b1"]},  # still on the killed node's session
        "c": {"current": "", "sessions": ["c1", "c2"]},  # between two sessions
    }
    kill = SimpleNamespace(owned=frozenset({"a1", "b1", "c1"}), left_connected=frozenset())
    assert inv.peer_kill_counts([kill], reports) == {
        "peer_kill_left_connected_not_owned": 3,
        "peer_kill_agents_without_newer_session": 0,
    }
    kill = SimpleNamespace(
        owned=frozenset({"a1", "b1", "c1"}), left_connected=frozenset({"a1", "b1", "c1", "x"})
    )
    assert inv.peer_kill_counts([kill], reports) == {
        "peer_kill_left_connected_not_owned": 1,  # x: not in the owner table
        "peer_kill_agents_without_newer_session": 3,  # b, c and x's unknown agent
    }


def test_a_superseded_session_left_in_the_registry_is_counted() -> None:
    reports = {
        "a": {"current": "a2", "sessions": ["a1", "a2"]},
        "b": {"current": "", "sessions": []},
    }
    assert inv.registry_counts(["a2"], reports) == {"registry_superseded_sessions": 0}
    assert inv.registry_counts(["a1", "a2", "x"], reports) == {"registry_superseded_sessions": 2}


def test_commands_count_unanswered_twice_hung_and_unexcused_failures() -> None:
    def command(code: str | None, targets: tuple[str, ...], answers: dict[str, int], at: float):
        return SimpleNamespace(
            code=code, targets=targets, terminals=Counter(answers), started=at, ended=at + 1
        )

    commands = [
        command("OK", ("a", "b"), {"a": 1, "b": 1}, 0.0),
        command("OK", ("a", "b"), {"a": 2}, 0.0),  # b unanswered, a twice
        command(None, ("a",), {}, 0.0),  # hung
        command("UNAVAILABLE", ("a",), {}, 10.0),  # a router kill at 10.5: excused
        command("UNAVAILABLE", ("a",), {}, 50.0),  # no router kill near: a failure
    ]
    assert inv.command_counts(commands, [10.5], 5.0) == {
        "command_targets_unanswered": 1,
        "command_targets_answered_twice": 1,
        "command_streams_hung": 1,
        "command_streams_failed": 1,
    }


def test_gauges_rss_and_canary() -> None:
    exposition = (
        'yuzu_gw_upstream_permits_held{class="register"} 2.0\n'
        'yuzu_gw_upstream_permits_held{class="inventory"} 1.0\n'
        "yuzu_gw_upstream_permits_held_other 9.0\n"
    )
    assert inv.metric_sum(exposition, "yuzu_gw_upstream_permits_held") == 3.0
    assert inv.gauge_counts(exposition, {"pending": 0})["gauge_upstream_permits_held"] == 3
    assert inv.rss_counts(100, 110) == {"rss_grew_over_10pct": 0}
    assert inv.rss_counts(100, 111) == {"rss_grew_over_10pct": 1}
    log = "a line\nRegister tok-123 seen\nanother tok-123\n"
    assert inv.canary_counts(log, ["tok-123"]) == {"log_lines_with_secret": 2}
