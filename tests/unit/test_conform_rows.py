"""Conform's rows are declared once (sparkforge/run/conform/rows.py): the profile schema's names, `--checks`, the
task's help and the table in docs/run.md all follow the registry, and a stale copy fails here."""

from __future__ import annotations

import pytest

from sparkforge.cli.conform import conform
from sparkforge.errors import RunError
from sparkforge.recipe.conformspec import CHECKS, ConformSettings
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.run.conform.rows import ROWS
from sparkforge.run.conform.session import parse_checks

DOCS = REPO_ROOT / "docs" / "run.md"


def test_the_profile_schema_allows_exactly_the_registered_rows_in_their_order() -> None:
    assert ROWS.names() == CHECKS
    assert ConformSettings().checks == list(ROWS.defaults())
    with pytest.raises(ValueError, match="checks"):
        ConformSettings.model_validate({"checks": [ROWS.names()[0], "speed"]})


def test_checks_are_parsed_by_the_registry_in_its_order_and_an_unknown_one_names_every_row() -> None:
    first, *_, last = ROWS.names()
    assert parse_checks(f"{last}, {first}") == (first, last)
    with pytest.raises(RunError, match="unknown conform row 'speed'") as info:
        parse_checks(f"{first},speed")
    assert all(name in str(info.value) for name in ROWS.names())


def test_the_task_help_lists_every_row_with_its_line() -> None:
    text = str(conform.help["checks"])  # a LazyHelp: the registry read when help is shown
    for row in ROWS:
        assert f"{row.name}: {row.help}" in text


def test_the_docs_table_is_the_registrys() -> None:
    page = DOCS.read_text()
    assert ROWS.render_into(page) == page, (
        f"{DOCS}: the conform rows table is stale; fix: replace the block between {ROWS.marker()[0]} and its end "
        f"marker with:\n{ROWS.markdown_table()}"
    )
