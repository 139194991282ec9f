"""The keys table of docs/configuration.md, rendered from the declarations.

    python -m gateway.config.docs            print the generated block
    python -m gateway.config.docs --write    replace it in docs/configuration.md

The block sits between two marker comments; a test fails when the file's block differs from
what the schema renders, so the documentation cannot drift from the code.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.config.keys import SCHEMA
from gateway.config.loader import PROJECT_ROOT
from gateway.config.schema import Key, NameOrigin
from gateway.config.section import Schema
from gateway.config.terms import format_term

BEGIN_MARKER = "<!-- BEGIN generated: keys table (python -m gateway.config.docs --write) -->"
END_MARKER = "<!-- END generated: keys table -->"
DOCS_PATH = PROJECT_ROOT / "docs" / "configuration.md"

_COLUMNS = (
    "Key",
    "Default",
    "Valid values",
    "Read when",
    "Env override",
    "Bad value",
    "Name",
    "What it does",
)


def _cell(text: str) -> str:
    # A `|` would end the cell in a Markdown table.
    return text.replace("|", "\\|")


def _default(key: Key[Any]) -> str:
    return key.default_doc or f"`{format_term(key.default)}`"


def _env(key: Key[Any]) -> str:
    if key.env is None:
        return "none"
    ours = ", name ours" if key.env.origin is NameOrigin.OURS else ""
    text = f"`{key.env.var}` ({key.env.form}{ours})"
    return text + "; value never logged" if key.secret else text


def _bad(key: Key[Any]) -> str:
    if not key.effect:
        return "no effect"
    return key.bad_doc or key.on_bad.describe()


def _origin(key: Key[Any]) -> str:
    if key.origin is NameOrigin.OURS:
        return "**ours**"
    return f"manual; ours: {', '.join(key.our_choices)}" if key.our_choices else "manual"


def _row(key: Key[Any]) -> str:
    cells = (
        f"`{key.name}`",
        _default(key),
        "any term (read by nothing)" if not key.effect else key.convert.expected,
        key.read_when,
        _env(key),
        _bad(key),
        _origin(key),
        key.doc,
    )
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def render_keys_table(schema: Schema = SCHEMA) -> str:
    """The Markdown block: the keys table, then the dead keys and the no-effect variables."""
    lines = [
        f"Section `{schema.section}`; {len(schema.keys)} keys, grouped by area.",
        "",
        "| " + " | ".join(_COLUMNS) + " |",
        "|" + "---|" * len(_COLUMNS),
        *(_row(key) for key in schema.keys),
        "",
        f"- Also accepted, named in one INFO line at boot and read by nothing: {schema.dead.doc}.",
    ]
    for variable in schema.no_effect_env:
        lines.append(f"- `{variable.var}`: {variable.doc}; one WARNING at boot when set.")
    return "\n".join(lines) + "\n"


def generated_block(schema: Schema = SCHEMA) -> str:
    return f"{BEGIN_MARKER}\n{render_keys_table(schema)}{END_MARKER}"


def replace_block(document: str, schema: Schema = SCHEMA) -> str:
    start = document.index(BEGIN_MARKER)
    end = document.index(END_MARKER) + len(END_MARKER)
    return document[:start] + generated_block(schema) + document[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"update {DOCS_PATH}")
    args = parser.parse_args(argv)
    if args.write:
        DOCS_PATH.write_text(replace_block(DOCS_PATH.read_text(encoding="utf-8")), "utf-8")
    else:
        sys.stdout.write(generated_block() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
