"""The recipe's keys as users read them, from the schema (recipe/schema.py) alone: one row per key, with its type,
default and meaning (the field's description, else its model's docstring). docs/reference.md shows the table
between `<!-- registry:recipe-fields -->` markers; `invoke docs.tables` rewrites it (cli/docs.py) and
tests/unit/test_docs_tables.py fails when it is stale. Adding a recipe field is its `Field(description=...)`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class Key:
    """One key of the recipe: its dotted path, type, default and meaning."""

    path: str
    kind: str
    default: str
    meaning: str


def _bare(annotation: Any) -> tuple[Any, list[Any]]:
    """The annotation without `| None` and Annotated's layers, and the metadata of those layers."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    metadata: list[Any] = []
    while typing.get_origin(annotation) is typing.Annotated:
        metadata += annotation.__metadata__
        annotation = typing.get_args(annotation)[0]
    return annotation, metadata


def _model(annotation: Any) -> type[BaseModel] | None:
    bare, _ = _bare(annotation)
    return bare if isinstance(bare, type) and issubclass(bare, BaseModel) else None


def _kind(annotation: Any, info: FieldInfo | None = None) -> str:
    bare, metadata = _bare(annotation)
    metadata += info.metadata if info else []
    origin = typing.get_origin(bare)
    if origin is typing.Literal:
        return " / ".join(f"`{v}`" for v in typing.get_args(bare))
    if origin is list:
        return "list: " + _kind(typing.get_args(bare)[0])
    if origin is dict:
        return "mapping NAME: value"
    if _model(bare):
        return "mapping"
    if bare is bool:
        return "bool"
    if bare is int:
        found = {a: getattr(m, a) for m in metadata for a in ("ge", "le") if hasattr(m, a)}
        span = f" ({found['ge']}-{found['le']})" if {"ge", "le"} <= set(found) else ""
        return "integer" + span
    from sparkforge.recipe.schema import Shape

    return next((str(m) for m in metadata if isinstance(m, Shape)), "text")


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]
    if value is None or isinstance(value, BaseModel):
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | dict):
        return f"{len(value)} entries" if len(value) > 2 else f"`{value}`" if value else "empty"
    return f"`{value}`"


def _meaning(info: FieldInfo, model: type[BaseModel] | None) -> str:
    text = info.description or (model.__doc__ or "" if model else "")
    return " ".join(text.split())


def keys(model: type[BaseModel], prefix: str = "") -> Iterator[Key]:
    """Every key of `model`, depth first, in the schema's order. A model whose fields all share one model
    (components: vllm, torch, ...) is one row `prefix.<a|b|...>` and its fields once under `prefix.NAME`."""
    fields = model.model_fields
    shared = {_model(f.annotation) for f in fields.values()}
    if len(shared) == 1 and None not in shared and len(fields) > 1:
        inner = shared.pop()
        yield Key(f"{prefix}<{'|'.join(fields)}>", "mapping", "", " ".join((model.__doc__ or "").split()))
        yield from keys(inner, f"{prefix}NAME.")  # type: ignore[arg-type]
        return
    for name, info in fields.items():
        path = f"{prefix}{name}"
        nested = _model(info.annotation)
        bare, _ = _bare(info.annotation)
        item = typing.get_args(bare)[0] if typing.get_origin(bare) is list else None
        listed = _model(item) if item is not None else None
        yield Key(path, _kind(info.annotation, info), _default(info), _meaning(info, nested or listed))
        if nested:
            yield from keys(nested, f"{path}.")
        elif listed:
            yield from keys(listed, f"{path}[].")


class SchemaTable:
    """A schema's keys as a docs table between `<!-- registry:NAME -->` markers (the Registry's protocol:
    `render_into`, which extensions.stale_tables calls)."""

    def __init__(self, stage: str, model: type[BaseModel]) -> None:
        self.stage = stage
        self.model = model

    def rows(self) -> list[Key]:
        return list(keys(self.model))

    def markdown_table(self) -> str:
        lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
        for key in self.rows():
            cells = (f"`{key.path}`", key.kind, key.default, key.meaning)
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        return "\n".join(lines)

    def render_into(self, page: str) -> str:
        from sparkforge.extensions import render_between

        marker = f"<!-- registry:{self.stage} -->", f"<!-- /registry:{self.stage} -->"
        return render_between(page, marker, self.markdown_table())


def recipe_fields() -> SchemaTable:
    """The recipe's keys (RecipeModel), imported when a docs table is asked for."""
    from sparkforge.recipe.schema import RecipeModel

    return SchemaTable("recipe-fields", RecipeModel)
