"""`yuzu-gw-ctl send` over a stand-in stub (gateway/ctl/commands.py `send`): `--final-only`
prints each target's final answer alone, and the live summary line is drawn on a terminal
only, erased before every printed answer and at the end."""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import AsyncIterator, Sequence

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from gateway.ctl import commands
from gateway.ctl.cli import Connection, Invocation, Send, parse
from gateway.ctl.live import ERASE
from protos.typed.yuzu.agent.v1 import CommandResponse
from protos.typed.yuzu.agent.v1 import CommandResponseStatus as S
from protos.typed.yuzu.server.v1 import SendCommandRequest, SendCommandResponse

# Two targets: each a RUNNING frame, then a1 succeeds and a2 fails.
ANSWERS = [("a1", S.RUNNING), ("a2", S.RUNNING), ("a1", S.SUCCESS), ("a2", S.FAILURE)]
LIVE = re.compile(re.escape(ERASE) + r"(answered \d+, running \d+, failed \d+, timed out \d+)?")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Stub:
    """`send_command` as the typed stub has it: the answers, decoded from their bytes."""

    def __init__(self, answers: Sequence[tuple[str, S]], fail: bool = False) -> None:
        self.answers = answers
        self.fail = fail
        self.requests: list[SendCommandRequest] = []

    async def send_command(
        self, request: SendCommandRequest, *, timeout: float
    ) -> AsyncIterator[SendCommandResponse]:
        self.requests.append(request)
        for agent_id, status in self.answers:
            answer = SendCommandResponse(
                agent_id=agent_id,
                response=CommandResponse(command_id="c1", status=status, output=status.name),
            )
            yield SendCommandResponse.parse(bytes(answer))
        if self.fail:
            raise GRPCError(Status.UNAVAILABLE, "router restarting")


def send(
    stdout: io.StringIO, final_only: bool, json_out: bool = False, stub: Stub | None = None
) -> tuple[int, str]:
    invocation = Invocation(
        connection=Connection("127.0.0.1", 50063),
        command=Send(("a1", "a2"), "os", "info", command_id="c1", final_only=final_only),
        json=json_out,
    )
    stderr = io.StringIO()
    out = commands.Output(json_out, stdout, stderr)
    code = asyncio.run(
        commands.send(stub or Stub(ANSWERS), invocation, out, commands.Progress())  # type: ignore[arg-type]
    )
    return code, stderr.getvalue()


def answer_lines(text: str) -> list[list[str]]:
    return [line.split()[:2] for line in text.splitlines()]


def test_final_only_prints_each_targets_final_answer_alone() -> None:
    everything, final = io.StringIO(), io.StringIO()
    code, err = send(everything, final_only=False)
    assert answer_lines(everything.getvalue()) == [[a, s.name] for a, s in ANSWERS]
    assert send(final, final_only=True) == (code, err)
    assert answer_lines(final.getvalue()) == [["a1", "SUCCESS"], ["a2", "FAILURE"]]
    # The tally and the exit status still count every final answer.
    assert code == 4 and "-- 2 targets: 1 FAILURE, 1 SUCCESS" in err
    # A pipe gets the answers alone: no live line, no terminal control.
    assert ERASE not in everything.getvalue() + final.getvalue()


def test_final_only_holds_for_json() -> None:
    out = io.StringIO()
    send(out, final_only=True, json_out=True)
    objects = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(o["agent_id"], o["status"], o["final"]) for o in objects] == [
        ("a1", "SUCCESS", True),
        ("a2", "FAILURE", True),
    ]


@pytest.mark.parametrize("final_only", [False, True])
def test_on_a_terminal_the_live_line_follows_the_answers_and_is_erased(final_only: bool) -> None:
    terminal, pipe = Terminal(), io.StringIO()
    send(terminal, final_only)
    send(pipe, final_only)
    drawn = terminal.getvalue()
    # Drawn after the answers that were printed (each print redraws it at once) ...
    summaries = [m.group(1) for m in LIVE.finditer(drawn) if m.group(1)]
    assert summaries[0] == "answered 0, running 1, failed 0, timed out 0"
    assert summaries[-1] == "answered 1, running 0, failed 1, timed out 0"
    assert "answered 1, running 1, failed 0, timed out 0" in summaries
    # ... erased before each answer and at the end: without it, the pipe's text exactly.
    assert drawn.endswith(ERASE)
    assert LIVE.sub("", drawn) == pipe.getvalue()


def test_json_on_a_terminal_has_no_live_line() -> None:
    terminal = Terminal()
    send(terminal, final_only=False, json_out=True)
    assert ERASE not in terminal.getvalue()
    assert len(terminal.getvalue().splitlines()) == len(ANSWERS)


def test_a_failed_call_leaves_no_live_line_behind() -> None:
    terminal = Terminal()
    with pytest.raises(GRPCError):
        send(terminal, final_only=False, stub=Stub(ANSWERS[:1], fail=True))
    assert "running 1" in terminal.getvalue() and terminal.getvalue().endswith(ERASE)


def test_final_only_is_a_send_option() -> None:
    assert parse(["send", "--all", "os", "info", "--final-only"]).command.final_only  # type: ignore[union-attr]
    assert not parse(["send", "--all", "os", "info"]).command.final_only  # type: ignore[union-attr]
