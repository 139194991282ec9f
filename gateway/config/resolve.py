"""Applying a `Schema` to one parsed section and the environment: values, logs, refusals.

Order for each key, the first that applies wins:

1. its `YUZU_GW_*` variable, when set and non-empty (an empty variable counts as unset, the
   way compose files blank a variable they do not want);
2. the value in the file;
3. the declared default.

Only the source in use is checked: when the variable is set it replaces the setting, so a bad
setting underneath is not reported (the manual's cluster_id rule, applied to every key).

What gets logged (logger `yuzu_gw.config`), one line each:

- INFO `ENV override: VAR=value replaces key` when a variable applies (`VAR replaces key
  (value not logged)` for a secret key);
- WARNING for a bad value replaced by the default, printing the value only when it is an
  integer or an atom (see `redact.py`);
- WARNING `ENV override: VAR ...; ignoring it` for a variable whose text is unusable;
- WARNING `VAR is set but has no effect` for the declared look-alike variables;
- INFO naming the dead keys present.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from gateway.config.closed import proplist, refuse_unknown
from gateway.config.config import Config
from gateway.config.converters import BadValue
from gateway.config.redact import shown_value
from gateway.config.refusal import BootRefused
from gateway.config.schema import Key, Refuse, Source
from gateway.config.section import Schema
from gateway.config.terms import Atom, Term, format_term

CONFIG_LOGGER = "yuzu_gw.config"
log = logging.getLogger(CONFIG_LOGGER)

_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")


def resolve_section(
    schema: Schema, entries: Term, env: Mapping[str, str], path: str = "<defaults>"
) -> Config:
    """The typed config of `schema.section` from its `[{key, Value}]` list in the file."""
    where = f"{{{schema.section}, [...]}} in {path}"
    pairs = dict(proplist(entries, where))
    unknown = [name for name in pairs if not schema.accepts(name)]
    if unknown:
        raise refuse_unknown(schema.section, [Atom(n) for n in unknown])
    declared = {k.name for k in schema.keys}
    dead = sorted(n for n in pairs if n not in declared)
    if dead:
        log.info(
            "%s keys that nothing reads (no effect, accepted for old configs): %s",
            schema.section,
            ", ".join(dead),
        )

    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for key in schema.keys:
        values[key.name], sources[key.name] = _resolve_key(schema.section, key, pairs, env)

    for variable in schema.no_effect_env:
        if env.get(variable.var):
            log.warning("%s is set but has no effect", variable.var)

    config = Config(values=values, sources=sources, path=path)
    for check in schema.checks:
        config = check(config, env)
    return config


def _resolve_key(
    section: str, key: Key[Any], pairs: Mapping[str, Term], env: Mapping[str, str]
) -> tuple[Any, Source]:
    if key.env is not None and env.get(key.env.var):
        return _from_env(section, key, env[key.env.var])
    if key.name in pairs:
        try:
            return key.convert(pairs[key.name]), Source.APP_ENV
        except BadValue as bad:
            return _bad_file_value(section, key, pairs[key.name], bad), Source.DEFAULT
    return key.default_value, Source.DEFAULT


def _from_env(section: str, key: Key[Any], text: str) -> tuple[Any, Source]:
    assert key.env is not None
    var = key.env.var
    try:
        value = key.convert(key.env.parse(text))
    except BadValue as bad:
        return _bad_env_value(section, key, text, bad), Source.DEFAULT
    if key.secret:
        log.info("ENV override: %s replaces %s (value not logged)", var, key.name)
    else:
        log.info("ENV override: %s=%s replaces %s", var, text, key.name)
    return value, Source.ENV


def _what_is_wrong(key: Key[Any], shown: str | None, bad: BadValue) -> str:
    """`is 50, not an integer from 100 to 60000` / `cannot be represented as UTF-8`; the
    key's own `expected`, not the parser's, since that is what the operator must write."""
    if bad.reason:
        return bad.reason
    expected = key.convert.expected
    return f"is {shown}, not {expected}" if shown is not None else f"is not {expected}"


def _bad_file_value(section: str, key: Key[Any], term: Term, bad: BadValue) -> Any:
    if isinstance(key.on_bad, Refuse):
        wrong = _what_is_wrong(key, None, bad)
        raise _refusal(section, key, Source.APP_ENV, wrong)
    wrong = _what_is_wrong(key, None if key.secret else shown_value(term), bad)
    log.warning(
        "%s %s %s; the default %s is used instead (docs/configuration.md)",
        section,
        key.name,
        wrong,
        _default_text(key),
    )
    return key.default_value


def _default_text(key: Key[Any]) -> str:
    # A default decided elsewhere ("half of upstream_register_concurrency") reads better than
    # the `undefined` that stands for it in the declaration.
    return f"({key.default_doc})" if key.default_doc else format_term(key.default)


def _bad_env_value(section: str, key: Key[Any], text: str, bad: BadValue) -> Any:
    assert key.env is not None
    var = key.env.var
    # Environment text is echoed only when it is a plain integer: anything else could be a
    # mistyped secret or path, and the manual's rule prints integers and atoms only.
    if isinstance(key.on_bad, Refuse):
        wrong = _what_is_wrong(key, None, bad)
        log.warning("ENV override: %s %s; ignoring it", var, wrong)
        raise _refusal(section, key, Source.ENV, wrong)
    shown = text.strip() if _INTEGER_TEXT.fullmatch(text.strip()) and not key.secret else None
    wrong = _what_is_wrong(key, shown, bad)
    log.warning(
        "ENV override: %s %s; ignoring it, the default %s is used for %s",
        var,
        wrong,
        _default_text(key),
        key.name,
    )
    return key.default_value


def _refusal(section: str, key: Key[Any], source: Source, wrong: str) -> BootRefused:
    # `wrong` was built without the value: a refusal names the key and the source and says
    # what is wrong, never what was written.
    assert isinstance(key.on_bad, Refuse)
    named = key.env.var if source is Source.ENV and key.env is not None else "the config file"
    return BootRefused(
        key.on_bad.defect,
        f"{section} {key.name} from {named} {wrong}",
        context=(source.value,) if key.on_bad.with_source else (),
    )
