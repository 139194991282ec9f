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
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from protos.yuzu.server.v1 import management_pb2

__all__ = [
    "DEFAULT_TARGET",
    "DEFAULT_TIMEOUT_S",
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


@attrs.frozen
class Watch:
    agent_ids: tuple[str, ...] = ()  # empty: every agent


Command = ListAgents | GetAgent | Send | Watch


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


def _connection_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """The connection options; on the subcommands without defaults, so that one given before
    the command words is not overwritten by the subcommand's default."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--target",
        type=parse_target,
        default=default(parse_target(DEFAULT_TARGET)),
        metavar="HOST:PORT",
        help=f"the management listener (default {DEFAULT_TARGET}, the dev config's)",
    )
    parser.add_argument(
        "--ca",
        type=Path,
        default=default(None),
        metavar="FILE",
        help="TLS: the CA that issued the gateway's certificate (the install CA)",
    )
    parser.add_argument(
        "--cert",
        type=Path,
        default=default(None),
        metavar="FILE",
        help="TLS: this client's certificate (the Yuzu server's: docs/mgmt-auth.md)",
    )
    parser.add_argument(
        "--key", type=Path, default=default(None), metavar="FILE", help="TLS: its private key"
    )
    parser.add_argument(
        "--server-name",
        default=default(None),
        metavar="NAME",
        help="TLS: the name to verify the gateway's certificate against (default: the host)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
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


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="yuzu-gw-ctl",
        description="Operate a Yuzu gateway through its management listener (docs/ctl.md).",
        epilog="Exit status: 0 done; 1 the gateway answered an error or no answer in time;"
        " 2 usage; 3 no connection, TLS failed or not authorised; 4 send: a target did not"
        " answer SUCCESS; 130 interrupted.",
    )
    _connection_options(top, defaults=True)
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
        " [--command-id X]",
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
    send.add_argument("words", nargs="+", metavar="WORD", help=argparse.SUPPRESS)

    watch = commands.add_parser("watch", help="print agent connects and disconnects until Ctrl-C")
    watch.add_argument("agent_ids", nargs="*", metavar="ID", help="only these agents")

    for sub in (listing, get, watch):
        _deadline_option(sub, defaults=False)
    for sub in (listing, get, send, watch):
        _connection_options(sub, defaults=False)
    return top


def parse(argv: Sequence[str], new_id: Callable[[], str] = lambda: uuid.uuid4().hex) -> Invocation:
    p = parser()
    args = p.parse_args(argv)
    if (args.cert is None) != (args.key is None):
        p.error("--cert and --key go together")
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
    if args.command == "agents" and args.agents_command == "list":
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
        )
    else:
        command = Watch(tuple(args.agent_ids))
    return Invocation(connection=connection, command=command, json=args.json)


# -- requests ----------------------------------------------------------------------------------


def list_request(command: ListAgents, cursor: str) -> management_pb2.ListAgentsRequest:
    return management_pb2.ListAgentsRequest(limit=command.page_size, cursor=cursor)


def send_request(command: Send) -> management_pb2.SendCommandRequest:
    request = management_pb2.SendCommandRequest(
        agent_ids=command.agent_ids, timeout_seconds=command.timeout_s or 0
    )
    request.command.command_id = command.command_id
    request.command.plugin = command.plugin
    request.command.action = command.action
    request.command.parameters.update(dict(command.parameters))
    return request
