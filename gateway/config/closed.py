"""Closed key sets: a map or a section may hold only the keys declared for it.

The manual's rule for the `yuzu_gw` section and for each listener entry and its sub-maps: any
other key refuses boot with `unknown_keys`, naming the place and the keys. A misspelt key
that is silently ignored leaves a gateway running with a setting the operator believes is on.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from gateway.config.redact import shown_value
from gateway.config.refusal import BootRefused
from gateway.config.terms import Atom, Term

UNKNOWN_KEYS = "unknown_keys"
DUPLICATE_KEYS = "duplicate_keys"
CONFIG_SHAPE = "config_shape"


def _names(keys: Iterable[Term]) -> str:
    # Atoms by name; any other key only by its type (a string key could be anything).
    return ", ".join(sorted(shown_value(k) for k in keys))


def refuse_unknown(where: str, keys: Iterable[Term]) -> BootRefused:
    return BootRefused(
        UNKNOWN_KEYS,
        f"{where} has keys outside its closed set: {_names(keys)}"
        " (docs/configuration.md lists the keys)",
    )


def closed_map(
    term: Term, allowed: Collection[str], where: str, *, not_a_map: str = CONFIG_SHAPE
) -> dict[str, Term]:
    """The entries of a map whose keys must all be atoms from `allowed`, by name.

    Raises `BootRefused(not_a_map)` when the term is not a map and `unknown_keys` naming
    `where` and the strangers otherwise."""
    if not isinstance(term, dict):
        raise BootRefused(not_a_map, f"{where} must be a map #{{...}}, not {shown_value(term)}")
    unknown = [k for k in term if not (isinstance(k, Atom) and k.name in allowed)]
    if unknown:
        raise refuse_unknown(where, unknown)
    return {k.name: v for k, v in term.items() if isinstance(k, Atom)}


def proplist(entries: Term, where: str) -> list[tuple[str, Term]]:
    """`[{key, Value}, ...]` with atom keys, each key once, as `(name, value)` pairs."""
    if not isinstance(entries, list):
        raise BootRefused(CONFIG_SHAPE, f"{where} must be a list [{{Key, Value}}, ...]")
    pairs: list[tuple[str, Term]] = []
    for entry in entries:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise BootRefused(
                CONFIG_SHAPE,
                f"{where} holds {shown_value(entry)} where a {{key, Value}} pair belongs",
            )
        if not isinstance(entry[0], Atom):
            raise BootRefused(
                CONFIG_SHAPE,
                f"{where} holds a pair whose key is {shown_value(entry[0])}, not an atom",
            )
        pairs.append((entry[0].name, entry[1]))
    names = [name for name, _ in pairs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        # Erlang would keep one of them silently; which one the operator meant is a guess.
        raise BootRefused(DUPLICATE_KEYS, f"{where} sets {', '.join(duplicates)} more than once")
    return pairs
