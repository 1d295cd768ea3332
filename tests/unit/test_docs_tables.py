"""Every registry's table in its docs page is the registry's own rendering (`invoke docs.tables` rewrites them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkforge.cli.docs import registry_pages
from sparkforge.extensions import stale_tables


@pytest.mark.parametrize(("registry", "page"), registry_pages(), ids=lambda x: getattr(x, "stage", None))
def test_the_docs_table_matches_its_registry(registry: object, page: Path) -> None:
    text = page.read_text()
    assert registry.render_into(text) == text, (  # type: ignore[attr-defined]
        f"{page.name}: the {registry.stage} table is stale; fix: run 'invoke docs.tables'"  # type: ignore[attr-defined]
    )


def test_a_changed_row_makes_the_page_stale_and_a_rewrite_fixes_it(tmp_path: Path) -> None:
    registry, page = registry_pages()[0]
    copy = tmp_path / page.name
    copy.write_text(page.read_text().replace(registry.markdown_table(), "| stale |"))
    assert stale_tables([(registry, copy)]) == [copy]
    assert stale_tables([(registry, copy)], write=True) == [copy]
    assert stale_tables([(registry, copy)]) == [] and copy.read_text() == page.read_text()
