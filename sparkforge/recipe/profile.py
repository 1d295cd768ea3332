"""Serve profiles: YAML files in profiles/ -> a strictly validated model -> the `vllm serve` arguments.

A profile says what to serve and how (model, vLLM serve arguments, environment, node count); which image
serves it is the recipe's business. Files are read with the recipe loader (duplicate keys, file:line:key
errors); the flags and parser names themselves are checked against the pinned vLLM by preflight (serveflags).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparkforge.errors import ProfileError, RecipeError
from sparkforge.recipe.loader import REPO_ROOT, explain_errors, read_yaml, resolve_named_file

PROFILES_DIR = REPO_ROOT / "profiles"
# Flags sparkforge sets itself from --port, --nodes and the cluster plan; a profile setting them would conflict.
RESERVED_FLAGS = {
    "model": "the profile's 'model' key",
    "port": "--port",
    "host": "sparkforge (0.0.0.0 on the head)",
    "nnodes": "--nodes",
    "node-rank": "the cluster plan",
    "master-addr": "the cluster plan (the head's link address)",
    "master-port": "--master-port",
    "headless": "the cluster plan (every node but the head)",
    "distributed-executor-backend": "--backend",
    "data-parallel-address": "the cluster plan",
}
_FLAG = re.compile(r"[a-z0-9][a-z0-9_-]*(\.[a-z0-9_-]+)*")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_ENV = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}

ArgValue = bool | int | float | str | list[str | int | float]


class AnswerCheck(BaseModel):
    """What `serve` asks once healthy, and a regular expression the answer must match (a green health check is
    not an answer check: a stale or broken model can answer garbage)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: Annotated[str, Field(min_length=1, max_length=2000)]
    expect: Annotated[str, Field(min_length=1, max_length=500)]
    max_tokens: Annotated[int, Field(ge=1, le=32768)] = 2048
    # vLLM's sampling extension: generate exactly max_tokens (a random-weight test model would stop anywhere).
    ignore_eos: bool = False

    @field_validator("expect")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(
                f"{value!r} is not a regular expression ({exc}); fix: e.g. '\\b391\\b'"
            ) from None
        return value


class ProfileModel(BaseModel):
    """The schema of a profile file (unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str
    model: Annotated[str, Field(min_length=1)]
    nodes: Annotated[int, Field(ge=1, le=64)] = 1
    gpus_per_node: Annotated[int, Field(ge=1, le=8)] = 1
    args: dict[str, ArgValue] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    served_model_name: str | None = None
    # The model class the checkpoint's config.json names: checked against the image's vLLM before any download.
    architecture: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    check: AnswerCheck | None = None

    @field_validator("args")
    @classmethod
    def _flags(cls, args: dict[str, ArgValue]) -> dict[str, ArgValue]:
        for key, value in args.items():
            name = key.removeprefix("--")
            if key.startswith("-"):
                raise ValueError(f"write the flag without dashes: '{name}: ...' instead of '{key}: ...'")
            if not _FLAG.fullmatch(key):
                raise ValueError(f"{key!r} is not a vLLM flag name; fix: e.g. 'max-model-len: 32768'")
            if key.replace("_", "-") in RESERVED_FLAGS:
                raise ValueError(
                    f"{key!r} is set by {RESERVED_FLAGS[key.replace('_', '-')]}; fix: remove it from args"
                )
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str) and ("\n" in item or "\0" in item):
                    raise ValueError(f"{key!r}: values are one line; fix: remove the line break")
        return args

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not _ENV.fullmatch(key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if key in _SECRET_ENV:
                raise ValueError(
                    f"{key} would land in 'docker inspect'; fix: remove it and pass --hf-token-file (mounted, never in env)"
                )
            if "\n" in value or "\0" in value:
                raise ValueError(f"{key}: values are one line")
        return env

    @model_validator(mode="after")
    def _parallelism(self) -> ProfileModel:
        tp = int(self.args.get("tensor-parallel-size", self.args.get("tp", 1)))  # type: ignore[arg-type]
        pp = int(self.args.get("pipeline-parallel-size", self.args.get("pp", 1)))  # type: ignore[arg-type]
        gpus = self.nodes * self.gpus_per_node
        if tp * pp != gpus:
            raise ValueError(
                f"tensor-parallel-size {tp} x pipeline-parallel-size {pp} = {tp * pp} GPUs, but nodes {self.nodes} x "
                f"gpus_per_node {self.gpus_per_node} = {gpus}; fix: make them equal (a Spark has one GPU)"
            )
        return self


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    model: ProfileModel
    lines: dict[tuple[str, ...], int]

    def line_of(self, *key: str) -> int:
        return self.lines.get(tuple(key), self.lines.get(tuple(key[:1]), 1))

    def serve_args(self) -> list[str]:
        """The profile's `vllm serve` arguments after the model: --flag value, --flag (true), --no-flag (false)."""
        argv: list[str] = []
        for key, value in self.model.args.items():
            if value is True:
                argv.append(f"--{key}")
            elif value is False:
                argv.append(f"--no-{key}")
            elif isinstance(value, list):
                argv += [f"--{key}", *(str(v) for v in value)]
            else:
                argv += [f"--{key}", str(value)]
        if self.model.served_model_name:
            argv += ["--served-model-name", self.model.served_model_name]
        return argv


def resolve_profile_path(ref: str | Path) -> Path:
    """A profile name in profiles/ or a path (relative to the working directory)."""
    return resolve_named_file(ref, PROFILES_DIR, "profile", list_profile_names(), ProfileError)


def load_profile(ref: str | Path) -> Profile:
    """Load and validate a profile; errors name file, line, key path and the fix."""
    path = resolve_profile_path(ref)
    try:
        doc = read_yaml(path)
    except RecipeError as exc:
        raise ProfileError(str(exc).replace("a recipe", "a profile").replace("recipe", "profile")) from None
    origins = {key: (path, line) for key, line in doc.lines.items()}
    try:
        model = ProfileModel.model_validate(doc.data)
    except ValidationError as exc:
        problems = [explain_errors(e, origins, path, ProfileModel) for e in exc.errors()]
        raise ProfileError(f"profile {path.stem} is invalid:\n  " + "\n  ".join(problems)) from None
    return Profile(path.stem, path, model, dict(doc.lines))


def list_profile_names() -> list[str]:
    if not PROFILES_DIR.is_dir():
        return []
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml") if not p.name.startswith("_"))
