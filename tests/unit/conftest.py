"""Shared fixtures for unit tests: recipe files written into a temporary directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sparkforge.recipe.loader import RECIPES_DIR
from tests.recipe_files import write_recipe_file


@pytest.fixture
def write_recipe(tmp_path: Path) -> Callable[..., Path]:
    """Write a recipe file; `extends` defaults to the shipped source recipe (by absolute path)."""

    def write(
        text: str | dict | None = None, *, name: str = "test.yaml", extends: str | None = "vllm-qwen35"
    ) -> Path:
        parent = RECIPES_DIR / f"{extends}.yaml" if extends else None
        return write_recipe_file(tmp_path / name, "" if text is None else text, extends=parent)

    return write
