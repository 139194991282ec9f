"""The schema of one application section: its keys, the dead keys old configs may carry, the
look-alike variables that change nothing, and the whole-config checks.

The key set is closed: a name that is neither a `Key` nor a declared dead key refuses boot
with `unknown_keys` (`resolve.py`). A check reads the resolved `Config`, so this module sits
above `config.py`, and `schema.py` (one key's declaration) below it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from gateway.config.config import Config
from gateway.config.schema import Key


@attrs.frozen
class DeadKeys:
    """Key names that old configs carry and nothing reads: accepted, logged once at INFO."""

    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    doc: str = ""

    def matches(self, name: str) -> bool:
        return name in self.names or name.startswith(self.prefixes)


# A whole-config rule that runs after every key is resolved: it may raise BootRefused, log,
# or return a Config with adjusted values (a later issue's YUZU_GW_AGENT_PORT rewrites a field
# inside grpc_listeners this way).
Check = Callable[[Config, Mapping[str, str]], Config]


@attrs.frozen
class NoEffectVariable:
    """A variable that looks like an override but changes nothing: warned about when set."""

    var: str
    doc: str


def _unique_names(_instance: Schema, _attribute: object, keys: tuple[Key[Any], ...]) -> None:
    names = [k.name for k in keys]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"keys declared twice: {', '.join(duplicates)}")
    variables = [k.env.var for k in keys if k.env is not None]
    if len(variables) != len(set(variables)):
        raise ValueError("an environment variable overrides two keys")


@attrs.frozen
class Schema:
    """Every declaration of one application section, in documentation order."""

    section: str
    keys: tuple[Key[Any], ...] = attrs.field(validator=_unique_names)
    dead: DeadKeys = DeadKeys()
    no_effect_env: tuple[NoEffectVariable, ...] = ()
    checks: tuple[Check, ...] = ()

    def key(self, name: str) -> Key[Any]:
        for key in self.keys:
            if key.name == name:
                return key
        raise KeyError(name)

    def accepts(self, name: str) -> bool:
        return any(k.name == name for k in self.keys) or self.dead.matches(name)
