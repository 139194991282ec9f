"""The command line of `yuzu-gw-ctl` (pure): the parser, what it parses into, and the requests
built from it. A usage error exits 2 through argparse, with the usage line.

The connection options (`--target`, `--ca`, `--cert`, `--key`, `--server-name`, `--json`) may
stand before or after the command words. `--timeout` before the command words is the time to
connect and to wait for a list or get answer; after `send` it is the command's own timeout,
the `timeout_seconds` the gateway ends the command at.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from gateway.ctl.completion import SHELLS
from gateway.node.version import add_version_option
from protos.typed.yuzu.agent.v1 import CommandRequest
from protos.typed.yuzu.server.v1 import ListAgentsRequest, SendCommandRequest

__all__ = [
    "CA_ENV",
    "CERT_ENV",
    "DEFAULT_TARGET",
    "DEFAULT_TIMEOUT_S",
    "KEY_ENV",
    "TARGET_ENV",
    "Completion",
    "Connection",
    "GetAgent",
    "Invocation",
    "ListAgents",
    "Send",
    "Watch",
    "list_request",
    "parse",
    "parse_parameters",
    "parse_target",
    "send_request",
    "split_send_words",
]

# The management listener of the shipped dev config (sys_config/sys.config; docs/ctl.md).
DEFAULT_TARGET = "127.0.0.1:50063"
DEFAULT_TIMEOUT_S = 10.0
# A ListAgents page holds 1..1000 agents (gateway/mgmt/agents.py); --all asks for full pages.
MAX_PAGE = 1000
DEFAULT_PAGE = 100
# The gateway clamps a command's timeout_seconds to 1..3600 (docs/management-plane.md).
MAX_COMMAND_TIMEOUT_S = 3600
# The defaults of --target, --ca, --cert and --key, for a shell that always talks to one
# gateway (docs/ctl.md); the option given on the command line wins.
TARGET_ENV = "YUZU_GW_CTL_TARGET"
CA_ENV = "YUZU_GW_CTL_CA"
CERT_ENV = "YUZU_GW_CTL_CERT"
KEY_ENV = "YUZU_GW_CTL_KEY"


@attrs.frozen
class Connection:
    host: str
    port: int
    timeout_s: float = DEFAULT_TIMEOUT_S
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None

    @property
    def target(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def tls(self) -> bool:
        return self.ca is not None or self.cert is not None


@attrs.frozen
class ListAgents:
    limit: int | None = None  # None: one default page, or full pages with --all
    all: bool = False
    cursor: str = ""

    @property
    def page_size(self) -> int:
        if self.limit is not None:
            return self.limit
        return MAX_PAGE if self.all else DEFAULT_PAGE


@attrs.frozen
class GetAgent:
    agent_id: str


@attrs.frozen
class Send:
    agent_ids: tuple[str, ...]  # empty: every agent the gateway holds (--all)
    plugin: str
    action: str
    parameters: tuple[tuple[str, str], ...] = ()
    timeout_s: int | None = None  # None: the gateway's default_command_timeout_s
    command_id: str = ""
    final_only: bool = False  # print each target's final answer only, not its RUNNING frames


@attrs.frozen
class Watch:
    agent_ids: tuple[str, ...] = ()  # empty: every agent


@attrs.frozen
class Completion:
    """Print the shell completion script; connects to nothing."""

    shell: str


Command = ListAgents | GetAgent | Send | Watch | Completion


@attrs.frozen
class Invocation:
    connection: Connection
    command: Command
    json: bool = False


# -- value parsers (argparse types) ------------------------------------------------------------


def parse_target(text: str) -> tuple[str, int]:
    """HOST:PORT, [IPV6]:PORT."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise argparse.ArgumentTypeError(f"{text!r}: write an IPv6 address as [ADDRESS]:PORT")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: the port is not a number from 1 to 65535")
    return host, int(port_text)


