"""Erlang terms as Python values: the parser for term files and the writer back to syntax.

Theory of operation: `lexer.tokenize` makes tokens; `_Parser` is a recursive-descent parser
over them with one method per production:

    file    := (term '.')*
    term    := ['-' | '+'] number | atom | string+ | '$'char | list | tuple | map | binary
             | 'fun' atom ':' atom '/' integer
    list    := '[' [term (',' term)*] ']'
    tuple   := '{' [term (',' term)*] '}'
    map     := '#' '{' [term '=>' term (',' term '=>' term)*] '}'
    binary  := '<<' [segment (',' segment)*] '>>'
    segment := (string | ['-'] integer | char) ['/' 'utf8']

That is what `file:consult/1` accepts in a config file, minus what a config never needs
(improper lists, bit-size segments); those are refused with a syntax error rather than read
wrongly.

How terms map to Python (the choice is the reader's contract):

| Erlang                      | Python                                            |
| --------------------------- | ------------------------------------------------- |
| atom `foo`, `'Foo bar'`     | `Atom("foo")`: a frozen wrapper, never equal to a str |
| `true`, `false`             | `True`, `False` (they are atoms that mean booleans) |
| integer, `$c`, `16#FF`      | `int`                                             |
| float                       | `float`                                           |
| string `"..."`              | `str` (code points; a string is a list in Erlang)  |
| binary `<<...>>`            | `bytes`                                           |
| list, tuple, map            | `list`, `tuple`, `dict`                           |
| `fun M:F/A`                 | `ExternalFun(module, function, arity)`            |

`Atom` is a wrapper rather than a `str` subclass on purpose: validators must tell the atom
`infinity` from the string "infinity", and a subclass would compare equal to the string.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TypeAlias

import attrs

from gateway.config.codepoints import is_scalar_value, is_scanner_char
from gateway.config.errors import TermSyntaxError
from gateway.config.lexer import MAX_ATOM_CHARS, RESERVED_WORDS, Kind, Token, tokenize


def _check_atom_name(_instance: object, _attribute: object, name: str) -> None:
    # `true`/`false` are read as bool, so an Atom of those names could never round-trip.
    if name in ("true", "false"):
        raise ValueError(f"the atom {name} is represented by the bool {name == 'true'}")


@attrs.frozen
class Atom:
    """An Erlang atom, by name."""

    name: str = attrs.field(validator=_check_atom_name)

    def __str__(self) -> str:
        return format_atom(self.name)


@attrs.frozen
class ExternalFun:
    """`fun Module:Function/Arity`, the only fun a term file can hold."""

    module: str
    function: str
    arity: int

    def __str__(self) -> str:
        return format_term(self)


Term: TypeAlias = (
    "Atom | bool | int | float | str | bytes | ExternalFun"
    " | list[Term] | tuple[Term, ...] | dict[Term, Term]"
)


# ---------------------------------------------------------------------------------------------
# Parsing


def parse_terms(text: str, file: str = "<string>") -> list[Term]:
    """Every top-level term of `text`, each of which must end with a `.`."""
    return _Parser(tokenize(text, file), file).terms()


def parse_term(text: str, file: str = "<string>") -> Term:
    """Exactly one term followed by its `.` (as `erl_parse:parse_term/1` wants)."""
    terms = _Parser(tokenize(text, file), file).terms()
    if len(terms) != 1:
        raise TermSyntaxError(file, 1, 1, f"expected exactly one term, found {len(terms)}")
    return terms[0]


def read_term_file(path: Path) -> list[Term]:
    """Parse a file as UTF-8 (the encoding `file:consult` assumes without a coding comment).

    Raises OSError when the file cannot be read and TermSyntaxError when it does not parse,
    including bytes that are not UTF-8 (reported at their line and column)."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start].decode("utf-8", errors="replace")
        line = before.count("\n") + 1
        column = len(before) - (before.rfind("\n") + 1) + 1
        raise TermSyntaxError(str(path), line, column, "bytes that are not UTF-8") from None
    return parse_terms(text, str(path))


