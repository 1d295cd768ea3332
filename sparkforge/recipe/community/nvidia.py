"""NVIDIA's recipe catalog format (NVIDIA/local-ai-inference-recipes), schema versions 3 and 4, read strictly and
written back. The schema here is sparkforge's reading of that catalog, written without its files at hand: the keys
and their meaning are stated in docs/formats.md (section "NVIDIA's catalog") with what was assumed; unknown keys are
errors, as for the other two formats, so a catalog file that differs says where.

v3 keeps the vLLM arguments as an argv list under `serve.args`; v4 keeps them as a mapping (`engine_args`: a flag's
name without dashes -> its value; true is a bare flag, false its `--no-` form, a list repeats the flag).
Both are turned into the `vllm serve MODEL ...` command the other formats carry, so import checks them the same way.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)

from sparkforge.errors import RecipeError

Scalar = StrictStr | StrictBool | StrictInt | StrictFloat
NvidiaFormat = Literal["nvidia-v3", "nvidia-v4"]
ENGINES = ("vllm",)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class V3Model(_Strict):
    id: StrictStr = Field(min_length=1)  # the Hugging Face repository
    revision: StrictStr | None = None


class V3Engine(_Strict):
    name: StrictStr = "vllm"
    container: StrictStr = Field(min_length=1)
    version: StrictStr | None = None


class V3Hardware(_Strict):
    systems: list[StrictStr] = Field(default_factory=lambda: ["dgx-spark"])
    nodes: StrictInt = Field(1, ge=1, le=64)


class V3Serve(_Strict):
    args: list[StrictStr] = Field(default_factory=list)  # argv after `vllm serve MODEL`
    env: dict[StrictStr, Scalar] = Field(default_factory=dict)
    port: StrictInt = Field(8000, ge=1, le=65535)


class RecipeV3(_Strict):
    schema_version: Literal[3]
    name: StrictStr = Field(min_length=1)
    display_name: StrictStr | None = None
    description: StrictStr = ""
    model: V3Model
    engine: V3Engine
    hardware: V3Hardware = Field(default_factory=V3Hardware)
    serve: V3Serve = Field(default_factory=V3Serve)
    performance: StrictStr | None = None  # the performance file, relative to the recipe
    tags: list[StrictStr] = Field(default_factory=list)


class V4Metadata(_Strict):
    title: StrictStr = ""
    description: StrictStr = ""
    tags: list[StrictStr] = Field(default_factory=list)


class V4Model(_Strict):
    source: Literal["huggingface"] = "huggingface"
    repo: StrictStr = Field(min_length=1)
    revision: StrictStr | None = None


class V4Runtime(_Strict):
    engine: StrictStr = "vllm"
    image: StrictStr = Field(min_length=1)
    engine_version: StrictStr | None = None


class V4Deployment(_Strict):
    nodes: StrictInt = Field(1, ge=1, le=64)
    gpus_per_node: StrictInt = Field(1, ge=1, le=8)
    port: StrictInt = Field(8000, ge=1, le=65535)


class V4Performance(_Strict):
    file: StrictStr


class RecipeV4(_Strict):
    schema_version: Literal[4]
    id: StrictStr = Field(min_length=1)
    metadata: V4Metadata = Field(default_factory=V4Metadata)
    model: V4Model
    runtime: V4Runtime
    deployment: V4Deployment = Field(default_factory=V4Deployment)
    engine_args: dict[StrictStr, Scalar | list[Scalar]] = Field(default_factory=dict)
    environment: dict[StrictStr, Scalar] = Field(default_factory=dict)
    performance: V4Performance | None = None


def _arg_words(args: dict[str, Any]) -> list[str]:
    words: list[str] = []
    for key, value in args.items():
        if value is True:
            words.append(f"--{key}")
        elif value is False:
            words.append(f"--no-{key}")
        else:
            for item in value if isinstance(value, list) else [value]:
                words += [f"--{key}", str(item)]
    return words


@dataclass(frozen=True)
class NvidiaServe:
    """What a catalog recipe serves: formats.read_community makes it a CommunityRecipe."""

    name: str
    description: str
    model: str
    image: str
    command: str  # `vllm serve MODEL ...`, shell-quoted
    env: dict[str, object]
    nodes: int
    revision: str | None


def parse_nvidia(data: dict[str, Any], where: str, fmt: NvidiaFormat) -> NvidiaServe:
    """An NVIDIA catalog document, validated (pydantic's ValidationError for the caller to explain with lines)."""
    model = (RecipeV3 if fmt == "nvidia-v3" else RecipeV4).model_validate(data)
    if isinstance(model, RecipeV3):
        engine, image, hf, revision = (
            model.engine.name,
            model.engine.container,
            model.model.id,
            model.model.revision,
        )
        words, env, nodes, port = (
            list(model.serve.args),
            dict(model.serve.env),
            model.hardware.nodes,
            model.serve.port,
        )
        name, description = model.name, model.description or model.display_name or model.name
    else:
        engine, image, hf, revision = (
            model.runtime.engine,
            model.runtime.image,
            model.model.repo,
            model.model.revision,
        )
        words, env = _arg_words(dict(model.engine_args)), dict(model.environment)
        nodes, port = model.deployment.nodes, model.deployment.port
        name, description = model.id, model.metadata.description or model.metadata.title or model.id
        if model.deployment.gpus_per_node != 1:
            raise RecipeError(
                f"{where}: deployment.gpus_per_node {model.deployment.gpus_per_node}: a DGX Spark has one GPU; "
                "fix: import a recipe for one GPU per node"
            )
    if engine not in ENGINES:
        raise RecipeError(f"{where}: engine {engine!r} is not vLLM; fix: import only vLLM recipes")
    has_host = any(w == "--host" or w.startswith("--host=") for w in words)
    has_port = any(w == "--port" or w.startswith("--port=") for w in words)
    tail = ([] if has_host else ["--host", "0.0.0.0"]) + ([] if has_port else ["--port", str(port)])
    command = shlex.join(["vllm", "serve", hf, *words, *tail])
    return NvidiaServe(name, description, hf, image, command, env, nodes, revision)


def nvidia_document(
    fmt: NvidiaFormat,
    name: str,
    description: str,
    model: str,
    args: dict[str, Any],
    env: dict[str, str],
    *,
    image: str,
    revision: str | None = None,
    nodes: int = 1,
) -> dict[str, object]:
    """The catalog document of `fmt` for a served model (`args`: profile args, flag name -> value)."""
    if fmt == "nvidia-v3":
        doc: dict[str, object] = {
            "schema_version": 3,
            "name": name,
            "description": description,
            "model": {"id": model, **({"revision": revision} if revision else {})},
            "engine": {"name": "vllm", "container": image},
            "hardware": {"systems": ["dgx-spark"], "nodes": nodes},
            "serve": {"args": _arg_words(args), **({"env": env} if env else {}), "port": 8000},
        }
        return doc
    return {
        "schema_version": 4,
        "id": name,
        "metadata": {"title": name, "description": description},
        "model": {"source": "huggingface", "repo": model, **({"revision": revision} if revision else {})},
        "runtime": {"engine": "vllm", "image": image},
        "deployment": {"nodes": nodes, "gpus_per_node": 1, "port": 8000},
        "engine_args": dict(args),
        **({"environment": env} if env else {}),
    }
