"""`python -m gateway.ctl` and the `yuzu-gw-ctl` console script (docs/ctl.md)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence

from gateway.ctl.cli import Completion, Watch, parse, parser
from gateway.ctl.commands import Output, run
from gateway.ctl.completion import script
from gateway.ctl.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    invocation = parse(sys.argv[1:] if argv is None else argv, env=os.environ)
    if isinstance(invocation.command, Completion):
        sys.stdout.write(script(parser(), "yuzu-gw-ctl", invocation.command.shell))
        return EXIT_OK
    out = Output(invocation.json, sys.stdout, sys.stderr)
    try:
        return asyncio.run(run(invocation, out))
    except KeyboardInterrupt:
        # Ctrl-C is how a watch ends; anything else was cut short.
        return EXIT_OK if isinstance(invocation.command, Watch) else EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, without a second error at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
