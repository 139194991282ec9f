"""Tokenizer for Erlang term files (what `file:consult/1` reads).

Rules of this module:

- It turns text into a flat list of `Token`s and knows nothing of nesting; `terms.py` is the
  grammar. Every token carries the 1-based line and column where it starts, so the parser can
  report `file:line:column` for any mistake.
- Literal values are decoded here (escapes, base notation, `$c` characters), so the parser only
  sees finished Python values.
- Error messages never quote the contents of a string or quoted atom: a config file holds
  paths to key files and other values that must not reach a log line.

Only the subset of Erlang's lexical syntax that a term file can use is accepted: no
variables are allowed in a term, so they lex as `var` tokens and the parser refuses them.
"""

from __future__ import annotations

import enum
import math
import re
from typing import NoReturn

import attrs

from gateway.config.codepoints import MAX_CODE_POINT, is_scanner_char
from gateway.config.errors import TermSyntaxError

# Erlang's reserved words cannot be bare atoms (erl_scan); only `fun` has a meaning in a term
# (an external fun, `fun M:F/A`), the rest are syntax errors unless quoted.
RESERVED_WORDS = frozenset(
    {
        "after", "and", "andalso", "band", "begin", "bnot", "bor", "bsl", "bsr", "bxor",
        "case", "catch", "cond", "div", "else", "end", "fun", "if", "let", "maybe", "not",
        "of", "or", "orelse", "receive", "rem", "try", "when", "xor",
    }
)  # fmt: skip

# Erlang refuses longer atoms ("atom too long"); keep the same limit so a file that loads here
# also loads in an Erlang node.
MAX_ATOM_CHARS = 255

# Punctuation, longest first so `<<` wins over `<`.
_PUNCTUATION = ("=>", "<<", ">>", "[", "]", "{", "}", "(", ")", ",", "|", "#", "/", ":", "-", "+")

# Single-letter escapes of erl_scan, e.g. `\s` is a space and `\d` is DEL.
_SIMPLE_ESCAPES = {
    "b": "\b", "d": "\x7f", "e": "\x1b", "f": "\f", "n": "\n", "r": "\r",
    "s": " ", "t": "\t", "v": "\v",
}  # fmt: skip


_BARE_ATOM = re.compile(r"[a-z][A-Za-z0-9_@]*")


class Kind(enum.Enum):
    ATOM = "atom"  # bare or quoted; value is the name
    VAR = "variable"
    STRING = "string"
    CHAR = "character"  # `$c`; value is the code point
    INTEGER = "integer"
    FLOAT = "float"
    PUNCT = "punctuation"  # value is the symbol text
    KEYWORD = "keyword"  # a reserved word written bare; value is the word
    DOT = "end of term"  # the `.` that ends a top-level term
    EOF = "end of file"


@attrs.frozen
class Token:
    kind: Kind
    value: str | int | float
    line: int
    column: int

    def describe(self) -> str:
        """How an error message names this token; never the contents of a string."""
        if self.kind in (Kind.PUNCT, Kind.KEYWORD):
            return f"'{self.value}'"
        if self.kind is Kind.ATOM and isinstance(self.value, str):
            return f"atom {self.value}" if _BARE_ATOM.fullmatch(self.value) else "a quoted atom"
        return str(self.kind.value)


def _is_atom_start(ch: str) -> bool:
    # erl_scan: a-z, or a Latin-1 lowercase letter (U+00DF..U+00FF except U+00F7).
    return "a" <= ch <= "z" or ("\xdf" <= ch <= "\xff" and ch != "\xf7")


def _is_var_start(ch: str) -> bool:
    # erl_scan: A-Z, `_`, or a Latin-1 uppercase letter (U+00C0..U+00DE except U+00D7).
    return "A" <= ch <= "Z" or ch == "_" or ("\xc0" <= ch <= "\xde" and ch != "\xd7")


def _is_name_char(ch: str) -> bool:
    if ch == "":
        return False
    if ch.isascii():
        return ch.isalnum() or ch in "_@"
    return "\xc0" <= ch <= "\xff" and ch not in "\xd7\xf7"


