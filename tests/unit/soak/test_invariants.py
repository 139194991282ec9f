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
    assert not any(inv.notice_counts(history, ["s2"], stopped=False).values())


def test_each_broken_notice_rule_is_counted() -> None:
    history, _ = inv.notice_history([("gone", C), ("held", C), ("held", D), ("early", D)])
    counts = inv.notice_counts(history, ["held", "silent"], stopped=False)
    assert counts == {
        "notice_starts_disconnected": 1,  # early
        "notice_held_not_connected": 2,  # held ended on D, silent has none
        "notice_given_up_not_disconnected": 1,  # gone
    }
    after = inv.notice_counts(history, ["held"], stopped=True)
    assert after["notice_connected_after_stop"] == 1  # gone: nothing held once stopped


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
