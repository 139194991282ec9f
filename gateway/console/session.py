"""One connection to the console socket: authenticate it, then answer a ping, evaluate one
expression, or hold an interactive session.

The interactive session is aioconsole's `AsynchronousConsole` on the connection's streams
(docs/console.md says why): it already does what a REPL over a socket needs (prompts,
continuation lines, tracebacks, top-level `await` inside the loop it runs on). The one-shot
`eval` does not need a REPL, only one compile and a structured answer, so it uses the
compiler's own top-level-await flag.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import functools
import inspect
import io
import logging
import os
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aioconsole import AsynchronousConsole

from gateway.console import protocol as wire
from gateway.console.namespace import BANNER, namespace
from supervisors.runtime import LoopSystemBase

if TYPE_CHECKING:
    from gateway.config.context import NodeContext

log = logging.getLogger("yuzu_gw.console")

# A client that connects and does not finish the handshake in 5 s is gone or hostile; it
# must not hold one of the few session slots.
HANDSHAKE_TIMEOUT_S = 5.0
CONSOLE_FILENAME = "<yuzu_gw console>"


async def evaluate(source: str, names: dict[str, Any], printed: io.StringIO) -> Any:
    """Run `source` in `names` on this loop: an expression gives its value, statements give
    None. `await` is allowed at top level. What the code prints goes to `printed`."""
    names["print"] = functools.partial(print, file=printed)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        code = compile(source, "<eval>", "eval", flags=flags)
    except SyntaxError:
        # Not an expression: statements (`x = 1; print(x)`) are useful too; a real syntax
        # error raises again here, with its own message.
        code = compile(source, "<eval>", "exec", flags=flags)
    result = eval(code, names)
    # Only code that itself awaits is a coroutine to run; an expression whose *value* is a
    # coroutine is shown, not started behind the operator's back.
    if code.co_flags & inspect.CO_COROUTINE:
        result = await result
    return result


def _cancelled_by_owner(exc: BaseException) -> bool:
    """The session's own task is being cancelled (not a CancelledError the operator's code
    raised or caught from something it awaited)."""
    task = asyncio.current_task()
    return isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling() > 0


class NodeConsole(AsynchronousConsole):
    """aioconsole's console, ended by its owner's cancellation even mid-expression."""

    async def runcode(self, code: Any) -> None:
        await super().runcode(code)
        # aioconsole shows every BaseException of the operator's code as a traceback, a
        # CancelledError included, and reads the next line: the console actor cancelling
        # the session (planned stop, restart) would be swallowed and the session live on.
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError


def _traceback_text(exc: BaseException) -> str:
    # Start at the first frame of what the operator typed: our own frames are noise to them.
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "<eval>":
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


class Session:
    """Serves one accepted connection; the console actor owns the task running `serve`."""

    def __init__(
        self,
        ctx: NodeContext,
        system: LoopSystemBase,
        started: float,
        on_outcome: Callable[[str, str], None],
    ) -> None:
        self.ctx = ctx
        self.system = system
        self.started = started
        # Told the outcome ("ok" / "refused") and the mode, for the console's counter.
        self.on_outcome = on_outcome

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client left; nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonce = wire.new_nonce()
        writer.write(wire.hello(nonce))
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), HANDSHAKE_TIMEOUT_S)
            req = wire.read_request(line)
        except TimeoutError:
            await self._refuse(writer, "handshake timed out", "unknown")
            return
        except (wire.ProtocolError, asyncio.LimitOverrunError) as bad:
            await self._refuse(writer, f"protocol error: {bad}", "unknown")
            return
        if not wire.verify(self.ctx.node.cookie, nonce, req.mac):
            # Names neither the cookie nor the answer: only that one was wrong.
            log.warning("console: authentication failed (%s mode): wrong cookie", req.mode)
            await self._refuse(writer, "authentication failed: wrong cookie", req.mode)
            return
        if req.mode == "ping":
            writer.write(wire.accepted(node=self.ctx.node.name, pid=os.getpid()))
        elif req.mode == "eval":
            writer.write(await self._eval(req.source))
        else:
            await self._interact(reader, writer)
            return
        self.on_outcome("ok", req.mode)
        await writer.drain()

    async def _refuse(self, writer: asyncio.StreamWriter, error: str, mode: str) -> None:
        self.on_outcome("refused", mode)
        writer.write(wire.refusal(error))
        await writer.drain()

    async def _eval(self, source: str) -> bytes:
        names = namespace(self.ctx, self.system, self.started)
        printed = io.StringIO()
        try:
            shown = repr(await evaluate(source, names, printed))
        except BaseException as exc:
            # BaseException: a SystemExit (`exit()`, `sys.exit()`) or KeyboardInterrupt that
            # escaped this task would stop the node's loop, and with it the node.
            if _cancelled_by_owner(exc):
                raise
            # ok: the node accepted the request; `raised` says the expression did not return.
            return wire.accepted(raised=_traceback_text(exc), output=printed.getvalue())
        return wire.accepted(result=shown, output=printed.getvalue())

    async def _interact(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        log.info("console: interactive session opened")
        self.on_outcome("ok", "console")
        writer.write(wire.accepted(node=self.ctx.node.name))
        console = NodeConsole(
            streams=(reader, writer),
            locals=namespace(self.ctx, self.system, self.started),
            filename=CONSOLE_FILENAME,
            loop=asyncio.get_running_loop(),
        )
        banner = BANNER.format(name=self.ctx.node.name, pid=os.getpid())
        try:
            # stop=False: `exit()` ends this session, not the node; handle_sigint=False: the
            # node's SIGINT is its planned stop, not a console interrupt.
            await console.interact(banner=banner, stop=False, handle_sigint=False)
        finally:
            log.info("console: interactive session closed")