def _digit_value(ch: str) -> int:
    if "0" <= ch <= "9":
        return ord(ch) - ord("0")
    if "a" <= ch.lower() <= "z":
        return ord(ch.lower()) - ord("a") + 10
    return 99  # never a digit in any base up to 36


class _Scanner:
    """A cursor over the text that keeps line and column up to date."""

    def __init__(self, text: str, file: str) -> None:
        self.text = text
        self.file = file
        self.pos = 0
        self.line = 1
        self.column = 1

    def peek(self, ahead: int = 0) -> str:
        i = self.pos + ahead
        return self.text[i] if i < len(self.text) else ""

    def advance(self, count: int = 1) -> str:
        taken = self.text[self.pos : self.pos + count]
        for ch in taken:
            if ch == "\n":
                self.line += 1
                self.column = 1
            else:
                self.column += 1
        self.pos += len(taken)
        return taken

    def error(self, message: str, line: int | None = None, column: int | None = None) -> NoReturn:
        raise TermSyntaxError(
            self.file, line if line is not None else self.line, column or self.column, message
        )


def tokenize(text: str, file: str = "<string>") -> list[Token]:
    """Split `text` into tokens, ending with one EOF token. Raises TermSyntaxError."""
    sc = _Scanner(text, file)
    _refuse_illegal_characters(sc)
    tokens: list[Token] = []
    while True:
        _skip_blank(sc)
        line, column = sc.line, sc.column
        ch = sc.peek()
        if ch == "":
            tokens.append(Token(Kind.EOF, "", line, column))
            return tokens
        tokens.append(_next_token(sc, ch, line, column))


# What erl_scan refuses as it reads, comments included: surrogates (a text decoded with
# `surrogateescape` can hold them) and the noncharacters U+FFFE and U+FFFF.
_ILLEGAL_CHARACTER = re.compile("[\ud800-\udfff\ufffe\uffff]")


def _refuse_illegal_characters(sc: _Scanner) -> None:
    found = _ILLEGAL_CHARACTER.search(sc.text)
    if found is None:
        return
    at = found.start()
    line = sc.text.count("\n", 0, at) + 1
    column = at - (sc.text.rfind("\n", 0, at) + 1) + 1
    sc.error(f"illegal character U+{ord(found.group()):04X}", line, column)


def _skip_blank(sc: _Scanner) -> None:
    while True:
        ch = sc.peek()
        if ch == "%":
            while sc.peek() not in ("", "\n"):
                sc.advance()
        elif ch != "" and ch.isspace():
            sc.advance()
        else:
            return


def _next_token(sc: _Scanner, ch: str, line: int, column: int) -> Token:
    if ch.isdigit():
        return _number(sc, line, column)
    if ch == "$":
        sc.advance()
        if sc.peek() == "":
            sc.error("a character literal needs a character after $", line, column)
        return Token(Kind.CHAR, _char_in_literal(sc), line, column)
    if ch == '"':
        return Token(Kind.STRING, _quoted(sc, '"', line, column), line, column)
    if ch == "'":
        name = _quoted(sc, "'", line, column)
        if len(name) > MAX_ATOM_CHARS:
            sc.error(f"atom longer than {MAX_ATOM_CHARS} characters", line, column)
        return Token(Kind.ATOM, name, line, column)
    if _is_atom_start(ch) or _is_var_start(ch):
        start = sc.pos
        while _is_name_char(sc.peek()):
            sc.advance()
        name = sc.text[start : sc.pos]
        if _is_var_start(ch):
            return Token(Kind.VAR, name, line, column)
        if len(name) > MAX_ATOM_CHARS:
            sc.error(f"atom longer than {MAX_ATOM_CHARS} characters", line, column)
        kind = Kind.KEYWORD if name in RESERVED_WORDS else Kind.ATOM
        return Token(kind, name, line, column)
    if ch == ".":
        # A dot ends a term only when followed by blank, a comment or the end of the text
        # (erl_scan's rule), which is what keeps `1.0` a float.
        after = sc.peek(1)
        sc.advance()
        if after in {"", "%"} or after.isspace():
            return Token(Kind.DOT, ".", line, column)
        sc.error("a '.' that does not end a term", line, column)
    for symbol in _PUNCTUATION:
        if sc.text.startswith(symbol, sc.pos):
            sc.advance(len(symbol))
            return Token(Kind.PUNCT, symbol, line, column)
    sc.error(f"illegal character U+{ord(ch):04X}", line, column)


