"""Unicode limits shared by the term parser and the converters."""

from __future__ import annotations

# The last Unicode code point; Erlang's escapes and unicode module stop here too.
MAX_CODE_POINT = 0x10FFFF

# UTF-16 surrogates: code points that UTF-8 must not encode.
SURROGATES = range(0xD800, 0xE000)


# Two noncharacters that Erlang's scanner (erl_scan's ?UNICODE) refuses beside the surrogates.
SCANNER_NONCHARACTERS = (0xFFFE, 0xFFFF)


def is_scalar_value(cp: int) -> bool:
    """A code point that UTF-8 can encode."""
    return 0 <= cp <= MAX_CODE_POINT and cp not in SURROGATES


def is_scanner_char(cp: int) -> bool:
    """A character `file:consult` reads, raw or escaped, anywhere in a file (comments too)."""
    return is_scalar_value(cp) and cp not in SCANNER_NONCHARACTERS
