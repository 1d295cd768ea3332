"""What a recipe's image may weigh (`image.max_size`) and what its build removes on purpose (`runtime.remove`).

A removal is declared, never silent: each names files below the venv's site-packages and why nothing the recipe
serves loads them. slim-venv.py deletes them in the pip step that wrote them (so they never reach a layer) and
logs the bytes; they are part of the recipe hash and of the lock the image carries, so `invoke diff` shows them.
The budget is checked by verify (and so by every build before it tags): an image over it fails, naming its size.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from sparkforge.report import Check

# Below site-packages: letters, digits and glob characters; no '..', no absolute path, nothing a shell reads.
_GLOB = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.*?/\[\]+-]*")
_REASON = re.compile(r"[A-Za-z0-9 ,.;:()'/_+=%<>-]{10,300}")
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]{1,3})?)(GB|MB)")
UNITS = {"GB": 1000**3, "MB": 1000**2}  # the engine's sizes are decimal (what `docker images` shows)


class Removal(BaseModel):
    """Files below site-packages the image leaves out, and why nothing the recipe serves needs them."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    glob: StrictStr = Field(
        description="path glob below site-packages, e.g. 'torch/include' or 'triton/**/*.a'"
    )
    reason: StrictStr = Field(description="why nothing the recipe serves loads them (10 to 300 characters)")

    @field_validator("glob")
    @classmethod
    def _check_glob(cls, value: str) -> str:
        if not _GLOB.fullmatch(value) or ".." in value.split("/") or "//" in value:
            raise ValueError(
                f"runtime.remove.glob: {value!r} is not a relative path glob below site-packages; fix: e.g. "
                "'torch/include' or 'nvidia/cu13/lib/*.a' (letters, digits, . _ - + * ? [ ] and /, no '..')"
            )
        return value

    @field_validator("reason")
    @classmethod
    def _check_reason(cls, value: str) -> str:
        if not _REASON.fullmatch(value):
            raise ValueError(
                f"runtime.remove.reason: {value[:60]!r} is not a one-line reason of 10 to 300 plain characters; "
                "fix: say why nothing the recipe serves loads these files (e.g. 'headers: no extension is "
                "compiled against torch at serve time')"
            )
        return value


class ImageBudget(BaseModel):
    """The most the runtime image may weigh on the engine (uncompressed, as `docker images` shows)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_size: StrictStr | None = Field(
        None, description="e.g. '8GB' or '7500MB' (decimal units, as Docker shows)"
    )

    @field_validator("max_size")
    @classmethod
    def _check_size(cls, value: str | None) -> str | None:
        if value is not None and not _SIZE.fullmatch(value):
            raise ValueError(f"image.max_size: {value!r} is not a size; fix: write e.g. '8GB' or '7500MB'")
        return value

    @property
    def max_bytes(self) -> int | None:
        """The budget in bytes (None: no budget)."""
        if self.max_size is None:
            return None
        found = _SIZE.fullmatch(self.max_size)
        assert found is not None  # checked by the validator
        return int(float(found.group(1)) * UNITS[found.group(2)])


def over_budget(size: int, budget: ImageBudget, removals: int) -> str | None:
    """None when `size` bytes fit the budget (or there is none); else the reason, naming the fix."""
    limit = budget.max_bytes
    if limit is None or size <= limit:
        return None
    return (
        f"the image is {size / 1e9:.2f} GB, over the recipe's image.max_size {budget.max_size} by "
        f"{(size - limit) / 1e9:.2f} GB ({removals} declared removals applied); fix: find what nothing the recipe "
        "serves loads ('invoke size --image REF' lists the layers and duplicates) and declare it in runtime.remove "
        "with its reason, or raise image.max_size in the recipe"
    )


def size_check(size: int, budget: ImageBudget, removed: Sequence[Removal]) -> Check:
    """verify's `size` check: the image's engine size against the recipe's image.max_size."""
    removals = len(removed)
    if budget.max_bytes is None:
        return Check("size", "skipped", f"no image.max_size in the recipe (the image is {size / 1e9:.2f} GB)")
    problem = over_budget(size, budget, removals)
    details = {"bytes": size, "max_bytes": budget.max_bytes, "declared_removals": removals}
    if problem:
        return Check("size", "failed", problem, details)
    return Check("size", "passed", f"{size / 1e9:.2f} GB, within image.max_size {budget.max_size}", details)
