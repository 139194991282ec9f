"""The sys.config reader (gateway/config/lexer.py, terms.py, loader.py) against Erlang's own
`file:consult/1`, where `erl` is installed (Debian's `erlang-base`; skipped otherwise, as the
promtool checks are).

Erlang reads each file and answers `term_to_binary` of what it read; the test decodes that
(the external term format, the subset a config holds) and compares it with what the gateway
read, term for term. The shipped configs, a corpus of the syntax's corners, and terms drawn by
hypothesis and written by `format_term` are read both ways."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config.errors import TermSyntaxError
from gateway.config.terms import Atom, ExternalFun, Term, format_term, read_term_file
from tests.unit.gateway.config.test_config_terms import terms

ERL = shutil.which("erl")
pytestmark = pytest.mark.skipif(ERL is None, reason="erl is not installed (erlang-base)")

ROOT = Path(__file__).resolve().parents[4]
SHIPPED = sorted((ROOT / "sys_config").glob("*.config"))
ERL_TIMEOUT_S = 60

# One hex line per file named in CONSULT_FILES (newline-separated), or ERROR and the reason.
CONSULT = """
lists:foreach(fun(F) ->
    case file:consult(F) of
        {ok, Ts} -> io:put_chars([binary:encode_hex(term_to_binary(Ts)), "\\n"]);
        {error, E} -> io:format("ERROR ~0p~n", [E])
    end
end, string:split(os:getenv("CONSULT_FILES"), "\\n", all)),
halt().
"""

CORNERS = r"""
%% comments, then every form a config may use
[{yuzu_gw, [{health_port, 8081}, {'quoted atom', 'it\'s'}, {'\n', x}]}].
{integers, -5, +5, 16#FF, 2#101, 36#zz, $a, $\n, $\x{FC}, $\\, 1_000}.
{floats, 1.5, -0.25, 1.5e3, 2.0E-3, 1_0.5}.
{strings, "a" "b", "", "tab\there", "\e\d\s\^A\^z", "\x{1F600}", "caf\351", "\101"}.
{binaries, <<>>, <<"abc">>, <<"Z\x{FC}rich"/utf8>>, <<1, 2, 255>>, <<"a", 0, "b">>, <<$a>>}.
{maps, #{}, #{a => 1, "s" => [1, 2], {t} => #{nested => true}}}.
{lists, [], [[]], [a, [b, [c]]], {}, {{}}}.
{booleans, true, false, 'true'}.
{funs, fun yuzu_gw_authz:check_mgmt_peer/1, fun 'M':'f'/0}.
"""


def _consult_lines(paths: list[Path]) -> list[str]:
    """What CONSULT printed for each file: a hex line, or ERROR and the reason."""
    assert ERL is not None
    done = subprocess.run(
        [ERL, "-noshell", "-noinput", "-eval", CONSULT],
        env={**os.environ, "CONSULT_FILES": "\n".join(str(p) for p in paths)},
        capture_output=True,
        text=True,
        timeout=ERL_TIMEOUT_S,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == len(paths), done.stdout + done.stderr
    return lines


def _consult(paths: list[Path]) -> list[Any]:
    lines = _consult_lines(paths)
    results = []
    for path, line in zip(paths, lines, strict=True):
        assert not line.startswith("ERROR"), f"{path}: {line}"
        results.append(_decode(bytes.fromhex(line)))
    return results


# -- the external term format -------------------------------------------------------------------


def _decode(data: bytes) -> Any:
    assert data[0] == 131, "not an external term"
    term, end = _term(data, 1)
    assert end == len(data)
    return term


def _atom(text: str) -> tuple[str, Any]:
    if text in ("true", "false"):
        return ("bool", text == "true")
    return ("atom", text)


def _term(data: bytes, at: int) -> tuple[Any, int]:
    tag, at = data[at], at + 1
    if tag == 97:  # SMALL_INTEGER_EXT
        return ("int", data[at]), at + 1
    if tag == 98:  # INTEGER_EXT
        return ("int", struct.unpack_from(">i", data, at)[0]), at + 4
    if tag in (110, 111):  # SMALL_BIG_EXT, LARGE_BIG_EXT
        n, at = (
            (data[at], at + 1) if tag == 110 else (struct.unpack_from(">I", data, at)[0], at + 4)
        )
        sign, digits = data[at], data[at + 1 : at + 1 + n]
        value = int.from_bytes(digits, "little")
        return ("int", -value if sign else value), at + 1 + n
    if tag == 70:  # NEW_FLOAT_EXT
        return ("float", struct.unpack_from(">d", data, at)[0]), at + 8
    if tag in (100, 118):  # ATOM_EXT (latin-1), ATOM_UTF8_EXT
        n = struct.unpack_from(">H", data, at)[0]
        raw = data[at + 2 : at + 2 + n]
        return _atom(raw.decode("latin-1" if tag == 100 else "utf-8")), at + 2 + n
    if tag in (115, 119):  # SMALL_ATOM_EXT, SMALL_ATOM_UTF8_EXT
        n = data[at]
        raw = data[at + 1 : at + 1 + n]
        return _atom(raw.decode("latin-1" if tag == 115 else "utf-8")), at + 1 + n
    if tag in (104, 105):  # SMALL_TUPLE_EXT, LARGE_TUPLE_EXT
        n, at = (
            (data[at], at + 1) if tag == 104 else (struct.unpack_from(">I", data, at)[0], at + 4)
        )
        items = []
        for _ in range(n):
            item, at = _term(data, at)
            items.append(item)
        return ("tuple", tuple(items)), at
    if tag == 106:  # NIL_EXT
        return ("list", ()), at
    if tag == 107:  # STRING_EXT: a list of small integers
        n = struct.unpack_from(">H", data, at)[0]
        return ("list", tuple(("int", b) for b in data[at + 2 : at + 2 + n])), at + 2 + n
    if tag == 108:  # LIST_EXT
        n, at = struct.unpack_from(">I", data, at)[0], at + 4
        items = []
        for _ in range(n):
            item, at = _term(data, at)
            items.append(item)
        tail, at = _term(data, at)
        assert tail == ("list", ()), "an improper list"
        return ("list", tuple(items)), at
    if tag == 109:  # BINARY_EXT
        n = struct.unpack_from(">I", data, at)[0]
        return ("binary", data[at + 4 : at + 4 + n]), at + 4 + n
    if tag == 116:  # MAP_EXT
        n, at = struct.unpack_from(">I", data, at)[0], at + 4
        pairs = []
        for _ in range(n):
            key, at = _term(data, at)
            value, at = _term(data, at)
            pairs.append((key, value))
        return ("map", frozenset(pairs)), at
    if tag == 113:  # EXPORT_EXT
        (_, module), at = _term(data, at)
        (_, function), at = _term(data, at)
        (_, arity), at = _term(data, at)
        return ("fun", module, function, arity), at
    raise AssertionError(f"external term tag {tag} is not one a config holds")


def _ours(term: Term) -> Any:
    """The gateway's reading in the decoder's shape (a string is a list of code points)."""
    if isinstance(term, bool):
        return ("bool", term)
    if isinstance(term, Atom):
        return ("atom", term.name)
    if isinstance(term, int):
        return ("int", term)
    if isinstance(term, float):
        return ("float", term)
    if isinstance(term, str):
        return ("list", tuple(("int", ord(c)) for c in term))
    if isinstance(term, bytes):
        return ("binary", term)
    if isinstance(term, ExternalFun):
        return ("fun", term.module, term.function, term.arity)
    if isinstance(term, list):
        return ("list", tuple(_ours(t) for t in term))
    if isinstance(term, tuple):
        return ("tuple", tuple(_ours(t) for t in term))
    return ("map", frozenset((_ours(k), _ours(v)) for k, v in term.items()))


def _same_file(paths: list[Path]) -> None:
    for path, theirs in zip(paths, _consult(paths), strict=True):
        ours = ("list", tuple(_ours(t) for t in read_term_file(path)))
        assert ours == theirs, path


def test_shipped_configs_and_the_syntax_corners_read_as_erlang_reads_them(tmp_path: Path) -> None:
    corners = tmp_path / "corners.config"
    corners.write_text(CORNERS, encoding="utf-8")
    _same_file([*SHIPPED, corners])


# Characters erl_scan refuses, raw or escaped, in strings, atoms, `$c` and comments.
REFUSED = [
    '{a, "\\x{D800}"}.',
    '{a, "\\x{DFFF}"}.',
    "{a, '\\x{FFFE}'}.",
    "{a, $\\x{FFFF}}.",
    '{a, <<"\\x{D800}"/utf8>>}.',
    '{a, "\\x{110000}"}.',
    '{a, "\ufffe"}.',
    "%% \uffff\n{a, 1}.",
]


def test_what_erlang_refuses_to_read_this_reader_refuses(tmp_path: Path) -> None:
    paths = []
    for n, text in enumerate(REFUSED):
        path = tmp_path / f"refused-{n}.config"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    assert [line.startswith("ERROR") for line in _consult_lines(paths)] == [True] * len(paths)
    for path in paths:
        with pytest.raises(TermSyntaxError):
            read_term_file(path)


@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(st.lists(terms, min_size=20, max_size=40))
def test_written_terms_read_as_erlang_reads_them(drawn: list[Term]) -> None:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"yuzu-consult-{os.getpid()}.config"
    try:
        path.write_text("".join(format_term(t) + ".\n" for t in drawn), encoding="utf-8")
        _same_file([path])
    finally:
        path.unlink(missing_ok=True)
