"""The two community formats, as their own tools define them, read strictly (unknown keys are errors).

The community runner (eugr/spark-vllm-docker, run-recipe.py): `recipe_version: "1"`; required `name`,
`recipe_version`, `container`, `command`; optional `description`, `model`, `mods`, `defaults`, `env`,
`build_args`, `cluster_only`, `solo_only`. The command is filled with Python's `str.format(**defaults)` (one
pass; `{{`/`}}` are literal braces); extra vLLM words after `--` on its command line are appended.

Spark Arena (sparkrun, RECIPES.md and sparkrun/core/recipe.py): `recipe_version: 2` (the default); `model`
(required), `model_revision`, `runtime` (Spark Arena takes `vllm` / `vllm-ray`; sparkrun also resolves
`vllm-distributed`), `container`, `command` (a template; `{model}` and every `defaults` key, substituted
until nothing changes), `defaults`, `env`, `min_nodes`, `max_nodes`, `mode`, `solo_only`, `cluster_only`,
`metadata`, `runtime_config`, lifecycle hooks, `benchmark`, `builder`; the experimental recipes' `mods`.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from sparkforge.errors import RecipeError
from sparkforge.recipe.yamlfile import YamlDoc

Format = Literal["eugr", "sparkarena", "nvidia-v3", "nvidia-v4"]
FORMATS: tuple[Format, ...] = ("eugr", "sparkarena", "nvidia-v3", "nvidia-v4")  # NVIDIA's catalog: nvidia.py
Scalar = StrictStr | StrictBool | StrictInt | StrictFloat
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
VLLM_RUNTIMES = (
    "vllm",
    "vllm-ray",
    "vllm-distributed",
    "eugr-vllm",
)  # the last: sparkrun running the runner's image


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EugrRecipe(_Strict):
    """The community runner's recipe (run-recipe.py's load_recipe: required and optional keys)."""

    recipe_version: Literal["1"]
    name: StrictStr = Field(min_length=1)
    container: StrictStr = Field(min_length=1)
    command: StrictStr = Field(min_length=1)
    description: StrictStr = ""
    model: StrictStr | None = None
    mods: list[StrictStr] = Field(default_factory=list)
    defaults: dict[StrictStr, Scalar] = Field(default_factory=dict)
    env: dict[StrictStr, Scalar] = Field(default_factory=dict)
    build_args: list[StrictStr] = Field(default_factory=list)
    cluster_only: StrictBool = False
    solo_only: StrictBool = False


class SparkArenaRecipe(_Strict):
    """Spark Arena's recipe (sparkrun's known keys; Spark Arena takes version 2 with a vLLM runtime)."""

    recipe_version: Literal["2"] = "2"
    sparkrun_version: Literal["2"] | None = None
    name: StrictStr | None = None
    description: StrictStr = ""
    model: StrictStr = Field(min_length=1)
    model_revision: StrictStr | None = None
    runtime: StrictStr = "vllm"
    runtime_version: StrictStr | None = None
    mode: Literal["auto", "solo", "cluster"] = "auto"
    min_nodes: StrictInt = Field(1, ge=1, le=64)
    max_nodes: StrictInt | None = Field(None, ge=1, le=64)
    container: StrictStr = Field(min_length=1)
    defaults: dict[StrictStr, Scalar] = Field(default_factory=dict)
    env: dict[StrictStr, Scalar] = Field(default_factory=dict)
    command: StrictStr = Field(min_length=1)
    runtime_config: dict[StrictStr, Any] = Field(default_factory=dict)
    cluster_only: StrictBool = False
    solo_only: StrictBool = False
    benchmark: dict[StrictStr, Any] | None = None
    metadata: dict[StrictStr, Any] = Field(default_factory=dict)
    pre_exec: list[Any] = Field(default_factory=list)
    post_exec: list[StrictStr] = Field(default_factory=list)
    post_commands: list[StrictStr] = Field(default_factory=list)
    stop_after_post: StrictBool = False
    builder: StrictStr | None = None
    builder_config: dict[StrictStr, Any] = Field(default_factory=dict)
    # Spark Arena's experimental recipes: the runner's mods (paths), judged at import (sparkforge/imagebuild/overlay/mods.py).
    mods: list[StrictStr] = Field(default_factory=list)


@dataclass(frozen=True)
class CommunityRecipe:
    """A community recipe, read and rendered: what a profile is made of, and what it cannot carry."""

    format: Format
    where: str  # the file or URL, for messages
    name: str
    description: str
    model: str | None
    container: str
    command: str  # rendered: placeholders filled
    defaults: dict[str, object]
    env: dict[str, object]
    lines: dict[tuple[str, ...], int]
    mods: tuple[str, ...] = ()
    build_args: tuple[str, ...] = ()
    cluster_only: bool = False
    solo_only: bool = False
    min_nodes: int = 1
    model_revision: str | None = None
    runtime: str = "vllm"
    uncarried: dict[str, object] = field(default_factory=dict)  # keys sparkforge does not run (hooks, ...)
    notes: tuple[tuple[str, str], ...] = ()  # (key, what the format's own reader left out and why)

    def at(self, *key: str) -> str:
        """`file:line: key` for a message."""
        line = self.lines.get(tuple(key), self.lines.get(tuple(key[:1])))
        return f"{self.where}:{line}: {'.'.join(key)}" if line else f"{self.where}: {'.'.join(key)}"


def detect_format(data: dict[str, Any], where: str) -> Format:
    """Which format a document is, from its version keys (the runner requires one; sparkrun defaults to 2)."""
    if str(data.get("schema_version")) in ("3", "4"):  # NVIDIA's catalog (recipe/community/nvidia.py)
        return "nvidia-v3" if str(data["schema_version"]) == "3" else "nvidia-v4"
    version = str(data.get("recipe_version", data.get("sparkrun_version", "")))
    if version == "1":
        return "eugr"
    if version == "2" or "runtime" in data:
        return "sparkarena"
    raise RecipeError(
        f"{where}: recipe_version: neither '1' (the community runner) nor 2 (Spark Arena), and no 'runtime' key; "
        "fix: pass --format eugr or --format sparkarena, or add the recipe_version the file was written for"
    )


def _errors(exc: ValidationError, doc: YamlDoc, where: str, fmt: Format) -> RecipeError:
    problems = []
    for error in exc.errors()[:4]:
        key = tuple(str(p) for p in error["loc"])
        line = doc.lines.get(key, doc.lines.get(key[:1]))
        spot = f"{where}:{line}" if line else where
        if error["type"] == "extra_forbidden":
            what = f"unknown top-level key {key[0]!r}" if len(key) == 1 else f"unknown key {'.'.join(key)!r}"
            problems.append(
                f"{spot}: {what} for the {fmt} format; fix: remove it (nothing is ignored silently)"
            )
        elif error["type"] == "missing":
            problems.append(f"{spot}: {'.'.join(key)} is required by the {fmt} format; fix: add it")
        else:
            problems.append(f"{spot}: {'.'.join(key)}: {error['msg']}; fix: correct the value")
    return RecipeError("; ".join(problems))


def _fill_eugr(command: str, defaults: dict[str, object], recipe: CommunityRecipe) -> str:
    """run-recipe.py's `command.format(**defaults)`: only plain `{name}` fields, each with a default."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(command) if f is not None]
    except ValueError as exc:
        raise RecipeError(
            f"{recipe.at('command')}: unbalanced braces ({exc}); fix: write literal braces as '{{{{' and '}}}}'"
        ) from None
    for name in fields:
        if not _IDENT.fullmatch(name):
            raise RecipeError(
                f"{recipe.at('command')}: placeholder {{{name}}} is not a plain name; fix: use {{name}} with a "
                "key in defaults (literal braces are '{{' and '}}')"
            )
        if name not in defaults:
            raise RecipeError(
                f"{recipe.at('command')}: placeholder {{{name}}} has no value in defaults (known: "
                f"{', '.join(sorted(defaults)) or 'none'}); fix: add 'defaults: {{{name}: ...}}' to the recipe"
            )
    return command.format(**{k: _text(v) for k, v in defaults.items()})


