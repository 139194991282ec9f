"""The Erlang term parser and writer: literal forms, errors with positions, round trip."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.errors import TermSyntaxError
from gateway.config.terms import (
    Atom,
    ExternalFun,
    Term,
    format_term,
    parse_term,
    parse_terms,
    read_term_file,
)


def same(a: Term, b: Term) -> bool:
    """Equality that also compares types: Python's == says 1 == 1.0 == True."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        assert isinstance(b, float)
        return repr(a) == repr(b)
    if isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        assert isinstance(b, dict)
        if len(a) != len(b):
            return False
        return all(any(same(k, k2) and same(v, b[k2]) for k2 in b) for k, v in a.items())
    return a == b


# -- literal forms ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("foo.", Atom("foo")),
        ("foo_Bar@9.", Atom("foo_Bar@9")),
        ("'Foo bar'.", Atom("Foo bar")),
        ("'it\\'s'.", Atom("it's")),
        ("'end'.", Atom("end")),
        ("true.", True),
        ("false.", False),
        ("'true'.", True),
        ("42.", 42),
        ("-42.", -42),
        ("+7.", 7),
        ("16#FF.", 255),
        ("2#1010.", 10),
        ("36#zz.", 35 * 36 + 35),
        ("1_000_000.", 1000000),
        ("$a.", 97),
        ("$\\n.", 10),
        ("$\\x{FC}.", 0xFC),
        ("$ .", 32),
        ("-$a.", -97),
        ("1.5.", 1.5),
        ("1.0e3.", 1000.0),
        ("1.0E-3.", 0.001),
        ("2.5e+2.", 250.0),
        ("-0.5.", -0.5),
        ('"abc".', "abc"),
        ('"".', ""),
        ('"ab" "cd".', "abcd"),
        ('"Z\\x{FC}rich".', "Z\u00fcrich"),
        ('"tab\\there\\nnl".', "tab\there\nnl"),
        ('"q\\"b\\\\".', 'q"b\\'),
        ('"\\101\\7".', "A\x07"),
        ('"\\x41\\s\\d\\e".', "A \x7f\x1b"),
        ('"\\^a\\^Z".', "\x01\x1a"),
        ('"Zürich".', "Zürich"),
        ("<<>>.", b""),
        ('<<"abc">>.', b"abc"),
        ('<<"Z\\x{FC}rich"/utf8>>.', "Zürich".encode()),
        ('<<"Z\\x{FC}rich">>.', b"Z\xfcrich"),
        # The manual's example: a plain binary keeps the low byte of each code point.
        ('<<"\\x{140}\\x{141}">>.', b"@A"),
        ("<<1,2,255>>.", b"\x01\x02\xff"),
        ("<<256, -1>>.", b"\x00\xff"),
        ('<<$a, "b", 16#FC/utf8>>.', b"ab\xc3\xbc"),
        ("[].", []),
        ('[1, a, "s"].', [1, Atom("a"), "s"]),
        ("{}.", ()),
        ("{ok, 1}.", (Atom("ok"), 1)),
        ("#{}.", {}),
        ('#{a => 1, <<"k">> => [x]}.', {Atom("a"): 1, b"k": [Atom("x")]}),
        ("#{a => 1, a => 2}.", {Atom("a"): 2}),
        (
            "fun yuzu_gw_authz:check_mgmt_peer/1.",
            ExternalFun("yuzu_gw_authz", "check_mgmt_peer", 1),
        ),
        ("% a comment\n  [a] % trailing\n.", [Atom("a")]),
    ],
)
def test_literal_forms(text: str, expected: Term) -> None:
    assert same(parse_term(text), expected)


def test_several_terms_each_with_its_dot() -> None:
    assert parse_terms("a. {b}.\n[c].%end") == [Atom("a"), (Atom("b"),), [Atom("c")]]
    assert parse_terms("% only a comment\n") == []


def test_the_manual_s_listener_entry_parses() -> None:
    text = """[{yuzu_gw, [{grpc_listeners, [
        #{name => agent,
          service_protos => [agent_pb],
          services => #{'yuzu.agent.v1.AgentService' => yuzu_gw_agent_service},
          listen => #{port => 50051, ip => {0,0,0,0}},
          auth_fun => fun yuzu_gw_authz:check_mgmt_peer/1,
          http2 => #{idle_timeout => 180000, max_concurrent_streams => 32}}]}]}]."""
    parsed: Any = parse_terms(text)
    [[(app, [(key, [entry])])]] = parsed
    assert (app, key) == (Atom("yuzu_gw"), Atom("grpc_listeners"))
    assert isinstance(entry, dict)
    assert entry[Atom("listen")] == {Atom("port"): 50051, Atom("ip"): (0, 0, 0, 0)}
    assert entry[Atom("services")] == {
        Atom("yuzu.agent.v1.AgentService"): Atom("yuzu_gw_agent_service")
    }


