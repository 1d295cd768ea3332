"""Shared fixtures for unit tests: recipe files written into a temporary directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from sparkforge.recipe.loader import RECIPES_DIR


@pytest.fixture
def write_recipe(tmp_path: Path) -> Callable[..., Path]:
    """Write a recipe file; `extends` defaults to the shipped source recipe (by absolute path)."""

    def write(
        text: str | dict | None = None, *, name: str = "test.yaml", extends: str | None = "vllm-qwen35"
    ) -> Path:
        path = tmp_path / name
        if isinstance(text, dict):
            text = yaml.safe_dump(text, sort_keys=False)
        body = text or ""
        if extends:
            body = f"extends: {RECIPES_DIR / (extends + '.yaml')}\n" + body
        path.write_text(body)
        return path

    return write
