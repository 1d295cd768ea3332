"""Serve profiles: YAML files in profiles/ -> a strictly validated model -> the `vllm serve` arguments.

A profile says what to serve and how (model, vLLM serve arguments, environment, node count); which image
serves it is the recipe's business. Files are read with the recipe loader (duplicate keys, file:line:key
errors); the flags and parser names themselves are checked against the pinned vLLM by preflight (serveflags).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from sparkforge.errors import ProfileError, RecipeError
from sparkforge.recipe.allowlist import Verdict, blocked, opt_in_warnings, owner_only, verdicts
from sparkforge.recipe.conformspec import STRICT, ConformSettings, Prompt
from sparkforge.recipe.loader import REPO_ROOT, explain_errors, read_yaml, resolve_named_file
from sparkforge.recipe.pins import HEX40, HUB_ID, PIN_FIX, pin_problems, snapshot_value
from sparkforge.recipe.serveargs import (
    MODEL,
    RESERVED_FLAGS,
    SECRET_FIX,
    check_env,
    check_flag,
    check_value,
    is_secret_value,
    norm_flag,
)
from sparkforge.recipe.values import model_finding

PROFILES_DIR = REPO_ROOT / "profiles"
PROFILE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
__all__ = ["RESERVED_FLAGS", "Profile", "ProfileModel", "load_profile"]

ArgValue = StrictBool | StrictInt | StrictFloat | StrictStr | list[StrictInt | StrictFloat | StrictStr]


class AnswerCheck(BaseModel):
    """What `serve` asks once healthy, and a regular expression the answer must match (a green health check is
    not an answer check: a stale or broken model can answer garbage)."""

    model_config = STRICT

    prompt: Annotated[Prompt, Field(min_length=1, max_length=2000)]
    expect: Annotated[str, Field(min_length=1, max_length=500)]
    max_tokens: Annotated[int, Field(ge=1, le=32768)] = 2048
    # vLLM's sampling extension: generate exactly max_tokens (a random-weight test model would stop anywhere).
    ignore_eos: bool = False

    @field_validator("expect")
    @classmethod
    def _regex(cls, value: str) -> str:
        expect_pattern(value)  # refused at load, not when the model has answered
        return value


# re2's budget for one compiled pattern: a pattern needing more (nested counted repeats) is refused at load.
MAX_EXPECT_MEM = 1 << 20


def expect_pattern(pattern: str) -> Any:
    """`check.expect` compiled by re2: linear time in the answer whatever the pattern (`(a+)+$` included), so it
    needs no time limit; what re2 cannot promise that for (back-references, look-arounds) is refused."""
    from sparkforge.boundary import linear_regex

    return linear_regex(pattern, max_mem=MAX_EXPECT_MEM)


class ProfileModel(BaseModel):
    """The schema of a profile file (unknown keys are errors)."""

    model_config = STRICT

    description: str
    model: Annotated[str, Field(min_length=1)]
    nodes: Annotated[StrictInt, Field(ge=1, le=64)] = 1
    gpus_per_node: Annotated[StrictInt, Field(ge=1, le=8)] = 1
    # The Sparks' memory as sold (64 or 128 GB): what the memory plan judges the budget against.
    spark_memory_gb: Literal[64, 128] = 128
    args: dict[str, ArgValue] = Field(default_factory=dict)
    env: dict[str, StrictStr] = Field(default_factory=dict)
    # Per-entry opt-ins past the allow-list (a flag without dashes or a variable -> the reviewer's reason);
    # every task that starts a container prints one warning per entry.
    allow: dict[str, Annotated[StrictStr, Field(min_length=3, max_length=300)]] = Field(default_factory=dict)
    # Every other Hub repository the args reach (tokenizer, drafter, LoRA adapters, config) -> its full commit;
    # null: listed by import, waiting for its commit (loads; every launch refuses it). sparkforge/recipe/pins.py
    repositories: dict[str, StrictStr | None] = Field(default_factory=dict)
    served_model_name: str | None = None
    # The model class the checkpoint's config.json names: checked against the image's vLLM before any download.
    architecture: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    check: AnswerCheck | None = None
    # What `invoke conform` asks and how it judges (prompt set, long-decode length, a known answer).
    conform: ConformSettings | None = None

    @field_validator("description")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if not value.strip() or len(value) > 300 or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError("write one line of printable text (at most 300 characters); fix: shorten it")
        return value

    @field_validator("model", "served_model_name")
    @classmethod
    def _model_name(cls, value: str | None) -> str | None:
        if value is not None and not MODEL.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a model id or path (it would reach 'vllm serve' as "
                f"{'a flag' if value.startswith('-') else 'something else'}); fix: write a Hugging Face id like "
                "'Qwen/Qwen3.5-35B-A3B-FP8' or a path, without spaces and not starting with '-'"
            )
        if value is not None and is_secret_value(value):
            raise ValueError(f"the value looks like a secret and {SECRET_FIX}")
        return value

    @field_validator("args", mode="before")
    @classmethod
    def _flags(cls, args: object) -> object:
        if not isinstance(args, dict):
            return args  # pydantic names the type error
        seen: dict[str, str] = {}
        for key, value in args.items():
            key = str(key)
            problem = check_flag(key) or check_value(key, value)
            if not problem and norm_flag(key) in seen:
                problem = (
                    f"{key!r} and {seen[norm_flag(key)]!r} are the same vLLM flag; fix: keep one of them"
                )
            if problem:
                raise ValueError(problem)
            seen[norm_flag(key)] = key
        return args

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, env: object) -> object:
        if not isinstance(env, dict):
            return env
        for key, value in env.items():
            problem = check_env(str(key), value)
            if problem:
                raise ValueError(problem)
        return env

    @field_validator("allow")
    @classmethod
    def _allow(cls, allow: dict[str, str]) -> dict[str, str]:
        for key, why in allow.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*|[a-z0-9][a-z0-9-]*(\.[A-Za-z0-9_]{1,64}){0,4}", key):
                raise ValueError(
                    f"{key!r}: name a flag without dashes, a field of a JSON-valued flag "
                    "(compilation-config.backend) or a variable; fix: e.g. 'tool-parser-plugin'"
                )
            if any(ord(c) < 32 or ord(c) == 127 for c in why) or not why.strip():
                raise ValueError(
                    f"{key}: the reason is one line of printable text; fix: say why it was reviewed"
                )
            if owner_only(key):
                raise ValueError(f"{key}: {owner_only(key)}")
        return allow

    @field_validator("repositories")
    @classmethod
    def _commits(cls, repositories: dict[str, str | None]) -> dict[str, str | None]:
        for repo, commit in repositories.items():
            if not HUB_ID.fullmatch(repo):
                raise ValueError(
                    f"{repo[:80]!r} is not a Hugging Face repository id; fix: write it as owner/name (a path or "
                    "a URI pins nothing: a folder is served from the owner's /models)"
                )
            if commit is not None and not HEX40.fullmatch(commit):
                raise ValueError(
                    f"{repo}: {commit[:60]!r} is a branch, tag or PR ref, not a full commit (its owner can change "
                    f"what it names); fix: {PIN_FIX.format(repo=repo)}"
                )
        return repositories

    @model_validator(mode="after")
    def _pins(self) -> ProfileModel:
        problems = pin_problems(self.args, self.model, self.repositories)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _allow_list(self) -> ProfileModel:
        refused = blocked(self.args, self.env, self.allow)
        uri = model_finding(self.model)
        if uri is not None:
            refused += blocked(
                {}, {}, self.allow, [Verdict("flag", "model", "refused", uri.reason, value=self.model)]
            )
        if refused:
            raise ValueError("; ".join(v.message() for v in refused))
        used = {v.allow_key for v in verdicts(self.args, self.env)} | set(self.args) | set(self.env)
        used |= {"model"} if uri is not None else set()
        stale = sorted(k for k in self.allow if k not in used)
        if stale:
            raise ValueError(
                f"allow: {', '.join(stale)} opt(s) in to nothing the profile sets; fix: remove the stale opt-in"
            )
        return self

    @model_validator(mode="after")
    def _parallelism(self) -> ProfileModel:
        args = {norm_flag(k): v for k, v in self.args.items()}
        tp = int(args.get("tensor-parallel-size", args.get("tp", 1)))  # type: ignore[arg-type]
        pp = int(args.get("pipeline-parallel-size", args.get("pp", 1)))  # type: ignore[arg-type]
        dp = int(args.get("data-parallel-size", args.get("dp", 1)))  # type: ignore[arg-type]
        gpus = self.nodes * self.gpus_per_node
        if tp * pp * dp != gpus:
            times = f" x data-parallel-size {dp}" if dp > 1 else ""
            raise ValueError(
                f"tensor-parallel-size {tp} x pipeline-parallel-size {pp}{times} = {tp * pp * dp} GPUs, but nodes "
                f"{self.nodes} x gpus_per_node {self.gpus_per_node} = {gpus}; fix: make them equal (a Spark has one GPU)"
            )
        return self


# vLLM flags whose value may name a file the server reads: such a file must sit beside the profile, which
# mounts it read-only into the container (at PROFILE_FILES_MOUNT) and records its sha256.
FILE_FLAGS = frozenset({"chat-template"})
PROFILE_FILES_MOUNT = "/etc/sparkforge/profile"
MAX_PROFILE_FILE = 1 << 20  # a chat template is kilobytes


def names_a_file(value: object) -> bool:
    """A chat-template value that is a file name or path, not an inline Jinja template."""
    return isinstance(value, str) and "{" not in value and ("/" in value or value.endswith((".jinja", ".j2")))


@dataclass(frozen=True)
class ProfileFile:
    """A file beside the profile that a flag names: mounted read-only, identified by its sha256."""

    flag: str
    path: Path  # on this machine, beside the profile
    sha256: str

    @property
    def target(self) -> str:
        return f"{PROFILE_FILES_MOUNT}/{self.path.name}"


def file_refusal(profile_path: Path, flag: str, value: str) -> str:
    """Why a file-valued flag cannot be served as written, and the fix (import and load say the same)."""
    name = Path(value).name or "FILE"
    return (
        f"--{flag} {value}: names a file outside the profile's folder, which nothing puts in the container; "
        f"fix: put the file beside the profile ({profile_path.parent / name}) and write "
        f"'{flag}: {name}' under args: serve then mounts it read-only at {PROFILE_FILES_MOUNT}/{name} and "
        "records its sha256; or give the template inline"
    )


def _profile_files(
    path: Path, model: ProfileModel, lines: dict[tuple[str, ...], int]
) -> tuple[ProfileFile, ...]:
    import hashlib

    from sparkforge.boundary import read_bytes

    files = []
    for key, value in model.args.items():
        flag = norm_flag(key)
        if flag not in FILE_FLAGS or not names_a_file(value):
            continue
        where = f"{path}:{lines.get(('args', key), 1)}: args.{key}"
        beside = path.parent / str(value)
        if "/" in str(value) or not beside.is_file() or beside.is_symlink():
            raise ProfileError(f"{where}: {file_refusal(path, flag, str(value))}")
        # Through the boundary: a regular file inside the profile's folder (symlinks resolved), at most 1 MiB.
        data = read_bytes(beside, where, MAX_PROFILE_FILE, named=False, within=[path.parent])
        files.append(ProfileFile(flag, beside.resolve(), hashlib.sha256(data).hexdigest()))
    return tuple(files)


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    model: ProfileModel
    lines: dict[tuple[str, ...], int]
    files: tuple[ProfileFile, ...] = ()

    def line_of(self, *key: str) -> int:
        return self.lines.get(tuple(key), self.lines.get(tuple(key[:1]), 1))

    def opt_ins(self) -> list[str]:
        """One warning line per opt-in past the allow-list (printed by every task that starts a container)."""
        return opt_in_warnings(
            self.model.allow, self.model.env, f"profile {self.name} ({self.path})", self.model.args
        )

    def serve_args(self, hub_cache: str = "") -> list[str]:
        """The profile's `vllm serve` arguments after the model: --flag value, --flag (true), --no-flag (false).
        With `hub_cache` (the Hugging Face cache inside the container) each pinned repository the args reach is
        given as the folder of its snapshot, which the download phase fetched at the pin."""
        argv: list[str] = []
        mounted = {f.flag: f.target for f in self.files}
        for key, value in self.model.args.items():
            if hub_cache:
                value = snapshot_value(key, value, self.model.model, self.model.repositories, hub_cache)  # type: ignore[assignment]
            if norm_flag(key) in mounted:
                argv += [f"--{key}", mounted[norm_flag(key)]]
            elif value is True:
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


def load_profile(ref: str | Path) -> Profile:
    """Load and validate a profile (a name in profiles/ or a path); errors name file, line, key path and the fix."""
    path = resolve_named_file(ref, PROFILES_DIR, "profile", list_profile_names(), ProfileError)
    if not PROFILE_NAME.fullmatch(path.stem):
        raise ProfileError(
            f"{path}: the file name {path.stem[:80]!r} is the profile's name and becomes container names and labels; "
            "fix: rename it to lowercase letters, digits, '.', '_' and '-' (at most 64, starting with a letter or digit)"
        )
    try:
        doc = read_yaml(path)
    except RecipeError as exc:
        raise ProfileError(str(exc).replace("a recipe", "a profile").replace("recipe", "profile")) from None
    origins = {key: (path, line) for key, line in doc.lines.items()}
    refused = _off_the_list(doc.data)
    if refused:
        lines = [
            f"{path}:{doc.lines.get((section, key), 1)}: {section}.{key}: {v.message()}"
            for section, key, v in refused
        ]
        raise ProfileError(f"profile {path.stem} is refused:\n  " + "\n  ".join(lines))
    try:
        model = ProfileModel.model_validate(doc.data)
    except ValidationError as exc:
        problems = [explain_errors(e, origins, path, ProfileModel) for e in exc.errors()]
        raise ProfileError(f"profile {path.stem} is invalid:\n  " + "\n  ".join(problems)) from None
    return Profile(path.stem, path, model, dict(doc.lines), _profile_files(path, model, dict(doc.lines)))


def _off_the_list(data: object) -> list[tuple[str, str, Verdict]]:
    """(section, key, verdict) for every arg and variable off the allow-list without an opt-in, in file order
    (entries the form checks refuse, secrets among them, are left to the schema's own message)."""
    if not isinstance(data, dict):
        return []
    allow = data.get("allow") if isinstance(data.get("allow"), dict) else {}
    out = []
    for section in ("args", "env"):
        entries = data.get(section) if isinstance(data.get(section), dict) else {}
        for key, value in entries.items():  # type: ignore[union-attr]
            name = str(key)
            form = (
                check_flag(name) or check_value(name, value) if section == "args" else check_env(name, value)
            )
            if form:
                continue
            flags, env = ({str(key): value}, {}) if section == "args" else ({}, {str(key): value})
            out += [(section, str(key), v) for v in blocked(flags, env, allow)]  # type: ignore[arg-type]
    return out


def list_profile_names() -> list[str]:
    if not PROFILES_DIR.is_dir():
        return []
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml") if not p.name.startswith("_"))
