"""Parsers for `YUZU_GW_*` variables: environment text to an Erlang-shaped term.

The key's converter then checks the term exactly as it checks a value from the file, so a
variable and a setting cannot disagree about what is valid.
"""

from __future__ import annotations

import os
import re

from gateway.config.converters import BadValue
from gateway.config.terms import Term

_INTEGER = re.compile(r"[+-]?[0-9]+")


def env_integer(text: str) -> Term:
    if not _INTEGER.fullmatch(text.strip()):
        raise BadValue("an integer")
    return int(text.strip())


def original_bytes(text: str) -> bytes:
    """The bytes the variable held before Python decoded it.

    Python decodes the environment with the file-system encoding and `surrogateescape`, so
    bytes that were not valid in it survive as lone surrogates and `os.fsencode` gives them
    back. Unlike the BEAM, this works on a UTF-8 node as well as a latin1 one, so invalid
    bytes are refused whatever the locale. A surrogate that did not come from such an escape
    cannot be encoded at all and is refused too."""
    try:
        return os.fsencode(text)
    except UnicodeEncodeError:
        raise BadValue("UTF-8 text", "cannot be represented as UTF-8") from None


def env_utf8_text(text: str) -> Term:
    """Text whose original bytes are valid UTF-8, handed on as a UTF-8 binary."""
    raw = original_bytes(text)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadValue("UTF-8 text", "cannot be represented as UTF-8") from None
    return raw


def env_comma_list(text: str) -> Term:
    """`10.0.0.1,10.0.0.2` -> a list of UTF-8 binaries; blanks around items and empty items
    (a trailing comma) are dropped."""
    items = [item.strip() for item in text.split(",")]
    return [env_utf8_text(item) for item in items if item]
