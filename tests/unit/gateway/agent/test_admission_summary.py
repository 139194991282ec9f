"""The heartbeat-rejection summary line (seed "Heartbeat admission" > Observability; L02, ADM-10):
the first rejection writes it, then at most one line per interval, with the reason counts
gathered since the last line and nothing else."""

from __future__ import annotations

from gateway.agent.heartbeat import SUMMARY_PREFIX, RejectionSummary


def test_first_rejection_then_at_most_one_line_per_interval() -> None:
    summary = RejectionSummary(interval_s=10.0)
    assert summary.record("unknown_session", 100.0) == SUMMARY_PREFIX + "unknown_session=1"
    assert summary.record("unknown_session", 101.0) is None
    assert summary.record("connection_mismatch", 105.0) is None
    assert summary.record("unknown_session", 109.9) is None
    # The next line carries what was held back, in a fixed reason order, counts only.
    assert summary.record("unknown_session", 110.0) == (
        SUMMARY_PREFIX + "unknown_session=3, connection_mismatch=1"
    )
    # Nothing is written without a rejection; the next one after a quiet spell is written.
    assert summary.record("registry_unavailable", 500.0) == (
        SUMMARY_PREFIX + "registry_unavailable=1"
    )


def test_the_line_has_the_seed_shape() -> None:
    summary = RejectionSummary(interval_s=10.0)
    summary.record("unknown_session", 0.0)
    for at in (1.0, 2.0, 3.0):
        summary.record("unknown_session", at)
    summary.record("connection_mismatch", 4.0)
    line = summary.record("unknown_session", 10.0)
    assert line == (
        "Heartbeat admission rejected heartbeats since the last summary:"
        " unknown_session=4, connection_mismatch=1"
    )
