"""Errors raised while reading configuration text, before any schema is involved."""

from __future__ import annotations


class TermSyntaxError(ValueError):
    """A term file that does not parse. `str()` reads `file:line:column: message`, the form
    editors and CI annotators jump to. The message names the kind of token at fault, never
    the contents of a string, because config files hold paths to key files and similar."""

    def __init__(self, file: str, line: int, column: int, message: str) -> None:
        super().__init__(f"{file}:{line}:{column}: {message}")
        self.file = file
        self.line = line
        self.column = column
        self.message = message