def _digits(sc: _Scanner, base: int) -> str:
    """Digits of `base`, allowing single `_` separators between digits (OTP 23+)."""
    out: list[str] = []
    while True:
        ch = sc.peek()
        if _digit_value(ch) < base:
            out.append(sc.advance())
        elif ch == "_" and out and _digit_value(sc.peek(1)) < base:
            sc.advance()
        else:
            return "".join(out)


def _number(sc: _Scanner, line: int, column: int) -> Token:
    whole = _digits(sc, 10)
    if sc.peek() == "#":
        base = int(whole)
        if not 2 <= base <= 36:
            sc.error(f"base {base} is not from 2 to 36", line, column)
        sc.advance()
        value = _digits(sc, base)
        if not value:
            sc.error(f"no digits of base {base} after '#'", line, column)
        return Token(Kind.INTEGER, int(value, base), line, column)
    if sc.peek() == "." and sc.peek(1).isdigit():
        sc.advance()
        text = f"{whole}.{_digits(sc, 10)}"
        if sc.peek() in ("e", "E"):
            sign = sc.peek(1) if sc.peek(1) in ("+", "-") else ""
            if sc.peek(1 + len(sign)).isdigit():
                sc.advance(1 + len(sign))
                text += f"e{sign}{_digits(sc, 10)}"
        number = float(text)
        if math.isinf(number):
            sc.error("float out of range", line, column)
        return Token(Kind.FLOAT, number, line, column)
    return Token(Kind.INTEGER, int(whole), line, column)


def _quoted(sc: _Scanner, quote: str, line: int, column: int) -> str:
    sc.advance()  # the opening quote
    out: list[str] = []
    while True:
        ch = sc.peek()
        if ch == "":
            what = "string" if quote == '"' else "quoted atom"
            sc.error(f"unterminated {what}", line, column)
        if ch == quote:
            sc.advance()
            return "".join(out)
        out.append(chr(_char_in_literal(sc)))


def _char_in_literal(sc: _Scanner) -> int:
    """One character of a string, quoted atom or `$c` literal, escapes decoded."""
    line, column = sc.line, sc.column
    ch = sc.advance()
    if ch != "\\":
        return ord(ch)
    esc = sc.peek()
    if esc == "":
        sc.error("unterminated escape sequence", line, column)
    if esc in "01234567":
        digits = ""
        while len(digits) < 3 and sc.peek() in tuple("01234567"):
            digits += sc.advance()
        return int(digits, 8)
    if esc == "x":
        sc.advance()
        if sc.peek() == "{":
            sc.advance()
            hex_digits = _digits(sc, 16)
            if not hex_digits or sc.peek() != "}":
                sc.error("malformed \\x{...} escape", line, column)
            sc.advance()
        else:
            hex_digits = ""
            while len(hex_digits) < 2 and _digit_value(sc.peek()) < 16:
                hex_digits += sc.advance()
            if len(hex_digits) != 2:
                sc.error("malformed \\xHH escape", line, column)
        value = int(hex_digits, 16)
        if value > MAX_CODE_POINT:
            sc.error("escape above the last Unicode code point 16#10FFFF", line, column)
        if not is_scanner_char(value):
            sc.error(f"escape of U+{value:04X}, which Erlang's scanner refuses", line, column)
        return value
    if esc == "^":
        sc.advance()
        ctrl = sc.advance()
        if ctrl == "" or not ctrl.isascii() or not ctrl.isalpha():
            sc.error("malformed \\^ control escape", line, column)
        return ord(ctrl.lower()) - ord("a") + 1
    sc.advance()
    # Any other escaped character stands for itself (`\\`, `\"`, `\'`, ...), as in erl_scan.
    return ord(_SIMPLE_ESCAPES.get(esc, esc))
