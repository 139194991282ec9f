"""The live summary of a send (gateway/ctl/render.py SendProgress, gateway/ctl/live.py)."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st

from gateway.ctl.live import ERASE, LiveSummary
from gateway.ctl.render import SendProgress
from protos.typed.yuzu.agent.v1 import CommandResponseStatus as Status

FINALS = [Status.SUCCESS, Status.FAILURE, Status.TIMEOUT, Status.REJECTED]


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(FINALS)), max_size=40))
def test_each_target_counts_once_by_its_latest_answer(targets: list[tuple[int, int]]) -> None:
    progress = SendProgress()
    for index, (frames, _) in enumerate(targets):
        for _ in range(frames):
            progress.add(f"a{index}", Status.RUNNING)
    running = sum(1 for frames, _ in targets if frames)
    assert progress.line() == f"answered 0, running {running}, failed 0, timed out 0"
    for index, (_, final) in enumerate(targets):
        progress.add(f"a{index}", final)
    finals = [final for _, final in targets]
    failed = sum(1 for f in finals if f in (Status.FAILURE, Status.REJECTED))
    assert progress.line() == (
        f"answered {finals.count(Status.SUCCESS)}, running 0, failed {failed},"
        f" timed out {finals.count(Status.TIMEOUT)}"
    )


def test_the_line_is_redrawn_in_place_at_most_every_interval() -> None:
    now = [0.0]
    out = io.StringIO()
    live = LiveSummary(out, enabled=True, clock=lambda: now[0], redraw_s=0.1)
    progress = SendProgress()
    progress.add("a", Status.RUNNING)
    live.update(progress)
    progress.add("a", Status.SUCCESS)
    live.update(progress)  # within the interval: not drawn
    now[0] = 0.2
    live.update(progress)
    live.clear()
    assert out.getvalue() == (
        f"{ERASE}answered 0, running 1, failed 0, timed out 0"
        f"{ERASE}answered 1, running 0, failed 0, timed out 0{ERASE}"
    )


def test_not_on_a_terminal_nothing_is_written() -> None:
    out = io.StringIO()
    live = LiveSummary(out, enabled=False)
    live.update(SendProgress(), force=True)
    live.clear()
    assert out.getvalue() == ""
