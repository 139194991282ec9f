"""The heartbeat verdict core against the seed's rules (SPEC_INDEX HB-13, HB-14, RP-01, RP-02,
RP-18, K07, K08, K25, K26; the injected-verdict run E6).

Examples use the seed's own figures (4100 listed ids pass 4096; ids of 65 and 100 bytes are
malformed). Properties drive arbitrary lists, flags and mailbox lengths against the rule written
out plainly, and the truncated WARN's limiter against a clock.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from actors.core import Count, LogLine
from actors.core.verdicts import (
    MAILBOX_LIMIT,
    MAX_IDS,
    TRUNCATED_WARN_S,
    UNKNOWN_TRUNCATED,
    VERDICT_DROPPED,
    Cast,
    HeartbeatVerdict,
    VerdictEffect,
    VerdictReader,
    id_fits,
)


def casts(effects: list[VerdictEffect]) -> list[HeartbeatVerdict]:
    return [e.verdict for e in effects if isinstance(e, Cast)]


def dropped(effects: list[VerdictEffect], reason: str) -> int:
    return sum(
        e.n
        for e in effects
        if isinstance(e, Count)
        and e.family == VERDICT_DROPPED
        and e.labels == (("reason", reason),)
    )


def truncated_counts(effects: list[VerdictEffect]) -> int:
    return sum(e.n for e in effects if isinstance(e, Count) and e.family == UNKNOWN_TRUNCATED)


def warnings(effects: list[VerdictEffect]) -> list[str]:
    return [e.text for e in effects if isinstance(e, LogLine) and e.level == "warning"]


def sid(n: int) -> str:
    return f"gw-session-{n:032x}"


# --- examples -----------------------------------------------------------------------------------


def test_an_empty_answer_or_an_older_servers_changes_nothing() -> None:
    reader = VerdictReader()
    assert reader.read([], False, 10, 0.0, 0) == []
    assert reader.status()["verdicts_read"] == 0


def test_ids_are_kept_by_length_only_deduplicated_and_sorted() -> None:
    long_ok = "x" * 64
    listed = [sid(2), sid(1), sid(2), "", "y" * 65, "z" * 100, long_ok, "é" * 33]
    effects = VerdictReader().read(listed, False, 8, 0.0, 0)
    [verdict] = casts(effects)
    # "é" is two bytes: 33 of them are 66 bytes, malformed although only 33 characters.
    assert verdict.session_ids == (sid(1), sid(2), long_ok)
    assert verdict.batch == 8 and not verdict.truncated
    assert dropped(effects, "malformed") == 4  # "", 65 and 100 bytes, 66 bytes (E6: +2 for two)
    assert (
        LogLine("debug", "Heartbeat verdict: 3 unknown session(s) listed, 4 malformed") in effects
    )


def test_4100_listed_ids_pass_4096_and_the_rest_are_counted_nowhere() -> None:
    listed = [sid(n) for n in range(4100)]
    effects = VerdictReader().read(reversed(listed), True, 4100, 0.0, 0)
    [verdict] = casts(effects)
    assert len(verdict.session_ids) == MAX_IDS
    assert verdict.session_ids == tuple(sorted(listed)[:MAX_IDS])
    assert verdict.truncated
    assert all(dropped(effects, r) == 0 for r in ("malformed", "queue_full"))
    assert truncated_counts(effects) == 1
    assert warnings(effects) == [
        "Heartbeat verdict truncated by the server: more than 4096 unknown sessions in one answer;"
        " the rest are listed again by later heartbeats (suppressed 0)"
    ]


def test_a_truncated_answer_without_ids_is_still_passed_on() -> None:
    [verdict] = casts(VerdictReader().read([], True, 5, 0.0, 0))
    assert verdict == HeartbeatVerdict((), 5, True)


def test_a_long_upstream_mailbox_skips_the_cast_and_counts_queue_full() -> None:
    reader = VerdictReader()
    at_limit = reader.read([sid(1), sid(2)], False, 2, 0.0, MAILBOX_LIMIT)
    assert len(casts(at_limit)) == 1  # 100 is not more than 100
    over = reader.read([sid(1), sid(2), "", sid(2)], False, 4, 0.0, MAILBOX_LIMIT + 1)
    assert casts(over) == []
    assert dropped(over, "queue_full") == 2
    assert dropped(over, "malformed") == 1
    debug = [e.text for e in over if isinstance(e, LogLine) and e.level == "debug"]
    assert any("upstream mailbox holds 101 messages" in line for line in debug)
    assert reader.status()["verdicts_skipped"] == 1


def test_no_upstream_process_means_no_cast_and_no_queue_full() -> None:
    effects = VerdictReader().read([sid(1)], False, 1, 0.0, None)
    assert casts(effects) == []
    assert dropped(effects, "queue_full") == 0


def test_a_restarted_reader_warns_again_with_suppressed_zero() -> None:
    first = VerdictReader()
    first.read([], True, 1, 0.0, 0)
    assert warnings(first.read([], True, 1, 1.0, 0)) == []
    again = VerdictReader()  # a new buffer process
    assert warnings(again.read([], True, 1, 2.0, 0))[0].endswith("(suppressed 0)")


# --- properties ---------------------------------------------------------------------------------

ids = st.one_of(
    st.integers(0, 40).map(sid),
    st.text(max_size=70),
    st.text(alphabet="é€", min_size=20, max_size=40),
)


@given(
    listed=st.lists(ids, max_size=60),
    truncated=st.booleans(),
    batch=st.integers(0, 100),
    mailbox=st.one_of(st.none(), st.integers(0, 200)),
    cap=st.integers(1, 20),
)
@settings(max_examples=300)
def test_the_rule_written_out(
    listed: list[str], truncated: bool, batch: int, mailbox: int | None, cap: int
) -> None:
    reader = VerdictReader(max_ids=cap)
    effects = reader.read(listed, truncated, batch, 0.0, mailbox)
    valid = [s for s in listed if 0 < len(s.encode("utf-8", "surrogatepass")) <= 64]
    malformed = len(listed) - len(valid)
    passed = tuple(sorted(set(valid))[:cap])
    if not valid and not malformed and not truncated:
        assert effects == []
        return
    assert dropped(effects, "malformed") == malformed
    assert truncated_counts(effects) == (1 if truncated else 0)
    cast_expected = (passed or truncated) and mailbox is not None and mailbox <= MAILBOX_LIMIT
    if cast_expected:
        assert casts(effects) == [HeartbeatVerdict(passed, batch, truncated)]
    else:
        assert casts(effects) == []
    skipped = (passed or truncated) and mailbox is not None and mailbox > MAILBOX_LIMIT
    assert dropped(effects, "queue_full") == (len(passed) if skipped else 0)
    # The reader never counts what only the upstream actor can know.
    assert dropped(effects, "not_local") == dropped(effects, "circuit_open") == 0
    assert all(id_fits(s) for v in casts(effects) for s in v.session_ids)


class TruncatedWarnings(RuleBasedStateMachine):
    """The truncated WARN: at most one per 60 s, `suppressed N` = occurrences since the last,
    and the counter counts every occurrence."""

    def __init__(self) -> None:
        super().__init__()
        self.reader = VerdictReader()
        self.now = 0.0
        self.occurrences = 0
        self.counted = 0
        self.warned_at: list[float] = []
        self.since_warn = 0

    @rule(dt=st.floats(0.0, 90.0))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(flag=st.booleans())
    def answer(self, flag: bool) -> None:
        effects = self.reader.read([sid(1)], flag, 1, self.now, 0)
        self.counted += truncated_counts(effects)
        lines = warnings(effects)
        if not flag:
            assert lines == []
            return
        self.occurrences += 1
        due = not self.warned_at or self.now - self.warned_at[-1] >= TRUNCATED_WARN_S
        if due:
            assert len(lines) == 1
            assert lines[0].endswith(f"(suppressed {self.since_warn})")
            self.warned_at.append(self.now)
            self.since_warn = 0
        else:
            assert lines == []
            self.since_warn += 1

    @invariant()
    def every_occurrence_is_counted(self) -> None:
        assert self.counted == self.occurrences
        gaps = zip(self.warned_at, self.warned_at[1:], strict=False)
        assert all(b - a >= TRUNCATED_WARN_S for a, b in gaps)


TestTruncatedWarnings = TruncatedWarnings.TestCase