def _fill_sparkarena(command: str, values: dict[str, object], recipe: CommunityRecipe) -> str:
    """sparkrun's substitution: `{name}` from defaults (and `{model}`), repeated until nothing changes."""
    for _ in range(16):
        missing = sorted({m for m in _PLACEHOLDER.findall(command) if m not in values})
        if missing:
            raise RecipeError(
                f"{recipe.at('command')}: placeholder {{{missing[0]}}} has no value in defaults (known: "
                f"{', '.join(sorted(values))}); fix: add 'defaults: {{{missing[0]}: ...}}' to the recipe"
            )
        filled = _PLACEHOLDER.sub(lambda m: _text(values[m.group(1)]), command)
        if filled == command:
            return command
        command = filled
    raise RecipeError(
        f"{recipe.at('command')}: placeholders refer to each other in a loop; fix: break the loop"
    )


def _text(value: object) -> str:
    return str(value)  # what both tools print: str() of the YAML scalar (True, 0.8, 8000)


def read_community(
    doc: YamlDoc, where: str, fmt: Format | None = None, overrides: Mapping[str, str] | None = None
) -> CommunityRecipe:
    """A community recipe document -> CommunityRecipe (validated, command filled); RecipeError names file and key.

    `overrides` replace `defaults` values before the command is filled, as both tools' command lines do
    (the runner's --port/--tp/..., sparkrun's -o KEY=VALUE).
    """
    data = dict(doc.data)
    found = detect_format(data, where)
    fmt = fmt or found
    if fmt != found:
        raise RecipeError(
            f"{where}: recipe_version says {found}, but --format {fmt} was asked; fix: drop --format or name the "
            "file of that format"
        )
    if fmt in ("nvidia-v3", "nvidia-v4"):
        return _read_nvidia(doc, where, fmt)
    if fmt == "eugr" and data.get("recipe_version") == 1:
        data["recipe_version"] = "1"  # YAML 1 and "1": run-recipe.py compares str(recipe_version)
    if fmt == "sparkarena":
        for key in ("recipe_version", "sparkrun_version"):
            if key in data and data[key] == 2:
                data[key] = "2"
    try:
        model = (EugrRecipe if fmt == "eugr" else SparkArenaRecipe).model_validate(data)
    except ValidationError as exc:
        raise _errors(exc, doc, where, fmt) from None
    if isinstance(model, EugrRecipe):
        base = CommunityRecipe(
            "eugr",
            where,
            model.name,
            model.description or model.name,
            model.model,
            model.container,
            model.command,
            {**model.defaults, **(overrides or {})},
            dict(model.env),
            doc.lines,
            tuple(model.mods),
            tuple(model.build_args),
            model.cluster_only,
            model.solo_only,
            2 if model.cluster_only else 1,
        )
        return _replace_command(base, _fill_eugr(model.command, base.defaults, base))
    if model.runtime not in VLLM_RUNTIMES:
        raise RecipeError(
            f"{where}:{doc.lines.get(('runtime',), 1)}: runtime {model.runtime!r} is not vLLM (Spark Arena takes "
            f"{' / '.join(VLLM_RUNTIMES[:2])}); fix: import only vLLM recipes"
        )
    uncarried = {
        k: getattr(model, k)
        for k in ("pre_exec", "post_exec", "post_commands", "benchmark", "builder", "builder_config")
        if getattr(model, k)
    }
    rc = dict(model.runtime_config)
    mods = (*model.mods, *(rc.pop("mods", ()) or ()))
    build_args = tuple(rc.pop("build_args", ()) or ())
    uncarried.update({f"runtime_config.{k}": v for k, v in rc.items()})
    nodes = max(model.min_nodes, 2 if model.cluster_only or model.mode == "cluster" else 1)
    base = CommunityRecipe(
        "sparkarena",
        where,
        model.name or Path(where).stem,
        model.description or str(model.metadata.get("description") or model.model),
        model.model,
        model.container,
        model.command,
        {**model.defaults, **(overrides or {})},
        dict(model.env),
        doc.lines,
        mods,
        build_args,
        model.cluster_only,
        model.solo_only or model.mode == "solo" or model.max_nodes == 1,
        nodes,
        model.model_revision,
        model.runtime,
        uncarried,
    )
    return _replace_command(
        base, _fill_sparkarena(model.command, {**base.defaults, "model": model.model}, base)
    )


def _read_nvidia(doc: YamlDoc, where: str, fmt: Format) -> CommunityRecipe:
    """NVIDIA's catalog (nvidia.py parses it) as the CommunityRecipe the other formats give."""
    from sparkforge.recipe.community.nvidia import parse_nvidia

    try:
        serve = parse_nvidia(dict(doc.data), where, fmt)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise _errors(exc, doc, where, fmt) from None
    fields = (serve.name, serve.description, serve.model, serve.image, serve.command)
    single = (serve.nodes > 1, serve.nodes == 1, serve.nodes, None, "vllm", {}, serve.notes)
    return CommunityRecipe(fmt, where, *fields, {}, dict(serve.env), doc.lines, (), (), *single)


def _replace_command(recipe: CommunityRecipe, command: str) -> CommunityRecipe:
    return replace(recipe, command=command)
