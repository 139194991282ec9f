"""Configuration of the gateway: Erlang-term config files, `YUZU_GW_*` overrides, vm.args.

Public API:

    load(config_path, vm_args_path, env) -> (Config, NodeArgs)    the boot entry point
    default_paths(env) -> ConfigPaths                               YUZU_GW_CONFIG / _VM_ARGS
    config[KEY]                                                     a typed value, e.g.
        config[heartbeat.HEARTBEAT_BATCH_INTERVAL_MS] -> int
    check_distribution_cookie(node_args, env)                       the cookie guard
    parse_term / parse_terms / format_term                          Erlang term syntax
    closed_map(term, allowed, where)                                closed key sets of maps
    docs.render_keys_table(schema)                                  the docs table

Modules: `lexer` and `terms` (syntax), `converters` (term -> typed value), `schema` (Key
declarations), `config` (the resolved object), `section` (a section's `Schema`: its keys and
whole-config checks), `keys/` (the declarations per area), `resolve` (applying them, logging),
`env` (variable parsers), `vm_args`, `cookie`, `advertise` and `local_host` (the node's
identity and name), `loader` (files), `docs` (the generated table).

The values of the structured keys are parsed and checked here too, so that every plane of
gateway/ sits above the configuration it reads and this package imports none of them:
`listener_spec`, `origin_sources` and `listener_overrides` (grpc_listeners), `cluster_seeds`
(cluster_seed_nodes), `mgmt_auth_settings`, `mgmt_auth_boot` and `certs` (mgmt_peer_*).
The one left outside is upstream_client's parser, gateway/config/upstream_client.py.
"""

from gateway.config.closed import closed_map
from gateway.config.config import Config
from gateway.config.cookie import check_distribution_cookie
from gateway.config.errors import TermSyntaxError
from gateway.config.keys import SCHEMA
from gateway.config.loader import ConfigPaths, default_paths, load, load_config
from gateway.config.schema import EnvOverride, Key, NameOrigin, Refuse, Source, UseDefault
from gateway.config.section import Schema
from gateway.config.terms import Atom, ExternalFun, Term, format_term, parse_term, parse_terms
from gateway.config.vm_args import NodeArgs, parse_vm_args

__all__ = [
    "SCHEMA",
    "Atom",
    "Config",
    "ConfigPaths",
    "EnvOverride",
    "ExternalFun",
    "Key",
    "NameOrigin",
    "NodeArgs",
    "Refuse",
    "Schema",
    "Source",
    "Term",
    "TermSyntaxError",
    "UseDefault",
    "check_distribution_cookie",
    "closed_map",
    "default_paths",
    "format_term",
    "load",
    "load_config",
    "parse_term",
    "parse_terms",
    "parse_vm_args",
]