class _Parser:
    def __init__(self, tokens: list[Token], file: str) -> None:
        self.tokens = tokens
        self.file = file
        self.i = 0

    # -- cursor ------------------------------------------------------------------------------

    def peek(self) -> Token:
        return self.tokens[self.i]

    def take(self) -> Token:
        token = self.tokens[self.i]
        if token.kind is not Kind.EOF:
            self.i += 1
        return token

    def error(self, token: Token, message: str) -> TermSyntaxError:
        return TermSyntaxError(self.file, token.line, token.column, message)

    def is_punct(self, symbol: str) -> bool:
        token = self.peek()
        return token.kind is Kind.PUNCT and token.value == symbol

    def expect_punct(self, symbol: str, context: str) -> Token:
        token = self.take()
        if token.kind is not Kind.PUNCT or token.value != symbol:
            raise self.error(token, f"expected '{symbol}' {context}, found {token.describe()}")
        return token

    # -- productions -------------------------------------------------------------------------

    def terms(self) -> list[Term]:
        terms: list[Term] = []
        while self.peek().kind is not Kind.EOF:
            terms.append(self.term())
            end = self.take()
            if end.kind is not Kind.DOT:
                raise self.error(end, f"expected '.' after a term, found {end.describe()}")
        return terms

    def term(self) -> Term:
        token = self.take()
        kind, value = token.kind, token.value
        if kind is Kind.ATOM:
            assert isinstance(value, str)
            if value == "true":
                return True
            if value == "false":
                return False
            return Atom(value)
        if kind in (Kind.INTEGER, Kind.FLOAT, Kind.CHAR):
            assert isinstance(value, int | float)
            return value
        if kind is Kind.STRING:
            # Adjacent string literals are one string, as in Erlang ("ab" "cd" is "abcd").
            parts = [str(value)]
            while self.peek().kind is Kind.STRING:
                parts.append(str(self.take().value))
            return "".join(parts)
        if kind is Kind.PUNCT:
            if value == "[":
                return self.sequence("]", "in a list")
            if value == "{":
                return tuple(self.sequence("}", "in a tuple"))
            if value == "#":
                return self.map()
            if value == "<<":
                return self.binary()
            if value in ("-", "+"):
                return self.signed(token)
        if kind is Kind.KEYWORD and value == "fun":
            return self.external_fun()
        if kind is Kind.VAR:
            raise self.error(token, "a variable is not allowed in a term")
        raise self.error(token, f"expected a term, found {token.describe()}")

    def signed(self, sign: Token) -> Term:
        token = self.take()
        if token.kind not in (Kind.INTEGER, Kind.FLOAT, Kind.CHAR):
            raise self.error(token, f"expected a number after '{sign.value}'")
        assert isinstance(token.value, int | float)
        return -token.value if sign.value == "-" else token.value

    def sequence(self, close: str, context: str) -> list[Term]:
        items: list[Term] = []
        if self.is_punct(close):
            self.take()
            return items
        while True:
            items.append(self.term())
            token = self.take()
            if token.kind is Kind.PUNCT and token.value == close:
                return items
            if token.kind is Kind.PUNCT and token.value == "|":
                raise self.error(token, "improper lists ([H|T]) are not supported in a config")
            if token.kind is not Kind.PUNCT or token.value != ",":
                raise self.error(
                    token, f"expected ',' or '{close}' {context}, found {token.describe()}"
                )

    def map(self) -> dict[Term, Term]:
        self.expect_punct("{", "after '#' (a map is written #{...})")
        result: dict[Term, Term] = {}
        if self.is_punct("}"):
            self.take()
            return result
        while True:
            key_token = self.peek()
            key = self.term()
            self.expect_punct("=>", "between a map key and its value")
            value = self.term()
            self._put(result, key, value, key_token)
            token = self.take()
            if token.kind is Kind.PUNCT and token.value == "}":
                return result
            if token.kind is not Kind.PUNCT or token.value != ",":
                raise self.error(token, f"expected ',' or '}}' in a map, found {token.describe()}")

    def _put(self, result: dict[Term, Term], key: Term, value: Term, at: Token) -> None:
        try:
            present = key in result
        except TypeError:
            raise self.error(at, "a list or a map as a map key is not supported") from None
        existing = next(k for k in result if k == key) if present else None
        # Python's dict merges 1, 1.0 and true, which are three distinct keys in an Erlang map.
        # Refuse rather than silently drop one; a later duplicate of the same key wins, as in
        # Erlang.
        if existing is not None and type(existing) is not type(key):
            raise self.error(at, "map keys that Python cannot tell apart (such as 1 and 1.0)")
        if existing is not None:
            del result[existing]
        result[key] = value

    def binary(self) -> bytes:
        out = bytearray()
        if self.is_punct(">>"):
            self.take()
            return bytes(out)
        while True:
            out += self.segment()
            token = self.take()
            if token.kind is Kind.PUNCT and token.value == ">>":
                return bytes(out)
            if token.kind is not Kind.PUNCT or token.value != ",":
                found = token.describe()
                raise self.error(token, f"expected ',' or '>>' in a binary, found {found}")

    def segment(self) -> bytes:
        token = self.take()
        code_points: list[int]
        if token.kind is Kind.STRING:
            text = str(token.value)
            while self.peek().kind is Kind.STRING:
                text += str(self.take().value)
            code_points = [ord(c) for c in text]
        elif token.kind in (Kind.INTEGER, Kind.CHAR):
            assert isinstance(token.value, int)
            code_points = [token.value]
        elif token.kind is Kind.PUNCT and token.value == "-":
            number = self.take()
            if number.kind not in (Kind.INTEGER, Kind.CHAR):
                raise self.error(number, "expected an integer after '-' in a binary")
            assert isinstance(number.value, int)
            code_points = [-number.value]
        else:
            found = token.describe()
            raise self.error(token, f"expected a string or an integer in a binary, found {found}")
        if self.is_punct(":"):
            raise self.error(self.peek(), "binary segment sizes are not supported in a config")
        if not self.is_punct("/"):
            # A plain segment keeps the low 8 bits of each value, as Erlang does: <<"\x{140}">>
            # is the byte 16#40. The operator manual warns about exactly this.
            return bytes(cp & 0xFF for cp in code_points)
        self.take()
        spec = self.take()
        if spec.kind is not Kind.ATOM or spec.value != "utf8":
            raise self.error(spec, "the only binary segment type supported is /utf8")
        for cp in code_points:
            if not is_scalar_value(cp):
                raise self.error(token, "a /utf8 segment holds a value that is not a code point")
        return "".join(chr(cp) for cp in code_points).encode("utf-8")

    def external_fun(self) -> ExternalFun:
        module = self.take()
        if module.kind is not Kind.ATOM:
            raise self.error(module, "expected a module atom after 'fun' (fun M:F/A)")
        self.expect_punct(":", "in fun M:F/A")
        function = self.take()
        if function.kind is not Kind.ATOM:
            raise self.error(function, "expected a function atom in fun M:F/A")
        self.expect_punct("/", "in fun M:F/A")
        arity = self.take()
        if arity.kind is not Kind.INTEGER:
            raise self.error(arity, "expected an arity in fun M:F/A")
        assert isinstance(module.value, str) and isinstance(function.value, str)
        assert isinstance(arity.value, int)
        return ExternalFun(module.value, function.value, arity.value)


