"""Converters: from an Erlang term in the config file to the typed value the gateway reads.

A converter is a callable `term -> value` with an `expected` phrase ("an integer from 100 to
60000") that completes the sentence "... is X, not <expected>" in warnings, refusals and the
generated documentation. It raises `BadValue` for a term it cannot take; what happens then
(a refusal or the default) is the key's decision, not the converter's.

Structured keys (listeners, the upstream client) bring their own converters; they may raise
`BootRefused` directly for defects that the specification names.
"""

from __future__ import annotations

import re
from typing import Any, Protocol, TypeVar

import attrs

from gateway.config.codepoints import MAX_CODE_POINT, SURROGATES
from gateway.config.terms import Atom, Term

T_co = TypeVar("T_co", covariant=True)


class BadValue(Exception):
    """The term is not what the key takes.

    `expected` completes "is X, not <expected>"; `reason`, when given, replaces that phrase
    for a term of the right type that still cannot be used ("cannot be represented as UTF-8").
    Neither ever holds the value itself."""

    def __init__(self, expected: str, reason: str | None = None) -> None:
        super().__init__(reason or f"not {expected}")
        self.expected = expected
        self.reason = reason


class Converter(Protocol[T_co]):
    @property
    def expected(self) -> str: ...

    def __call__(self, term: Term) -> T_co: ...


@attrs.frozen
class IntRange:
    """An integer in `[low, high]` (`high=None`: no upper bound). Booleans are atoms in
    Erlang, so `true` is not the integer 1 here either."""

    low: int
    high: int | None = None
    note: str = ""  # a short remark for the docs, e.g. what 0 means

    @property
    def expected(self) -> str:
        text = (
            f"an integer from {self.low} to {self.high}"
            if self.high is not None
            else f"an integer of at least {self.low}"
        )
        return f"{text} ({self.note})" if self.note else text

    def __call__(self, term: Term) -> int:
        if (
            isinstance(term, bool)
            or not isinstance(term, int)
            or term < self.low
            or (self.high is not None and term > self.high)
        ):
            raise BadValue(self.expected)
        return term


@attrs.frozen
class Boolean:
    expected: str = "true or false"

    def __call__(self, term: Term) -> bool:
        if not isinstance(term, bool):
            raise BadValue(self.expected)
        return term


@attrs.frozen
class LiteralTrue:
    """Only the atom `true` turns the setting on; any other value counts as unset (the
    manual's rule for the test-only acknowledgements), so this never raises."""

    expected: str = "the atom true (anything else counts as unset)"

    def __call__(self, term: Term) -> bool:
        return term is True


def text_of(term: Term, expected: str) -> str:
    """A name written as a binary (must be valid UTF-8 already) or as a string of code
    points (a list of integers in Erlang, so `[]` is the empty string).

    This is the manual's cluster_id rule: `<<"Z\\x{FC}rich">>` is the single byte 16#FC and
    is refused; `"Z\\x{FC}rich"` and `<<"Z\\x{FC}rich"/utf8>>` are the same name."""
    unusable = "cannot be represented as UTF-8"
    if isinstance(term, bytes):
        try:
            # Python's strict decoder refuses surrogates and anything above 16#10FFFF, like
            # unicode:characters_to_binary/1.
            return term.decode("utf-8")
        except UnicodeDecodeError:
            raise BadValue(expected, unusable) from None
    if isinstance(term, list):
        code_points = [cp for cp in term if isinstance(cp, int) and not isinstance(cp, bool)]
        if len(code_points) != len(term):
            raise BadValue(expected)
        if any(not 0 <= cp <= MAX_CODE_POINT for cp in code_points):
            raise BadValue(expected, unusable)
        term = "".join(chr(cp) for cp in code_points)
    if isinstance(term, str):
        if any(ord(ch) in SURROGATES for ch in term):
            raise BadValue(expected, unusable)
        return term
    raise BadValue(expected)


@attrs.frozen
class Utf8Text:
    """A UTF-8 binary or a string; the value is a `str`."""

    allow_empty: bool = True

    @property
    def expected(self) -> str:
        empty = "" if self.allow_empty else "non-empty "
        return f'a {empty}UTF-8 binary (<<"..."/utf8>>) or a string'

    def __call__(self, term: Term) -> str:
        text = text_of(term, self.expected)
        if not text and not self.allow_empty:
            raise BadValue(self.expected)
        return text


# A host name or an IPv4 address: letters, digits, `-`, `_` and dots, nothing that a
# resolver would have to guess about (no blanks, no commas from a mistyped list).
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?")


@attrs.frozen
class HostName:
    expected: str = "a host name or IPv4 address as a binary or a string"

    def __call__(self, term: Term) -> str:
        text = text_of(term, self.expected)
        if not _HOST.fullmatch(text):
            raise BadValue(self.expected)
        return text


@attrs.frozen
class HostList:
    """A list of host names or IPv4 addresses, each a binary, a string or `{A,B,C,D}`."""

    expected: str = "a list of host names or IPv4 addresses (binaries, strings or {A,B,C,D})"

    def __call__(self, term: Term) -> tuple[str, ...]:
        if not isinstance(term, list):
            raise BadValue(self.expected)
        hosts: list[str] = []
        for item in term:
            if isinstance(item, tuple) and len(item) == 4:
                if not all(
                    isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255 for b in item
                ):
                    raise BadValue(self.expected)
                hosts.append(".".join(str(b) for b in item))
            else:
                hosts.append(HostName(self.expected)(item))
        return tuple(hosts)


# `name@host` as Erlang node names are written; the host part may be an address.
_NODE_NAME = re.compile(r"[A-Za-z0-9_-]+@[A-Za-z0-9_.:-]+")


@attrs.frozen
class NodeName:
    """`name@host` as an atom or a text; the atom `undefined` means "take it from vm.args"."""

    expected: str = "a node name name@host (atom, binary or string) or undefined"

    def __call__(self, term: Term) -> str | None:
        if term == Atom("undefined"):
            return None
        text = term.name if isinstance(term, Atom) else text_of(term, self.expected)
        if not _NODE_NAME.fullmatch(text):
            raise BadValue(self.expected)
        return text


@attrs.frozen
class OrUndefined:
    """`inner`, or the atom `undefined` (read as None) for a default that another setting
    decides, such as the replay cap that is half of the register pool unless set."""

    inner: IntRange

    @property
    def expected(self) -> str:
        return f"{self.inner.expected}, or undefined"

    def __call__(self, term: Term) -> int | None:
        if term == Atom("undefined"):
            return None
        try:
            return self.inner(term)
        except BadValue:
            raise BadValue(self.expected) from None


@attrs.frozen
class AnyTerm:
    """Accepts every term unchanged: for keys that nothing reads."""

    expected: str = "any term"

    def __call__(self, term: Term) -> Any:
        return term
