"""Invoke task `docs.tables`: rewrite each registry's table in its docs page (thin: the rendering is
sparkforge.extensions)."""

from __future__ import annotations

from pathlib import Path

from invoke import Collection, Context

from sparkforge.cli import task, user_errors
from sparkforge.context import Session
from sparkforge.extensions import Table, stale_tables

ROOT = Path(__file__).resolve().parents[2]


def registry_pages() -> list[tuple[Table, Path]]:
    """Every registry (and the recipe schema's keys) and the docs page that shows its table (between
    `<!-- registry:NAME -->` markers).

    A stage's registry is added HERE once; tests/unit/test_docs_tables.py fails when a page is stale.
    """
    from sparkforge.preflight.checks import CHECKS as PREFLIGHT_CHECKS
    from sparkforge.recipe.fields import recipe_fields
    from sparkforge.run.bench.harnesses import HARNESSES
    from sparkforge.run.bench.suites import SUITES
    from sparkforge.run.cluster.doctor import STAGES as DOCTOR_STAGES
    from sparkforge.run.conform.rows import ROWS as CONFORM_ROWS
    from sparkforge.verify.imagechecks import IMAGE_CHECKS

    return [
        (PREFLIGHT_CHECKS, ROOT / "docs" / "checks.md"),
        (IMAGE_CHECKS, ROOT / "docs" / "checks.md"),
        (SUITES, ROOT / "docs" / "run.md"),
        (HARNESSES, ROOT / "docs" / "run.md"),
        (CONFORM_ROWS, ROOT / "docs" / "run.md"),
        (DOCTOR_STAGES, ROOT / "docs" / "run.md"),
        (recipe_fields(), ROOT / "docs" / "reference.md"),
    ]


@task(help={"check": "only say which pages are stale (exit 1), write nothing"})
@user_errors
def tables(c: Context, session: Session, check: bool = False) -> None:
    """Rewrite every registry's table in its docs page, and the recipe's keys in docs/reference.md."""
    stale = stale_tables(registry_pages(), write=not check)
    for page in stale:
        session.out(f"{page.relative_to(ROOT)}: {'stale' if check else 'rewritten'}")
    if not stale:
        session.out("docs tables: every page matches its registry")
    elif check:
        from invoke.exceptions import Exit

        raise Exit("sparkforge: docs tables are stale; fix: run 'invoke docs.tables'", code=1)


ns = Collection("docs")
ns.add_task(tables, "tables")