def test_atom_cannot_be_named_true_or_false() -> None:
    # They are read as bools, so such an Atom could never come back from the parser.
    with pytest.raises(ValueError, match="bool"):
        Atom("true")


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        ("[a,", 1, 4, "expected a term, found end of file"),
        ("{a b}.", 1, 4, "expected ',' or '}'"),
        ("[a]", 1, 4, "expected '.' after a term"),
        ("X.", 1, 1, "variable"),
        ('\n\n  "abc', 3, 3, "unterminated string"),
        ("'abc", 1, 1, "unterminated quoted atom"),
        ("[a|b].", 1, 3, "improper lists"),
        ("<<1:8>>.", 1, 4, "segment sizes"),
        ('<<"a"/latin1>>.', 1, 7, "/utf8"),
        ("<<16#D800/utf8>>.", 1, 3, "not a code point"),
        ('"\\x{D800}".', 1, 2, "U+D800, which Erlang's scanner refuses"),
        ("'a\\x{FFFF}'.", 1, 3, "U+FFFF, which Erlang's scanner refuses"),
        ("$\\x{DFFF}.", 1, 2, "U+DFFF, which Erlang's scanner refuses"),
        ('"ok".\n%% \ufffe\n', 2, 4, "illegal character U+FFFE"),
        ('"\ud800".', 1, 2, "illegal character U+D800"),
        ("end.", 1, 1, "expected a term, found 'end'"),
        ("#[].", 1, 2, "expected '{' after '#'"),
        ("a.b.", 1, 2, "does not end a term"),
        ("#{1 => a, 1.0 => b}.", 1, 11, "cannot tell apart"),
        ("#{[1] => a}.", 1, 3, "map key"),
        ("37#1.", 1, 1, "base 37"),
        ("16#.", 1, 1, "no digits"),
        ('"\\x{110000}".', 1, 2, "16#10FFFF"),
        ('"\\xZ".', 1, 2, "\\xHH"),
        ("[a]\n  ;", 2, 3, "illegal character"),
        ("fun m/1.", 1, 6, "':'"),
        ("'" + "a" * 256 + "'.", 1, 1, "longer than 255"),
        ("a. [1, 2\n   3].", 2, 4, "expected ',' or ']'"),
        ("- a.", 1, 3, "expected a number"),
    ],
)
def test_syntax_errors_report_line_and_column(
    text: str, line: int, column: int, message: str
) -> None:
    with pytest.raises(TermSyntaxError) as caught:
        parse_terms(text, "x.config")
    error = caught.value
    assert (error.file, error.line, error.column) == ("x.config", line, column)
    assert message in error.message
    assert str(error).startswith(f"x.config:{line}:{column}: ")


def test_errors_never_quote_string_contents() -> None:
    with pytest.raises(TermSyntaxError) as caught:
        parse_terms('{password, "hunter2hunter2" "x" oops}.')
    assert "hunter2" not in str(caught.value)


def test_file_that_is_not_utf8_reports_the_position(tmp_path: Path) -> None:
    path = tmp_path / "bad.config"
    path.write_bytes(b'[{yuzu_gw,\n  [{cluster_id, "Z\xfcrich"}]}].\n')
    with pytest.raises(TermSyntaxError) as caught:
        read_term_file(path)
    assert (caught.value.line, caught.value.column) == (2, 19)


def test_parse_term_wants_exactly_one_term() -> None:
    with pytest.raises(TermSyntaxError, match="exactly one term"):
        parse_term("a. b.")


# -- writing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("term", "text"),
    [
        (Atom("foo"), "foo"),
        (Atom("Foo"), "'Foo'"),
        (Atom("end"), "'end'"),
        (Atom(""), "''"),
        (Atom("it's"), "'it\\'s'"),
        (True, "true"),
        (-3, "-3"),
        (1e16, "1.0e16"),
        (1.5e-5, "1.5e-05"),
        ('a"b\n\u00fc', '"a\\"b\\n\\x{FC}"'),
        (b"ab\xfc", '<<"ab\\x{FC}">>'),
        (b"", "<<>>"),
        ([], "[]"),
        ((Atom("ok"), [1, 2]), "{ok,[1,2]}"),
        ({Atom("a"): 1}, "#{a => 1}"),
        (ExternalFun("m", "f", 2), "fun m:f/2"),
    ],
)
def test_format_term(term: Term, text: str) -> None:
    assert format_term(term) == text


def test_format_refuses_what_erlang_cannot_write() -> None:
    with pytest.raises(ValueError, match="NaN"):
        format_term(math.nan)
    with pytest.raises(TypeError):
        format_term(object())  # type: ignore[arg-type]
    for refused in ("\ud800", "a\udfff", "\ufffe", "\uffff"):
        with pytest.raises(ValueError, match="cannot be written"):
            format_term(["ok", refused])


# -- round trip ---------------------------------------------------------------------------------

# Atom names: any text but the two bool names; surrogates are left out because an Erlang atom
# cannot hold one.
_names = st.text(max_size=12).filter(lambda n: n not in ("true", "false"))
# Strings hold any character Erlang's scanner reads (no surrogate, no U+FFFE or U+FFFF).
_chars = st.characters(exclude_characters="\ufffe\uffff")
_scalars: st.SearchStrategy[Term] = st.one_of(
    _names.map(Atom),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(_chars, max_size=12),
    st.binary(max_size=12),
    st.builds(ExternalFun, _names, _names, st.integers(0, 255)),
)
_keys = st.one_of(_scalars, st.lists(_scalars, max_size=3).map(tuple))
terms: st.SearchStrategy[Term] = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(_keys, inner, max_size=4),
    ),
    max_leaves=16,
)


@settings(max_examples=200)
@given(terms)
def test_round_trip_through_format_and_parse(term: Term) -> None:
    text = format_term(term) + "."
    assert same(parse_term(text), term), text
    assert text.isascii()  # the writer escapes everything else, so any encoding reads it
