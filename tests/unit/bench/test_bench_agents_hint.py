"""The benchmarks' agents (tests/bench/agents_loadgen.py) wait exactly a refusal's
`grpc-retry-pushback-ms` and take no backoff step for it; without a hint, the backoff."""

from __future__ import annotations

import asyncio

import pytest

from tests.bench import agents_loadgen


def run_join(
    monkeypatch: pytest.MonkeyPatch, hints: list[float | None]
) -> tuple[bool, list[float], int]:
    """Join with attempts failing with `hints` (in order), then succeeding; the sleeps taken."""
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    outcomes = iter(hints)

    async def attempt(self: agents_loadgen.Agent, *, wait_for_ready: bool) -> bool:
        try:
            self.hint_s = next(outcomes)
        except StopIteration:
            return True
        return False

    monkeypatch.setattr(agents_loadgen.asyncio, "sleep", sleep)
    monkeypatch.setattr(agents_loadgen.Agent, "_attempt", attempt)

    async def join() -> tuple[bool, int]:
        agent = agents_loadgen.Agent("127.0.0.1:9", "bench-agent-000000", 64)
        try:
            return await agent.join(), agent.hinted
        finally:
            await agent.close()

    joined, hinted = asyncio.run(join())
    return joined, slept, hinted


def test_hints_are_waited_exactly_and_take_no_backoff_step(monkeypatch: pytest.MonkeyPatch) -> None:
    joined, slept, hinted = run_join(monkeypatch, [0.75, None, 3.2, None])
    assert joined
    first, second = agents_loadgen.RECONNECT_BACKOFF_S[:2]
    assert slept == [0.75, first, 3.2, second]
    assert hinted == 2


def test_the_hint_is_parsed_from_trailing_metadata() -> None:
    assert agents_loadgen.pushback_s((("grpc-retry-pushback-ms", "1500"),)) == 1.5
    assert agents_loadgen.pushback_s((("grpc-retry-pushback-ms", "x"),)) is None
    assert agents_loadgen.pushback_s(None) is None
