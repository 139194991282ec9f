"""The commands of `yuzu-gw-ctl` over the typed management API's grpclib stub (betterproto2,
`protos.typed`; module docs of `cli`, `render` and `errors` say what is parsed, printed and
exited with).

Data goes to stdout (a table or lines for people, JSON objects with `--json`); notes (what
was sent, a summary, a failure and what to check) go to stderr, so a script's stdout holds
only the data. On a terminal a `send` keeps a live summary as the last line of stdout
(`live`), erased before each answer is printed and at the end.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal, TextIO

import attrs
from grpclib.const import Cardinality

from gateway.ctl import render
from gateway.ctl.cli import (
    MAX_COMMAND_TIMEOUT_S,
    GetAgent,
    Invocation,
    ListAgents,
    Send,
    Watch,
    list_request,
    send_request,
)
from gateway.ctl.connect import TlsFileError, open_channel
from gateway.ctl.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_TARGETS_FAILED,
    EXIT_USAGE,
    Where,
    explain,
)
from gateway.ctl.live import LiveSummary
from protos.typed.yuzu.server.v1 import (
    AgentEvent,
    GetAgentRequest,
    ManagementServiceStub,
    WatchEventsRequest,
)

__all__ = ["SEND_MARGIN_S", "WATCH_ROUTE", "Output", "run"]

# The gateway ends a command's stream at its timeout, after the TIMEOUT answers; the call's
# own deadline leaves it this much more for the trip.
SEND_MARGIN_S = 15
# The generated `watch_events` hides the stream, and with it the initial headers `watch`
# waits for; the call is opened on the stub's channel under the same route.
WATCH_ROUTE = "/yuzu.server.v1.ManagementService/WatchEvents"


class Output:
    def __init__(self, json: bool, stdout: TextIO, stderr: TextIO) -> None:
        self.json = json
        self.stdout = stdout
        self.stderr = stderr

    def lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.stdout.write(line + "\n")
        self.stdout.flush()

    def obj(self, obj: Mapping[str, Any]) -> None:
        self.lines([render.as_json(obj)])

    def note(self, text: str) -> None:
        self.stderr.write(text + "\n")
        self.stderr.flush()


@attrs.define
class Progress:
    """How far a command got, for the failure message (errors.Where)."""

    phase: Literal["connect", "call"] = "connect"
    answered: bool = False


Handler = Callable[[ManagementServiceStub, Invocation, Output, Progress], Awaitable[int]]


async def run(invocation: Invocation, out: Output) -> int:
    """Connect, run the command; the exit status (errors module doc)."""
    connection = invocation.connection
    progress = Progress()
    try:
        async with open_channel(connection) as channel:
            progress.phase = "call"
            handler = _HANDLERS[type(invocation.command)]
            return await handler(ManagementServiceStub(channel), invocation, out, progress)
    except TlsFileError as exc:
        out.note(f"yuzu-gw-ctl: {exc}")
        return EXIT_USAGE
    except Exception as exc:  # every failure becomes a message and a status (errors.explain)
        where = Where(
            target=connection.target,
            tls=connection.tls,
            timeout_s=connection.timeout_s,
            phase=progress.phase,
            answered=progress.answered,
        )
        failure = explain(exc, where)
        out.note(f"yuzu-gw-ctl: {failure.message}")
        return failure.code


async def list_agents(
    stub: ManagementServiceStub, invocation: Invocation, out: Output, progress: Progress
) -> int:
    command = invocation.command
    assert isinstance(command, ListAgents)
    cursor, count, rows = command.cursor, 0, []
    while True:
        page = await stub.list_agents(
            list_request(command, cursor), timeout=invocation.connection.timeout_s
        )
        progress.answered = True
        count += len(page.agents)
        if out.json:
            out.lines(render.as_json(render.summary_object(a)) for a in page.agents)
        else:
            rows += [render.summary_row(a) for a in page.agents]
        cursor = page.next_cursor
        if not cursor or not command.all:
            break
    if not out.json:
        out.lines(render.table(render.AGENT_COLUMNS, rows))
        out.note(f"-- {count} agent{'s' if count != 1 else ''}")
    if cursor:
        out.note(f"more agents follow: --cursor {cursor} for the next page, --all for every one")
    return EXIT_OK


async def get_agent(
    stub: ManagementServiceStub, invocation: Invocation, out: Output, progress: Progress
) -> int:
    command = invocation.command
    assert isinstance(command, GetAgent)
    answer = await stub.get_agent(
        GetAgentRequest(agent_id=command.agent_id),
        timeout=invocation.connection.timeout_s,
    )
    progress.answered = True
    if out.json:
        out.obj(render.details_object(answer))
    else:
        out.lines(render.agent_details(answer))
    return EXIT_OK


async def send(
    stub: ManagementServiceStub, invocation: Invocation, out: Output, progress: Progress
) -> int:
    command = invocation.command
    assert isinstance(command, Send)
    if not out.json:
        targets = f"{len(command.agent_ids)} agent(s)" if command.agent_ids else "every agent held"
        out.note(f"command {command.command_id}: {command.plugin} {command.action} to {targets}")
    tally = render.SendProgress()
    live = LiveSummary(out.stdout, enabled=not out.json and out.stdout.isatty())
    deadline = (command.timeout_s or MAX_COMMAND_TIMEOUT_S) + SEND_MARGIN_S
    try:
        async for answer in stub.send_command(send_request(command), timeout=deadline):
            progress.answered = True
            final = render.is_final(answer.response)
            if final or not command.final_only:
                live.clear()
                if out.json:
                    out.obj(render.answer_object(answer))
                else:
                    out.lines([render.answer_line(answer)])
            tally.add(answer.agent_id, render.status_of(answer))
            live.update(tally)
    finally:
        live.clear()  # a failure's message or the tally follows on a clean line
    out.note(render.tally(tally.finals))
    return EXIT_OK if set(tally.finals) <= {"SUCCESS"} else EXIT_TARGETS_FAILED


async def watch(
    stub: ManagementServiceStub, invocation: Invocation, out: Output, progress: Progress
) -> int:
    command = invocation.command
    assert isinstance(command, Watch)
    async with stub.channel.request(
        WATCH_ROUTE, Cardinality.UNARY_STREAM, WatchEventsRequest, AgentEvent
    ) as stream:
        await stream.send_message(WatchEventsRequest(agent_ids=list(command.agent_ids)), end=True)
        # The gateway sends its headers once the watch is registered: nothing later is missed.
        await stream.recv_initial_metadata()
        progress.answered = True
        which = f"{len(command.agent_ids)} agent(s)" if command.agent_ids else "every agent"
        out.note(f"watching {which} (Ctrl-C stops)")
        async for event in stream:
            if out.json:
                out.obj(render.event_object(event))
            else:
                out.lines([render.event_line(event)])
    out.note("yuzu-gw-ctl: the gateway ended the watch (is the node stopping?)")
    return EXIT_FAILED


_HANDLERS: dict[type, Handler] = {
    ListAgents: list_agents,
    GetAgent: get_agent,
    Send: send,
    Watch: watch,
}
