"""Recipe files for tests: a few lines of YAML under an `extends:` line, written where the test says."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sparkforge.recipe.loader import REPO_ROOT

SMOKE = REPO_ROOT / "tests" / "recipes" / "smoke-multiarch.yaml"
SMOKE_PLATFORMS = ("linux/amd64", "linux/arm64")  # what the smoke recipe builds


def write_recipe_file(path: Path, body: str | Mapping[str, Any] = "", *, extends: Path | None) -> Path:
    """Write `body` (YAML text, or a mapping dumped in its own order) to `path`, extending `extends` if given."""
    if not isinstance(body, str):
        body = yaml.safe_dump(body, sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((f"extends: {extends}\n" if extends else "") + body)
    return path


def smoke_recipe_file(
    directory: Path,
    registry_host: str,
    *,
    repository: str = "sparkforge/smoke-multiarch",
    name: str = "smoke-multiarch",
    signing_key: Path | None = None,
    **versions: str,
) -> Path:
    """The smoke recipe published to a test registry (signed with `signing_key` if given); each of `versions`
    overrides a component's pin, which makes a drifted recipe."""
    lines = ["publish:", f"  repository: {registry_host}/{repository}"]
    if signing_key is not None:
        lines += ["  signing:", f"    key: {signing_key}"]
    if versions:
        lines.append("components:")
        for component, version in versions.items():
            lines += [f"  {component}:", f"    version: {version}"]
    return write_recipe_file(directory / f"{name}.yaml", "\n".join(lines) + "\n", extends=SMOKE)
