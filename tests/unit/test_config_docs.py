"""docs/configuration.md carries the keys table the schema renders (drift test)."""

from __future__ import annotations

from gateway.config.docs import DOCS_PATH, generated_block, render_keys_table, replace_block
from gateway.config.keys import SCHEMA


def test_docs_carry_the_rendered_keys_table() -> None:
    document = DOCS_PATH.read_text(encoding="utf-8")
    assert generated_block() in document, (
        "docs/configuration.md is stale: run `python -m gateway.config.docs --write`"
    )


def test_every_key_and_variable_has_a_row() -> None:
    table = render_keys_table()
    for key in SCHEMA.keys:
        assert f"| `{key.name}` |" in table
        if key.env is not None:
            assert f"`{key.env.var}`" in table


def test_replace_block_rewrites_only_the_block() -> None:
    document = f"intro\n{generated_block().replace('health_port', 'old')}\noutro\n"
    assert replace_block(document) == f"intro\n{generated_block()}\noutro\n"
