"""The recipe-key table of docs/reference.md is generated from the schema (recipe/fields.py): every key of the
schema, as pydantic's own JSON schema names it, has a row with a meaning, and a field added to the schema
reaches the table with no other edit."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field

from sparkforge.recipe.fields import SchemaTable, recipe_fields
from sparkforge.recipe.schema import Publish, RecipeModel

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def schema_keys(schema: dict[str, Any], node: dict[str, Any], prefix: str = "") -> set[str]:
    """Every key path in pydantic's JSON schema of the recipe (an independent reading of the same model)."""
    found: set[str] = set()
    for name, prop in node.get("properties", {}).items():
        path = f"{prefix}{name}"
        found.add(path)
        for option in [prop, *prop.get("anyOf", []), prop.get("items", {})]:
            ref = option.get("$ref") or option.get("items", {}).get("$ref")
            if ref:
                listed = "items" in option or ("items" in prop and option is prop.get("items"))
                sub = f"{path}[]." if listed else f"{path}."
                found |= schema_keys(schema, schema["$defs"][ref.rsplit("/", 1)[1]], sub)
    return found


def table_keys(text: str) -> dict[str, str]:
    """The table's rows in the page: key -> meaning."""
    rows = re.findall(r"^\| `([^`]+)` \|.*\| (.*) \|$", text, re.M)
    return {key.replace("\\|", "|"): meaning for key, meaning in rows}


def test_every_schema_key_has_a_row_with_a_meaning() -> None:
    schema = RecipeModel.model_json_schema()
    wanted = schema_keys(schema, schema)
    names = "|".join(RecipeModel.model_fields["components"].annotation.model_fields)  # type: ignore[union-attr]
    wanted = {re.sub(rf"^components\.({names})\.", "components.NAME.", k) for k in wanted}
    wanted = {re.sub(rf"^components\.({names})$", f"components.<{names}>", k) for k in wanted}
    shown = table_keys(PAGE.read_text())
    assert len(wanted) > 60
    assert sorted(wanted - set(shown)) == []
    assert [k for k, meaning in shown.items() if not meaning.strip()] == []


def test_a_new_field_reaches_the_table_from_its_declaration_alone() -> None:
    class Wider(Publish):
        mirror: str | None = Field(None, description="a second registry the images are copied to")

    class WiderRecipe(RecipeModel):
        publish: Wider = Field(description="where and how the images are published")

    table = SchemaTable("recipe-fields", WiderRecipe).markdown_table()
    assert "| `publish.mirror` | text |  | a second registry the images are copied to |" in table
    assert "publish.mirror" not in recipe_fields().markdown_table()
