"""What a log line may say about a configured value.

The manual's rule ("Bad values replaced by defaults"): an integer is printed as it is, an atom
by name, and anything else only by its type, because a config file keeps SSL options and key
paths beside tuning values and a warning must not copy them into the log.
"""

from __future__ import annotations

from gateway.config.terms import Atom, ExternalFun, Term, format_atom

# In Erlang a string is a list, so "4" reads "a list", as the manual's example says.
_TYPE_NAMES: tuple[tuple[type, str], ...] = (
    (float, "a float"),
    (str, "a list"),
    (list, "a list"),
    (bytes, "a binary"),
    (tuple, "a tuple"),
    (dict, "a map"),
    (ExternalFun, "a fun"),
)


def shown_value(term: Term) -> str:
    """The value itself for an integer or an atom, otherwise only the name of its type."""
    if isinstance(term, bool):
        return "true" if term else "false"
    if isinstance(term, int):
        return str(term)
    if isinstance(term, Atom):
        return format_atom(term.name)
    for kind, name in _TYPE_NAMES:
        if isinstance(term, kind):
            return name
    return "a term"