def _int_range(low: int, high: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not from {low} to {high}")
        return value

    return convert


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not more than 0")
    return value


def parse_parameters(words: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """KEY=VALUE words into the command's parameters (a map<string, string>): split at the first
    `=`, so a value may hold `=` or be empty; a key must not be empty or given twice."""
    pairs: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise ValueError(f"{word!r} is not KEY=VALUE")
        if not key:
            raise ValueError(f"{word!r} has an empty key")
        if key in pairs:
            raise ValueError(f"parameter {key!r} is given twice")
        pairs[key] = value
    return tuple(pairs.items())


def split_send_words(
    words: Sequence[str], everyone: bool
) -> tuple[tuple[str, ...], str, str, tuple[tuple[str, str], ...]]:
    """`[ID...] PLUGIN ACTION [KEY=VALUE...]` into the agent ids, plugin, action, parameters.
    The KEY=VALUE words are the ones at the end that hold a `=`; the two words before them are
    the plugin and the action, and any words before those are agent ids."""
    end = len(words)
    while end > 0 and "=" in words[end - 1]:
        end -= 1
    head, parameters = words[:end], parse_parameters(words[end:])
    if len(head) < 2:
        raise ValueError("name a PLUGIN and an ACTION (before any KEY=VALUE)")
    *agent_ids, plugin, action = head
    if everyone and agent_ids:
        raise ValueError("give agent ids or --all, not both")
    if not everyone and not agent_ids:
        raise ValueError("name the target agent ids, or --all for every agent")
    return tuple(agent_ids), plugin, action, parameters


# -- the parser --------------------------------------------------------------------------------


def _connection_options(
    parser: argparse.ArgumentParser, defaults: bool, env: Mapping[str, str]
) -> None:
    """The connection options; on the subcommands without defaults, so that one given before
    the command words is not overwritten by the subcommand's default. A default read from
    the environment is a string, which argparse converts (and checks) as if it were typed."""

    def default(value: object, variable: str) -> object:
        if not defaults:
            return argparse.SUPPRESS
        return env.get(variable) or value

    parser.add_argument(
        "--target",
        type=parse_target,
        default=default(DEFAULT_TARGET, TARGET_ENV),
        metavar="HOST:PORT",
        help=f"the management listener (default ${TARGET_ENV}, else {DEFAULT_TARGET}, the dev"
        " config's)",
    )
    parser.add_argument(
        "--ca",
        type=Path,
        default=default(None, CA_ENV),
        metavar="FILE",
        help=f"TLS: the CA that issued the gateway's certificate (the install CA; default"
        f" ${CA_ENV})",
    )
    parser.add_argument(
        "--cert",
        type=Path,
        default=default(None, CERT_ENV),
        metavar="FILE",
        help=f"TLS: this client's certificate (the Yuzu server's: docs/mgmt-auth.md; default"
        f" ${CERT_ENV})",
    )
    parser.add_argument(
        "--key",
        type=Path,
        default=default(None, KEY_ENV),
        metavar="FILE",
        help=f"TLS: its private key (default ${KEY_ENV})",
    )
    parser.add_argument(
        "--server-name",
        default=argparse.SUPPRESS if not defaults else None,
        metavar="NAME",
        help="TLS: the name to verify the gateway's certificate against (default: the host)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if not defaults else False,
        help="one JSON object per line on stdout, for scripts",
    )


def _deadline_option(parser: argparse.ArgumentParser, defaults: bool) -> None:
    parser.add_argument(
        "--timeout",
        type=_seconds,
        dest="timeout_s",
        default=DEFAULT_TIMEOUT_S if defaults else argparse.SUPPRESS,
        metavar="S",
        help=f"seconds to connect and for an answer (default {DEFAULT_TIMEOUT_S:g})",
    )


SEND_HELP = """\
words:
  ID          an agent id to send to; several may be given (or --all, never both)
  PLUGIN      the command's plugin, e.g. os
  ACTION      the plugin's action, e.g. info
  KEY=VALUE   a parameter of the command (map<string, string>); split at the first =, so
              env=A=1 is key env, value A=1, and flag= is an empty value; a key at most once

The words that hold a = after ACTION are the parameters; the two words before them are the
plugin and the action, and any words before those are agent ids. Every answer is printed as
it comes (RUNNING frames included; --final-only prints each target's final answer alone); on
a terminal the last line counts answered, running, failed and timed out as they come; stderr
ends with the tally of final answers.

examples:
  yuzu-gw-ctl send --all os info --final-only
  yuzu-gw-ctl send agent-1 agent-2 script run name=backup dry_run= --timeout 60
"""


def parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    env = {} if env is None else env
    top = argparse.ArgumentParser(
        prog="yuzu-gw-ctl",
        description="Operate a Yuzu gateway through its management listener (docs/ctl.md).",
        epilog="Exit status: 0 done; 1 the gateway answered an error or no answer in time;"
        " 2 usage; 3 no connection, TLS failed or not authorised; 4 send: a target did not"
        " answer SUCCESS; 130 interrupted.",
    )
    add_version_option(top)
    _connection_options(top, defaults=True, env=env)
    _deadline_option(top, defaults=True)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    agents = commands.add_parser("agents", help="the agents this gateway holds")
    which = agents.add_subparsers(dest="agents_command", required=True, metavar="list|get")
    listing = which.add_parser("list", help="list the agents, in order of their ids")
    listing.add_argument(
        "--limit",
        type=_int_range(1, MAX_PAGE),
        metavar="N",
        help=f"agents per page, 1 to {MAX_PAGE} (default {DEFAULT_PAGE}; {MAX_PAGE} with --all)",
    )
    listing.add_argument("--all", action="store_true", help="every agent, page after page")
    listing.add_argument(
        "--cursor", default="", metavar="ID", help="start after this agent id (the next page)"
    )
    get = which.add_parser("get", help="one agent and its plugins")
    get.add_argument("agent_id", metavar="ID")

    send = commands.add_parser(
        "send",
        help="send a command and print the answers as they come",
        usage="yuzu-gw-ctl send (--all | ID...) PLUGIN ACTION [KEY=VALUE ...] [--timeout S]"
        " [--command-id X] [--final-only]",
        description="Send one command to agents of this gateway (docs/ctl.md).",
        epilog=SEND_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    send.add_argument("--all", action="store_true", help="every agent this gateway holds")
    send.add_argument(
        "--timeout",
        type=_int_range(1, MAX_COMMAND_TIMEOUT_S),
        dest="command_timeout_s",
        metavar="S",
        help="the command's timeout in seconds, 1 to 3600 (default: the gateway's"
        " default_command_timeout_s, 300 unless configured)",
    )
    send.add_argument(
        "--command-id", default="", metavar="X", help="the command id (default: a new UUID)"
    )
    send.add_argument(
        "--final-only", action="store_true", help="print only each target's final answer"
    )
    send.add_argument("words", nargs="+", metavar="WORD", help=argparse.SUPPRESS)

    watch = commands.add_parser("watch", help="print agent connects and disconnects until Ctrl-C")
    watch.add_argument("agent_ids", nargs="*", metavar="ID", help="only these agents")

    completion = commands.add_parser(
        "completion",
        help='print a shell completion script: eval "$(yuzu-gw-ctl completion bash)"',
    )
    completion.add_argument("shell", choices=SHELLS)

    for sub in (listing, get, watch):
        _deadline_option(sub, defaults=False)
    for sub in (listing, get, send, watch):
        _connection_options(sub, defaults=False, env=env)
    return top


def parse(
    argv: Sequence[str],
    new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    env: Mapping[str, str] | None = None,
) -> Invocation:
    """`env` gives the defaults of the connection options (TARGET_ENV, CA_ENV, ...)."""
    p = parser(env)
    args = p.parse_args(argv)
    if (args.cert is None) != (args.key is None):
        p.error(f"--cert and --key go together (also as {CERT_ENV} and {KEY_ENV})")
    host, port = args.target
    connection = Connection(
        host=host,
        port=port,
        timeout_s=args.timeout_s,
        ca=args.ca,
        cert=args.cert,
        key=args.key,
        server_name=args.server_name,
    )
    command: Command
    if args.command == "completion":
        command = Completion(args.shell)
    elif args.command == "agents" and args.agents_command == "list":
        if args.all and args.cursor:
            p.error("--all starts at the first agent; give --cursor without --all")
        command = ListAgents(limit=args.limit, all=args.all, cursor=args.cursor)
    elif args.command == "agents":
        command = GetAgent(args.agent_id)
    elif args.command == "send":
        try:
            agent_ids, plugin, action, parameters = split_send_words(args.words, args.all)
        except ValueError as exc:
            p.error(f"send: {exc}")
        command = Send(
            agent_ids=agent_ids,
            plugin=plugin,
            action=action,
            parameters=parameters,
            timeout_s=args.command_timeout_s,
            command_id=args.command_id or new_id(),
            final_only=args.final_only,
        )
    else:
        command = Watch(tuple(args.agent_ids))
    return Invocation(connection=connection, command=command, json=args.json)


# -- requests ----------------------------------------------------------------------------------


def list_request(command: ListAgents, cursor: str) -> ListAgentsRequest:
    return ListAgentsRequest(limit=command.page_size, cursor=cursor)


def send_request(command: Send) -> SendCommandRequest:
    return SendCommandRequest(
        agent_ids=list(command.agent_ids),
        timeout_seconds=command.timeout_s or 0,
        command=CommandRequest(
            command_id=command.command_id,
            plugin=command.plugin,
            action=command.action,
            parameters=dict(command.parameters),
        ),
    )
