"""Declarations of the `yuzu_gw` configuration: what each key is and what a bad value does.

Rules of this module:

- It declares; it does not read files, the environment or log. `resolve.py` applies a
  `Schema` to a parsed section and `docs.py` renders it, so the documentation and the
  behaviour come from the same declaration.
- A key's default is written as the Erlang term an operator would write (`<<"default">>`),
  and is run through the key's own converter when the key is declared, so a declaration with
  a default its converter refuses fails at import, not at some boot.
- One key at a time: the closed key set of a section, its dead keys and whole-config checks
  are its `Schema` (`section.py`), which sits above the resolved `Config` it checks.

To add a key, declare a `Key` in the area module under `gateway/config/keys/` and list it in
that module's `KEYS`; then run `python -m gateway.config.docs --write` to refresh the table in
`docs/configuration.md` (a test fails while it is stale).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import attrs

from gateway.config.converters import Converter
from gateway.config.terms import Term

T = TypeVar("T")


class Source(enum.Enum):
    """Where a value came from. The values are the atoms the manual uses in defect terms
    (`{invalid_cluster_id, app_env}`)."""

    DEFAULT = "default"
    APP_ENV = "app_env"  # the config file, Erlang's application environment
    ENV = "env"  # a YUZU_GW_* environment variable


class NameOrigin(enum.Enum):
    """Whose name a key carries. The manual's key tables were stripped, so some settings it
    describes have no name in the text; this gateway chose those, and the docs say so."""

    SEED = "manual"
    OURS = "ours"


@attrs.frozen
class UseDefault:
    """A bad value is replaced by the default with one WARNING naming the key (the manual's
    "Bad values replaced by defaults": a typo in a tuning value must not stop every gateway
    that shares the file at its next restart)."""

    def describe(self) -> str:
        return "WARN naming the key; the default is used"


@attrs.frozen
class Refuse:
    """A bad value refuses boot with `defect`; with `with_source` the defect term also names
    where the value came from, `{Defect, env}` or `{Defect, app_env}`."""

    defect: str
    with_source: bool = False

    def describe(self) -> str:
        term = f"{{{self.defect}, env | app_env}}" if self.with_source else self.defect
        return f"refuse boot `{term}`"


OnBad = UseDefault | Refuse
USE_DEFAULT = UseDefault()


@attrs.frozen
class EnvOverride:
    """A `YUZU_GW_*` variable that replaces the key when set and non-empty.

    `parse` turns the text into a term (raising `BadValue`), which then goes through the key's
    converter, so the variable gets the same range check as the file."""

    var: str
    parse: Callable[[str], Term]
    form: str  # how the docs describe the text, e.g. "an integer"
    origin: NameOrigin = NameOrigin.SEED  # OURS when the manual names no variable


def _default_value(key: Key[Any]) -> Any:
    return key.convert(key.default)


# Identity equality: a key is declared once, and a default such as [] would make a generated
# hash fail the first time a key went into a set.
@attrs.frozen(eq=False)
class Key(Generic[T]):
    """One setting of the `yuzu_gw` section.

    `secret`: the value is never echoed, not even in an ENV override line.
    `effect=False`: a dead key, accepted for old configs and read by nothing.
    `our_choices` names what the manual leaves open and this gateway decided for a key the
    manual does name: "default", "valid values" (the range or form) and/or "bad value" (what
    a bad value does); the docs print it beside the name's origin.
    `default_doc` / `bad_doc` replace the generated text in the docs where the generic words
    would mislead (a default derived from vm.args, a converter that never refuses).
    """

    name: str
    default: Term
    convert: Converter[T]
    read_when: str
    doc: str
    area: str
    on_bad: OnBad = USE_DEFAULT
    env: EnvOverride | None = None
    origin: NameOrigin = NameOrigin.SEED
    secret: bool = False
    effect: bool = True
    our_choices: tuple[str, ...] = ()
    default_doc: str = ""
    bad_doc: str = ""
    default_value: T = attrs.field(
        init=False, default=attrs.Factory(_default_value, takes_self=True)
    )