# ---------------------------------------------------------------------------------------------
# Writing


def _is_bare_atom(name: str) -> bool:
    return (
        name != ""
        and "a" <= name[0] <= "z"
        and all(c.isascii() and (c.isalnum() or c in "_@") for c in name)
        and name not in RESERVED_WORDS
    )


def _escape(text: str, quote: str) -> str:
    """Escape for a quoted literal. The output is pure ASCII, so any file encoding reads it."""
    named = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", quote: "\\" + quote}
    out: list[str] = []
    for ch in text:
        if ch in named:
            out.append(named[ch])
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append(f"\\x{{{ord(ch):X}}}")
    return "".join(out)


def format_atom(name: str) -> str:
    if len(name) > MAX_ATOM_CHARS:
        raise ValueError(f"an atom name is at most {MAX_ATOM_CHARS} characters")
    return name if _is_bare_atom(name) else "'" + _escape(name, "'") + "'"


def _format_float(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        raise ValueError("Erlang has no syntax for NaN or infinity")
    text = repr(value)
    mantissa, _, exponent = text.partition("e")
    # Erlang needs digits on both sides of the dot: `1e16` is not a float there, `1.0e16` is.
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}e{exponent.lstrip('+')}" if exponent else mantissa


def format_term(term: Term) -> str:
    """Erlang syntax for `term` that `parse_term(format_term(t) + '.')` reads back as `t`."""
    match term:
        case bool():
            return "true" if term else "false"
        case Atom():
            return format_atom(term.name)
        case int():
            return str(term)
        case float():
            return _format_float(term)
        case str():
            refused = next((ch for ch in term if not is_scanner_char(ord(ch))), None)
            if refused is not None:
                raise ValueError(f"a string holding U+{ord(refused):04X} cannot be written")
            return '"' + _escape(term, '"') + '"'
        case bytes():
            body = "".join(
                chr(b) if " " <= chr(b) <= "~" and chr(b) not in '"\\' else f"\\x{{{b:X}}}"
                for b in term
            )
            return f'<<"{body}">>' if term else "<<>>"
        case list():
            return "[" + ",".join(format_term(t) for t in term) + "]"
        case tuple():
            return "{" + ",".join(format_term(t) for t in term) + "}"
        case dict():
            items = ",".join(f"{format_term(k)} => {format_term(v)}" for k, v in term.items())
            return "#{" + items + "}"
        case ExternalFun():
            return f"fun {format_atom(term.module)}:{format_atom(term.function)}/{term.arity}"
    raise TypeError(f"not a term: {type(term).__name__}")
