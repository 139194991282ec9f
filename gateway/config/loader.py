"""Boot-time loading: the config file and vm.args to a typed `Config` and `NodeArgs`.

The config file has the shape Erlang's `-config` wants: exactly one term, a list of
`{Application, [{Key, Value}, ...]}`. This gateway reads the `yuzu_gw` section through the
schema and ignores every other section with one INFO line, except a leftover `grpcbox`
servers or client block, which the manual refuses before anything binds (nothing would
read it, so the listeners or channel the operator meant would silently be missing).

Everything that is wrong raises `BootRefused` with a named defect; the caller logs it with
`gateway.config.refusal.log_refusal` and exits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import attrs

from gateway.config.closed import CONFIG_SHAPE, DUPLICATE_KEYS
from gateway.config.config import Config
from gateway.config.cookie import check_distribution_cookie
from gateway.config.errors import TermSyntaxError
from gateway.config.keys import SCHEMA
from gateway.config.keys.cluster import CLUSTER_SEED_DNS_NAME, CLUSTER_SEED_NODES
from gateway.config.keys.node import NODE_NAME
from gateway.config.local_host import advertise_node
from gateway.config.redact import shown_value
from gateway.config.refusal import BootRefused
from gateway.config.resolve import CONFIG_LOGGER, resolve_section
from gateway.config.section import Schema
from gateway.config.terms import Atom, Term, read_term_file
from gateway.config.vm_args import CONFIG_UNREADABLE, NodeArgs, parse_vm_args

CONFIG_PATH_VAR = "YUZU_GW_CONFIG"
VM_ARGS_PATH_VAR = "YUZU_GW_VM_ARGS"

# gateway/config/loader.py -> the project root, which holds sys_config/.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = Path("sys_config") / "sys.config"
SHIPPED_VM_ARGS = Path("sys_config") / "vm.args"

CONFIG_SYNTAX = "config_syntax"
LEGACY_GRPCBOX_CONFIG = "legacy_grpcbox_config"

log = logging.getLogger(CONFIG_LOGGER)


@attrs.frozen
class ConfigPaths:
    config: Path
    vm_args: Path


def default_paths(env: Mapping[str, str], root: Path = PROJECT_ROOT) -> ConfigPaths:
    """YUZU_GW_CONFIG, else sys_config/sys.config; YUZU_GW_VM_ARGS, else sys_config/vm.args.
    Relative paths are taken from `root`."""
    config = Path(env.get(CONFIG_PATH_VAR) or SHIPPED_CONFIG)
    vm_args = Path(env.get(VM_ARGS_PATH_VAR) or SHIPPED_VM_ARGS)
    return ConfigPaths(config=root / config, vm_args=root / vm_args)


def load(config_path: Path, vm_args_path: Path, env: Mapping[str, str]) -> tuple[Config, NodeArgs]:
    """Read, validate and resolve both files, then run the cookie guard.

    `node_name` in the config file, when set, wins over vm.args' -name."""
    config = load_config(config_path, env)
    node = parse_vm_args(vm_args_path, env)
    configured_name = config[NODE_NAME]
    if configured_name is not None:
        node = attrs.evolve(
            node, name=configured_name, name_source="config node_name", advertise=False
        )
    else:
        # `-name yuzu_gw@${YUZU_GW_ADVERTISE_ADDR}`: its host found now (docs/cluster.md).
        node = advertise_node(node, config[CLUSTER_SEED_NODES], config[CLUSTER_SEED_DNS_NAME])
    check_distribution_cookie(node, env)
    return config, node


def load_config(path: Path, env: Mapping[str, str], schema: Schema = SCHEMA) -> Config:
    sections = read_sections(path)
    entries: Term = []
    for app, body in sections:
        if app == schema.section:
            entries = body
        elif app == "grpcbox":
            _refuse_grpcbox(body, path)
        else:
            log.info(
                "Ignoring the {%s, [...]} section of %s: this gateway reads only %s",
                app,
                path,
                schema.section,
            )
    return resolve_section(schema, entries, env, str(path))


def read_sections(path: Path) -> list[tuple[str, Term]]:
    """The `(application, entries)` pairs of a config file, shape-checked."""
    try:
        terms = read_term_file(path)
    except OSError as exc:
        raise BootRefused(CONFIG_UNREADABLE, f"cannot read {path}: {exc.strerror}") from None
    except TermSyntaxError as exc:
        raise BootRefused(CONFIG_SYNTAX, str(exc)) from None
    if len(terms) != 1 or not isinstance(terms[0], list):
        raise BootRefused(
            CONFIG_SHAPE,
            f"{path} must hold exactly one term, a list [{{App, [{{Key, Value}}, ...]}}, ...]."
            f" It holds {len(terms)} term(s)",
        )
    sections: list[tuple[str, Term]] = []
    for item in terms[0]:
        if isinstance(item, str):
            # Erlang lets a sys.config name other config files; nothing here reads them.
            raise BootRefused(CONFIG_SHAPE, f"{path} names another config file; not supported")
        if not (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[0], Atom)
            and isinstance(item[1], list)
        ):
            raise BootRefused(
                CONFIG_SHAPE,
                f"{path} holds {shown_value(item)} where an {{App, [...]}} section belongs",
            )
        sections.append((item[0].name, item[1]))
    apps = [app for app, _ in sections]
    twice = sorted({a for a in apps if apps.count(a) > 1})
    if twice:
        raise BootRefused(
            DUPLICATE_KEYS, f"{path} has more than one section for {', '.join(twice)}"
        )
    return sections


def _refuse_grpcbox(body: Term, path: Path) -> None:
    keys = {k.name for k, _ in _pairs(body)}
    legacy = sorted(keys & {"servers", "client"})
    if legacy:
        raise BootRefused(
            LEGACY_GRPCBOX_CONFIG,
            f"{path} has a {{grpcbox, [{{{legacy[0]}, _}}]}} block, which nothing reads: move"
            " servers to {yuzu_gw, [{grpc_listeners, [...]}]} and client to"
            " {yuzu_gw, [{upstream_client, ...}]}",
        )
    log.info("Ignoring the {grpcbox, [...]} section of %s: nothing reads it", path)


def _pairs(body: Term) -> list[tuple[Atom, Term]]:
    if not isinstance(body, list):
        return []
    return [
        (item[0], item[1])
        for item in body
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Atom)
    ]
