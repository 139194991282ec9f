"""docs/configuration.md carries the keys table the schema renders (drift test)."""

from __future__ import annotations

import attrs

from gateway.config.converters import IntRange
from gateway.config.docs import DOCS_PATH, generated_block, render_keys_table, replace_block
from gateway.config.keys import SCHEMA
from gateway.config.loader import PROJECT_ROOT
from gateway.config.schema import Key

MIGRATION = PROJECT_ROOT / "docs" / "migration.md"


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


def test_a_key_declared_without_regenerating_the_docs_fails_the_drift_check() -> None:
    undocumented = Key(
        name="undocumented_key",
        default=1,
        convert=IntRange(1, 2),
        read_when="boot",
        doc="Declared, never rendered into the docs.",
        area="node",
    )
    schema = attrs.evolve(SCHEMA, keys=(*SCHEMA.keys, undocumented))
    assert "| `undocumented_key` |" in render_keys_table(schema)
    assert generated_block(schema) not in DOCS_PATH.read_text(encoding="utf-8")


def test_every_key_says_what_it_does_and_when_it_is_read() -> None:
    for key in SCHEMA.keys:
        assert key.doc.strip() and key.read_when.strip(), key.name


def test_the_migration_guide_names_every_key() -> None:
    text = MIGRATION.read_text(encoding="utf-8")
    missing = [key.name for key in SCHEMA.keys if f"`{key.name}`" not in text]
    assert not missing, f"docs/migration.md does not say how these keys migrate: {missing}"
