"""The shedder core: how the marks resolve (or refuse), the hysteresis between them, and the
retry rules of a suspend or resume that fails (seed, "Node-wide memory load shedding", "When a
suspend or resume fails"; SPEC_INDEX MS-02, MS-03, MS-06..MS-10)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from actors.core import Count, LogLine
from actors.core.reclaim import Reclaim, ReclaimPolicy, RunPass
from actors.core.shedder_marks import (
    FAILURE_LOG_INTERVAL_S,
    RESUME,
    RUNNING,
    SUSPEND,
    SUSPENDED,
    SUSPENSIONS,
    TRANSITION_FAILURES,
    Command,
    Effect,
    Marks,
    MarkSettings,
    MarksRefused,
    Shedder,
    resolve_marks,
)

GIB = 1024**3
LIMIT = 16 * GIB


def marks(settings: MarkSettings, limit: int | None = LIMIT) -> tuple[int, int]:
    resolved = resolve_marks(settings, limit, "host")
    assert resolved is not None
    return resolved.high.bytes, resolved.low.bytes


def refusal(settings: MarkSettings, limit: int | None = LIMIT) -> str:
    with pytest.raises(MarksRefused) as refused:
        resolve_marks(settings, limit, "host")
    return refused.value.detail


# -- resolving the marks ---------------------------------------------------------------------------


def test_default_fractions_of_the_limit() -> None:
    assert marks(MarkSettings()) == (int(0.75 * LIMIT), int(0.65 * LIMIT))


def test_explicit_fractions() -> None:
    assert marks(MarkSettings(high_water_fraction=0.9, low_water_fraction=0.5)) == (
        int(0.9 * LIMIT),
        int(0.5 * LIMIT),
    )


def test_only_high_bytes_derives_low_with_the_defaults_ratio() -> None:
    # Seed: 1 GiB gives a low mark of about 0.87 GiB.
    high, low = marks(MarkSettings(high_water_bytes=GIB))
    assert high == GIB
    assert low == int(GIB * 0.65 / 0.75)
    assert 0.86 * GIB < low < 0.87 * GIB


def test_only_low_bytes_derives_high_the_other_way() -> None:
    assert marks(MarkSettings(low_water_bytes=GIB)) == (int(GIB * 0.75 / 0.65), GIB)


def test_a_derived_high_mark_that_would_reach_the_limit_goes_halfway() -> None:
    low = 15 * GIB  # x 0.75/0.65 = 17.3 GiB, above the 16 GiB limit
    assert marks(MarkSettings(low_water_bytes=low)) == ((low + LIMIT) // 2, low)


def test_a_fraction_set_explicitly_is_not_replaced_by_a_derivation() -> None:
    assert marks(MarkSettings(high_water_bytes=12 * GIB, low_water_fraction=0.5)) == (
        12 * GIB,
        int(0.5 * LIMIT),
    )
    assert marks(MarkSettings(low_water_bytes=GIB, high_water_fraction=0.5)) == (
        int(0.5 * LIMIT),
        GIB,
    )


def test_the_old_trap_now_refuses_instead_of_silently_not_shedding() -> None:
    # Seed: high_water_bytes 1 GiB with the low mark at 0.65 of 16 GiB put low above high.
    detail = refusal(MarkSettings(high_water_bytes=GIB, low_water_fraction=0.65))
    assert detail.startswith("the low-water mark (low_water_fraction 0.65 of the limit = ")
    assert "is not below the high-water mark (high_water_bytes 1073741824 = " in detail


def test_both_bytes_are_used_as_given() -> None:
    assert marks(MarkSettings(high_water_bytes=3 * GIB, low_water_bytes=2 * GIB)) == (
        3 * GIB,
        2 * GIB,
    )


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (MarkSettings(high_water_bytes=0), "high_water_bytes 0 is not positive"),
        (MarkSettings(low_water_bytes=-1), "low_water_bytes -1 is not positive"),
        (MarkSettings(high_water_fraction=0.0), "high_water_fraction 0.0 is not positive"),
        (MarkSettings(low_water_fraction=-0.5), "low_water_fraction -0.5 is not positive"),
    ],
)
def test_a_mark_that_is_not_positive_refuses(settings: MarkSettings, named: str) -> None:
    assert refusal(settings) == named
    assert refusal(settings, None) == named  # whatever the limit


def test_a_computed_mark_of_zero_bytes_refuses() -> None:
    detail = refusal(MarkSettings(low_water_fraction=0.1), limit=5)
    assert detail.startswith("the low-water mark (low_water_fraction 0.1 of the limit = 0 bytes)")


@pytest.mark.parametrize(
    ("settings", "which"),
    [
        (MarkSettings(high_water_bytes=LIMIT), "high"),
        (MarkSettings(high_water_fraction=1.0), "high"),
        (MarkSettings(high_water_bytes=20 * GIB, low_water_bytes=17 * GIB), "high"),
        (MarkSettings(high_water_bytes=20 * GIB), "high"),
        (MarkSettings(high_water_bytes=20 * GIB, low_water_bytes=GIB), "high"),
        (MarkSettings(low_water_bytes=LIMIT), "low"),
    ],
)
def test_a_mark_at_or_above_the_limit_refuses(settings: MarkSettings, which: str) -> None:
    detail = refusal(settings)
    assert detail.startswith(f"the {which}-water mark (")
    assert f"is at or above the memory limit {LIMIT} bytes (host)" in detail


def test_low_not_below_high_refuses() -> None:
    detail = refusal(MarkSettings(high_water_bytes=GIB, low_water_bytes=GIB))
    assert detail == (
        "the low-water mark (low_water_bytes 1073741824 = 1073741824 bytes) is not below the"
        " high-water mark (high_water_bytes 1073741824 = 1073741824 bytes)"
    )


def test_unknown_limit_with_a_fraction_is_inactive() -> None:
    assert resolve_marks(MarkSettings(), None) is None
    assert resolve_marks(MarkSettings(high_water_bytes=GIB, low_water_fraction=0.5), None) is None


def test_unknown_limit_with_byte_marks_runs() -> None:
    assert marks(MarkSettings(high_water_bytes=GIB), None) == (GIB, int(GIB * 0.65 / 0.75))
    assert marks(MarkSettings(low_water_bytes=GIB), None) == (int(GIB * 0.75 / 0.65), GIB)


def test_unknown_limit_still_refuses_fractions_the_wrong_way_round() -> None:
    detail = refusal(MarkSettings(high_water_fraction=0.6), None)
    assert detail == "low_water_fraction 0.65 is not below high_water_fraction 0.6"


optional_bytes = st.none() | st.integers(-10, 40 * GIB)
optional_fraction = st.none() | st.floats(-0.5, 1.5, allow_nan=False)


@settings(max_examples=400)
@given(
    high_bytes=optional_bytes,
    low_bytes=optional_bytes,
    high_fraction=optional_fraction,
    low_fraction=optional_fraction,
    limit=st.none() | st.integers(1, 64 * GIB),
)
def test_resolved_marks_always_work(
    high_bytes: int | None,
    low_bytes: int | None,
    high_fraction: float | None,
    low_fraction: float | None,
    limit: int | None,
) -> None:
    """Whatever is configured: refused, inactive, or 0 < low < high < limit, byte marks as
    given; inactive only when the limit is unknown and a mark is a fraction."""
    settings_ = MarkSettings(high_fraction, low_fraction, high_bytes, low_bytes)
    try:
        resolved = resolve_marks(settings_, limit)
    except MarksRefused:
        return
    if resolved is None:
        assert limit is None
        assert high_bytes is None or low_bytes is None
        return
    assert isinstance(resolved, Marks)
    high, low = resolved.high.bytes, resolved.low.bytes
    assert 0 < low < high
    if limit is not None:
        assert high < limit
    if high_bytes is not None:
        assert high == high_bytes
    if low_bytes is not None:
        assert low == low_bytes


# -- hysteresis ------------------------------------------------------------------------------------

HIGH, LOW = 1000, 800


def shedder(shedding: bool = False) -> Shedder:
    return Shedder(HIGH, LOW, interval_ms=1000, shedding=shedding)


def counts(effects: list[Effect], family: str) -> int:
    return sum(e.n for e in effects if isinstance(e, Count) and e.family == family)


def texts(effects: list[Effect], level: str | None = None) -> list[str]:
    return [
        e.text for e in effects if isinstance(e, LogLine) and (level is None or e.level == level)
    ]


def test_shedding_starts_at_the_high_mark_and_ends_at_the_low_mark() -> None:
    core = shedder()
    assert core.sample(HIGH - 1, 0) == []
    effects = core.sample(HIGH, 1)
    assert core.shedding and core.action == SUSPEND and core.target == SUSPENDED
    assert counts(effects, SUSPENSIONS) == 1
    assert texts(effects, "warning") == [
        "gateway memory shedding: 1000 bytes in use reached the high-water mark 1000; suspending"
        " the agent listener(s), new agent connections are refused until memory falls to the"
        " low-water mark"
    ]
    assert core.sample(LOW + 1, 2) == []  # between the marks: still shedding
    assert core.sample(HIGH * 3, 3) == []  # already shedding: not counted again
    effects = core.sample(LOW, 4)
    assert not core.shedding and core.action == RESUME and core.target == RUNNING
    assert texts(effects, "info") == [
        "gateway memory shedding: 800 bytes in use is at or below the low-water mark 800;"
        " resuming the agent listener(s)"
    ]


@settings(max_examples=300)
@given(st.lists(st.integers(0, 2 * HIGH), max_size=60), st.booleans())
def test_hysteresis_against_a_model(samples: list[int], start: bool) -> None:
    core = shedder(start)
    model, began = start, 0
    for t, used in enumerate(samples):
        effects = core.sample(used, float(t))
        before = model
        if not model and used >= HIGH:
            model, began = True, began + 1
        elif model and used <= LOW:
            model = False
        assert core.shedding == model
        assert counts(effects, SUSPENSIONS) == int(model and not before)
        if LOW < used < HIGH:
            assert effects == []  # between the marks nothing flaps


def test_reconcile_commands_the_listeners_not_yet_in_the_target_state() -> None:
    core = shedder(shedding=True)
    states = {"agent": RUNNING, "agent2": SUSPENDED, "agent3": None, "agent4": RUNNING}
    assert core.reconcile(states, in_flight={"agent4"}) == [Command("agent", SUSPEND)]
    core.sample(0, 1)
    assert core.reconcile(states, in_flight=set()) == [Command("agent2", RESUME)]


# -- failed transitions ---------------------------------------------------------------------------


def test_a_failing_resume_logs_first_then_once_a_minute_then_the_success() -> None:
    core = shedder(shedding=True)
    core.sample(0, 0)  # now resuming
    first = core.result("agent", RESUME, SUSPENDED, "eaddrinuse", 0)
    assert counts(first, TRANSITION_FAILURES) == 1
    assert first[0] == Count(TRANSITION_FAILURES, (("action", "resume"),))
    assert texts(first) == [
        "could not resume agent listener(s) agent (eaddrinuse); retrying every 1000 ms"
    ]
    assert core.failing(RESUME) == 1
    quiet = [core.result("agent", RESUME, SUSPENDED, "eaddrinuse", t) for t in range(1, 60)]
    assert all(texts(e) == [] and counts(e, TRANSITION_FAILURES) == 1 for e in quiet)
    again = core.result("agent", RESUME, SUSPENDED, "emfile", FAILURE_LOG_INTERVAL_S)
    assert texts(again) == [
        "could not resume agent listener(s) agent (emfile) for 60 s (61 failed attempt(s));"
        " retrying every 1000 ms"
    ]
    success = core.result("agent", RESUME, RUNNING, None, 61)
    assert texts(success, "info") == ["agent listener(s) agent resumed after 61 failed attempt(s)"]
    assert core.failing(RESUME) == 0
    # The next failure is a new episode: logged at once.
    assert texts(core.result("agent", RESUME, SUSPENDED, "emfile", 62)) != []


def test_a_listener_seen_in_place_at_reconcile_ends_its_failure() -> None:
    core = shedder(shedding=True)
    core.result("agent", SUSPEND, RUNNING, "timeout", 0)
    effects = core.reconcile({"agent": SUSPENDED}, in_flight=set())
    assert texts(effects) == ["agent listener(s) agent suspended after 1 failed attempt(s)"]
    assert core.failing(SUSPEND) == 0


def test_shedding_turning_abandons_the_other_actions_failures() -> None:
    core = shedder()
    core.sample(HIGH, 0)
    core.result("agent", SUSPEND, RUNNING, "timeout", 0)
    assert core.failing(SUSPEND) == 1
    effects = core.sample(LOW, 1)
    assert core.failing(SUSPEND) == 0
    assert (
        "stopped trying to suspend agent listener(s) agent after 1 failed attempt(s):"
        " shedding turned"
    ) in texts(effects)


def test_an_answer_to_an_old_action_is_ignored() -> None:
    core = shedder()
    core.sample(HIGH, 0)
    core.sample(LOW, 1)
    assert core.result("agent", SUSPEND, SUSPENDED, None, 2) == []
    assert core.failing(RESUME) == 0 and core.failing(SUSPEND) == 0


LISTENERS = ("agent", "agent2")


class ShedderMachine(RuleBasedStateMachine):
    """Arbitrary samples, answers and reconciles over time, checked against a model of the
    failure episodes: every failed attempt counted, the failure lines of an episode at most one
    per minute after the first, one success line when the episode ends by moving."""

    @initialize(shedding=st.booleans())
    def start(self, shedding: bool) -> None:
        self.core = shedder(shedding)
        self.now = 0.0
        self.failures = 0
        # action -> (failing listeners, times of the failure lines)
        self.episodes: dict[str, tuple[set[str], list[float]]] = {}

    def _apply(self, effects: list[Effect]) -> list[str]:
        self.failures += counts(effects, TRANSITION_FAILURES)
        return texts(effects)

    @rule(dt=st.floats(0, 90, allow_nan=False))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(used=st.sampled_from([0, LOW, LOW + 1, HIGH - 1, HIGH, 2 * HIGH]))
    def sample(self, used: int) -> None:
        action = self.core.action
        self._apply(self.core.sample(used, self.now))
        if self.core.action != action:
            self.episodes.pop(action, None)

    @rule(
        name=st.sampled_from(LISTENERS),
        moved=st.booleans(),
        error=st.sampled_from(["eaddrinuse", "emfile", "timeout"]),
    )
    def answer(self, name: str, moved: bool, error: str) -> None:
        action = self.core.action
        before = self.failures
        state = self.core.target if moved else (RUNNING if action == SUSPEND else SUSPENDED)
        lines = self._apply(
            self.core.result(name, action, state, None if moved else error, self.now)
        )
        episode = self.episodes.get(action)
        if moved:
            assert self.failures == before
            if episode is not None and name in episode[0]:
                episode[0].discard(name)
                if not episode[0]:
                    assert len(lines) == 1 and "after" in lines[0]
                    del self.episodes[action]
                    return
            assert lines == []
            return
        assert self.failures == before + 1
        if episode is None:
            assert len(lines) == 1 and lines[0].startswith(f"could not {action} ")
            self.episodes[action] = ({name}, [self.now])
            return
        episode[0].add(name)
        if lines:
            assert self.now - episode[1][-1] >= FAILURE_LOG_INTERVAL_S
            episode[1].append(self.now)
        else:
            assert self.now - episode[1][-1] < FAILURE_LOG_INTERVAL_S

    @rule(data=st.data())
    def reconcile(self, data: st.DataObject) -> None:
        states = {n: data.draw(st.sampled_from([RUNNING, SUSPENDED, None])) for n in LISTENERS}
        in_flight = data.draw(st.sets(st.sampled_from(LISTENERS)))
        effects = self.core.reconcile(states, in_flight)
        commands = [e for e in effects if isinstance(e, Command)]
        assert {c.listener for c in commands} == {
            n for n, s in states.items() if s not in (None, self.core.target) and n not in in_flight
        }
        assert all(c.action == self.core.action for c in commands)
        episode = self.episodes.get(self.core.action)
        if episode is not None:
            episode[0].difference_update(n for n, s in states.items() if s == self.core.target)
            if not episode[0]:
                del self.episodes[self.core.action]
                assert len(texts(effects)) == 1

    @invariant()
    def failing_matches_the_model(self) -> None:
        if not hasattr(self, "core"):
            return
        for action in (SUSPEND, RESUME):
            episode = self.episodes.get(action)
            assert self.core.failing(action) == (0 if episode is None else len(episode[0]))
        other = RESUME if self.core.action == SUSPEND else SUSPEND
        assert self.core.failing(other) == 0


TestShedderMachine = ShedderMachine.TestCase
TestShedderMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# -- leaving shedding when the allocator keeps what was freed ------------------------------------
# RssAnon does not fall when Python frees memory: garbage in reference cycles stays allocated
# until a full collection, and what glibc's malloc frees stays resident until malloc_trim
# (measured, issue 21 §2). So the shedder reads what the allocator keeps, and mem_reclaim gives
# it back while the node sheds (actors/core/reclaim.py).

RECLAIM = ReclaimPolicy(followup_s=30.0, trim_interval_s=None)
TICK_S = 1.0  # the shedder's and reclaim's readings, one a second here


@attrs.define
class Allocator:
    """What RssAnon shows: it follows memory in use up, and falls to it only at a pass."""

    live: int = 0
    rss: int = 0

    def use(self, live: int) -> None:
        self.live, self.rss = live, max(self.rss, live)

    def reclaim(self) -> None:
        self.rss = self.live


def tick(core: Shedder, reclaim: Reclaim, memory: Allocator, now: float) -> list[object]:
    """One reading of each: the shedder samples RssAnon, mem_reclaim sees its verdict."""
    core.sample(memory.rss, now)
    effects = reclaim.observe(0, now, shedding=core.shedding)
    if any(isinstance(effect, RunPass) for effect in effects):
        memory.reclaim()
        reclaim.finished()
    return list(effects)


def test_memory_back_under_the_low_mark_ends_shedding_though_the_allocator_kept_it() -> None:
    core, reclaim, memory = shedder(), Reclaim.started(RECLAIM, 0), Allocator()
    memory.use(HIGH)
    assert tick(core, reclaim, memory, 0) == [RunPass("shedding", 0)]  # reaching it: a pass
    assert core.shedding
    memory.use(LOW - 1)  # the agents' memory is freed; RssAnon stays at the high mark
    assert memory.rss == HIGH
    for now in range(1, 30):
        assert tick(core, reclaim, memory, float(now)) == []
        assert core.shedding
    assert tick(core, reclaim, memory, 30.0) == [RunPass("shedding", 0)]
    assert memory.rss == LOW - 1
    tick(core, reclaim, memory, 31.0)
    assert not core.shedding
    assert tick(core, reclaim, memory, 90.0) == []  # no pass while not shedding


@settings(max_examples=300)
@given(st.lists(st.integers(0, 2 * HIGH), min_size=1, max_size=60), st.integers(0, LOW))
def test_shedding_ends_within_a_followup_once_memory_in_use_is_under_the_low_mark(
    uses: list[int], after: int
) -> None:
    """Whatever RssAnon kept: shedding starts at the high mark, never ends while memory in use
    is above the low mark, and ends at most `followup_s` and a reading after it fell to it."""
    core, reclaim, memory = shedder(), Reclaim.started(RECLAIM, 0), Allocator()
    now = 0.0
    for live in [*uses, HIGH]:
        memory.use(live)
        was = core.shedding
        tick(core, reclaim, memory, now)
        assert core.shedding or not was or memory.live <= LOW
        assert core.shedding or memory.rss < HIGH
        now += TICK_S
    assert core.shedding
    memory.use(after)
    fell = now
    while core.shedding:
        tick(core, reclaim, memory, now)
        assert now - fell <= RECLAIM.followup_s + TICK_S
        now += TICK_S
    for _ in range(60):  # and it stays out while memory stays under the low mark
        tick(core, reclaim, memory, now)
        assert not core.shedding
        now += TICK_S
