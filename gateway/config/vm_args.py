"""`vm.args`: the node's name and distribution cookie, as a relx release passes them to erl.

The file is what relx renders from `vm.args.src`: `${VAR}` is replaced by the variable's value
(empty when unset), then the text is read like erl's `-args_file`: `#` starts a comment,
arguments are separated by blanks. This gateway reads three flags and ignores the rest:

    -name yuzu_gw@127.0.0.1         the node name (long form)
    -sname yuzu_gw                  the node name (short form; the host is this host's name)
    -setcookie ${YUZU_GW_COOKIE}    the distribution cookie

`-name yuzu_gw@${YUZU_GW_ADVERTISE_ADDR}` (the Erlang release's line) leaves the host to the
advertise address: the variable when set, else found at boot (gateway/config/advertise.py),
so with the variable unset the host is empty here instead of refused.

Emulator flags (`+K true`, `+A 64`) and other `-` flags mean nothing to a Python node and are
skipped. A flag's value must be on the flag's line: `-setcookie ${YUZU_GW_COOKIE}` with the
variable unset leaves `-setcookie` alone on its line, which is the "unset" case the manual
describes (the historical default cookie, which the guard then refuses).
"""

from __future__ import annotations

import enum
import re
import socket
from collections.abc import Mapping
from pathlib import Path

import attrs

from gateway.config.advertise import ADVERTISE_VAR
from gateway.config.refusal import BootRefused

# The cookie an unset YUZU_GW_COOKIE falls back to. It is public (it was in the Erlang
# gateway's repository), which is exactly why check_distribution_cookie refuses it.
HISTORICAL_DEFAULT_COOKIE = "yuzu_gw_default_cookie"

# A vm.args without -name or -sname: the shipped file's name, on loopback only.
DEFAULT_NODE_NAME = "yuzu_gw@127.0.0.1"

INVALID_NODE_NAME = "invalid_node_name"
BAD_VM_ARGS = "bad_vm_args"
CONFIG_UNREADABLE = "config_unreadable"

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NODE_NAME = re.compile(r"[A-Za-z0-9_-]+@[A-Za-z0-9_.:-]+")
_NAME_PART = re.compile(r"[A-Za-z0-9_-]+")
_ADVERTISED_NAME = re.compile(r"-s?name\s+[A-Za-z0-9_-]+@\$\{" + ADVERTISE_VAR + r"\}")


class CookieSource(enum.Enum):
    """Where the cookie came from; names a refusal without naming the cookie."""

    ENV = "environment"  # a ${VAR} on the -setcookie line, set and non-empty
    VM_ARGS = "vm.args"  # written literally in the file
    DEFAULT = "historical default"  # no -setcookie value at all


@attrs.frozen
class NodeArgs:
    """The node's distribution identity. `cookie` is left out of repr: a repr ends up in
    crash reports and console output, and the cookie is the node's only authentication."""

    name: str
    name_source: str
    cookie: str = attrs.field(repr=False)
    cookie_source: CookieSource
    cookie_variables: tuple[str, ...]  # the ${VAR}s on the -setcookie line
    path: str
    # The -name line is `short@${YUZU_GW_ADVERTISE_ADDR}`: its host is the advertise address.
    advertise: bool = False
    # Node `index` of the `host_nodes` the release runs on this host (gateway/node/multinode.py).
    index: int = 1
    host_nodes: int = 1

    @property
    def short_name(self) -> str:
        """The name before `@`: what the node's run files are called."""
        return self.name.split("@", 1)[0]


def substitute(text: str, env: Mapping[str, str]) -> tuple[str, tuple[str, ...]]:
    """Replace each `${VAR}` with its value (empty when unset), as relx does for `.src`
    files. Returns the text and the names of the variables it used."""
    used: list[str] = []

    def value(match: re.Match[str]) -> str:
        used.append(match.group(1))
        return env.get(match.group(1), "")

    return _VARIABLE.sub(value, text), tuple(used)


def _strip_comment(line: str) -> str:
    # erl's args file: `#` to the end of the line is a comment.
    return line.split("#", 1)[0]


def parse_vm_args(path: Path, env: Mapping[str, str]) -> NodeArgs:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        raise BootRefused(CONFIG_UNREADABLE, f"cannot read vm.args {path}: {reason}") from None
    name: str | None = None
    name_source = "default"
    advertise = False
    cookie: str | None = None
    cookie_source = CookieSource.DEFAULT
    cookie_variables: tuple[str, ...] = ()
    for number, raw_line in enumerate(text.splitlines(), start=1):
        line, used = substitute(raw_line, env)
        args = _strip_comment(line).split()
        i = 0
        while i < len(args):
            flag = args[i]
            value = args[i + 1] if i + 1 < len(args) else None
            if flag in ("-name", "-sname"):
                if value is None:
                    raise BootRefused(BAD_VM_ARGS, f"{path}:{number}: {flag} without a name")
                advertise = bool(_ADVERTISED_NAME.fullmatch(_strip_comment(raw_line).strip()))
                if not (advertise and value.endswith("@")):
                    value = _full_name(value, flag, f"{path}:{number}")
                name, name_source = value, f"vm.args {flag}"
                i += 2
            elif flag == "-setcookie":
                cookie_variables = used
                if value is None:
                    cookie, cookie_source = None, CookieSource.DEFAULT
                else:
                    cookie = value
                    cookie_source = CookieSource.ENV if used else CookieSource.VM_ARGS
                i += 2
            else:
                i += 1
    return NodeArgs(
        name=name or DEFAULT_NODE_NAME,
        name_source=name_source,
        cookie=cookie if cookie is not None else HISTORICAL_DEFAULT_COOKIE,
        cookie_source=cookie_source,
        cookie_variables=cookie_variables,
        path=str(path),
        advertise=advertise,
    )


def _full_name(value: str, flag: str, where: str) -> str:
    """`name@host`; a bare name gets this host's name, as erl does."""
    if "@" not in value and _NAME_PART.fullmatch(value):
        host = socket.gethostname()
        value = f"{value}@{host.split('.')[0] if flag == '-sname' else host}"
    if not _NODE_NAME.fullmatch(value):
        # The name is not a secret, but it may be a half-substituted variable; the line says
        # where to look.
        raise BootRefused(INVALID_NODE_NAME, f"{where}: {flag} is not a node name name@host")
    return value
