"""Recipes: YAML files -> one strictly validated, typed model (with `extends` resolved)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from sparkforge.errors import RecipeError

REPO_ROOT = Path(__file__).resolve().parent.parent
RECIPES_DIR = REPO_ROOT / "recipes"

# Every string that can reach a Dockerfile or a shell line is held to one of these patterns.
_SHA256 = r"sha256:[0-9a-f]{64}"
_IMAGE_NAME = r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
_PATTERNS: dict[str, tuple[str, str]] = {
    # name: (regex, fix)
    "image": (
        rf"{_IMAGE_NAME}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?@{_SHA256}",
        "pin the image by digest, e.g. 'nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:<64 hex>' "
        "(run 'invoke lock' to resolve a tag)",
    ),
    "repository": (
        _IMAGE_NAME,
        "use a lowercase image name without tag, e.g. 'ghcr.io/sparkforge/vllm-qwen35'",
    ),
    "sha40": (r"[0-9a-f]{40}", "use the full 40-character commit SHA (run 'invoke lock' to resolve a ref)"),
    "sha_short": (r"[0-9a-f]{7,40}", "use the commit SHA the wheel was built from (7 to 40 hex characters)"),
    "package": (r"[A-Za-z0-9][A-Za-z0-9._-]*", "use a PyPI distribution name, e.g. 'flashinfer-python'"),
    "url": (r"https?://[A-Za-z0-9.-]+(?::[0-9]+)?(?:/[A-Za-z0-9._~%/+-]*)?", "use a plain http(s) URL"),
    "gpu": (r"sm_[0-9]{2,3}[af]?", "use a CUDA SM target like 'sm_121'"),
    "cuda": (r"[0-9]{2}\.[0-9]", "use the CUDA major.minor, e.g. '13.0'"),
    "python": (r"3\.[0-9]{1,2}", "use a Python major.minor, e.g. '3.12'"),
    "arch": (
        r"[0-9]{1,2}\.[0-9][af]?(?:\+PTX)?",
        "use TORCH_CUDA_ARCH_LIST entries like '12.1a', '12.0f', '9.0+PTX'",
    ),
    "identifier": (
        r"[A-Za-z_][A-Za-z0-9_]*",
        "use a Python class name, e.g. 'Qwen3_5MoeForConditionalGeneration'",
    ),
    "model_type": (r"[a-z0-9_]+", "use a transformers model type, e.g. 'qwen3_5_moe'"),
    "env_name": (r"[A-Za-z_][A-Za-z0-9_]*", "use an environment variable name (letters, digits, _)"),
    "env_value": (
        r"[A-Za-z0-9_./:,=+@%-]*",
        "use letters, digits and _ . / : , = + @ % - only (no spaces or quotes)",
    ),
    "glob": (r"[A-Za-z0-9_.*?/\[\]-]+", "use a path glob like 'vllm/_C*.so'"),
    "patch": (
        r"patches/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+\.patch",
        "use a path like 'patches/vllm/0001-fix.patch'",
    ),
    "tag": (r"[A-Za-z0-9_{}][A-Za-z0-9_.{}-]{0,127}", "use a tag template like '{vllm}-cu{cuda}-{date}'"),
    "description": (
        r"[A-Za-z0-9 .,:;()+/_=@%#\[\]-]{1,200}",
        "use one line of plain text: letters, digits, spaces and . , : ; ( ) + / _ = @ % # [ ] -",
    ),
}
TAG_PLACEHOLDERS = ("recipe", "vllm", "torch", "cuda", "date", "hash")


def _pattern(kind: str) -> Any:
    regex, fix = _PATTERNS[kind]
    compiled = re.compile(regex)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"{value!r} is not valid here; fix: {fix}")
        return value

    return Annotated[StrictStr, AfterValidator(check)]


def _exact_version(value: str) -> str:
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", value):
        raise ValueError(
            f"{value!r} is not an exact version; fix: pin one release, e.g. '2.13.0' (no ranges)"
        )
    try:
        Version(value)
    except InvalidVersion:
        raise ValueError(f"{value!r} is not a PEP 440 version; fix: pin one release, e.g. '5.17.0'") from None
    return value


ExactVersion = Annotated[StrictStr, AfterValidator(_exact_version)]
ImageRef = _pattern("image")
Sha40 = _pattern("sha40")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Images(StrictModel):
    builder: ImageRef = Field(description="image the compile stages run in (needs nvcc)")
    runtime: ImageRef = Field(description="image the final stage starts from")


class Component(StrictModel):
    package: _pattern("package") | None = Field(None, description="PyPI name; defaults to the component key")
    version: ExactVersion
    source: Literal["wheel", "git"] = Field(
        "wheel", description="pinned wheel, or git commit + patches + compile"
    )
    index: _pattern("url") | None = Field(None, description="extra package index for this component")
    commit: _pattern("sha_short") | None = Field(None, description="commit the component is built from")
    repository: _pattern("url") | None = Field(None, description="git repository (source: git)")
    patches: list[_pattern("patch")] = Field(
        default_factory=list, description="patch series, applied in order"
    )

    @model_validator(mode="after")
    def _source_needs(self) -> Component:
        if self.source == "git":
            if self.commit is None or not re.fullmatch(_PATTERNS["sha40"][0], self.commit):
                raise ValueError(
                    "source 'git' needs 'commit' as the full 40-character SHA; fix: add commit: <40 hex> "
                    "(a branch or tag is not a pin; 'invoke lock' resolves one)"
                )
            if self.repository is None:
                raise ValueError(
                    "source 'git' needs 'repository'; fix: add repository: https://github.com/<org>/<repo>"
                )
        elif self.patches:
            raise ValueError("patches apply only to source 'git'; fix: set source: git or remove patches")
        return self


class Components(StrictModel):
    vllm: Component
    torch: Component
    transformers: Component
    flashinfer: Component | None = None

    @model_validator(mode="after")
    def _vllm_commit(self) -> Components:
        if self.vllm.commit is None:
            raise ValueError("components.vllm needs 'commit'; fix: add the commit the release was built from")
        return self

    def items(self) -> list[tuple[str, Component]]:
        return [(k, v) for k in ("vllm", "torch", "transformers", "flashinfer") if (v := getattr(self, k))]


class Build(StrictModel):
    torch_cuda_arch_list: list[_pattern("arch")] = Field(min_length=1)
    max_jobs: StrictInt = Field(6, ge=1, le=64, description="parallel compile jobs; each nvcc job needs GBs")
    nvcc_threads: StrictInt = Field(2, ge=1, le=16, description="threads per nvcc job")


class Models(StrictModel):
    architectures: list[_pattern("identifier")] = Field(min_length=1)
    model_types: list[_pattern("model_type")] = Field(default_factory=list)


class Audit(StrictModel):
    require: list[_pattern("glob")] = Field(default_factory=list)


class Publish(StrictModel):
    repository: _pattern("repository")
    tags: list[_pattern("tag")] = Field(min_length=1, description="immutable tags")
    moving_tags: list[_pattern("tag")] = Field(
        default_factory=list, description="tags moved after verification"
    )
    qemu: bool = Field(False, description="allow building foreign platforms under QEMU in CI")

    @field_validator("tags", "moving_tags")
    @classmethod
    def _placeholders(cls, value: list[str]) -> list[str]:
        for tag in value:
            for name in re.findall(r"\{([^}]*)\}", tag):
                if name not in TAG_PLACEHOLDERS:
                    raise ValueError(
                        f"tag {tag!r} uses unknown placeholder {{{name}}}; fix: use one of "
                        + ", ".join("{" + p + "}" for p in TAG_PLACEHOLDERS)
                    )
        return value


class RecipeModel(StrictModel):
    description: _pattern("description")
    gpu: _pattern("gpu")
    platforms: list[Literal["linux/arm64", "linux/amd64"]] = Field(min_length=1)
    cuda: _pattern("cuda")
    python: _pattern("python")
    images: Images
    components: Components
    build: Build
    models: Models
    env: dict[_pattern("env_name"), _pattern("env_value")] = Field(default_factory=dict)
    audit: Audit = Field(default_factory=Audit)
    publish: Publish

    @field_validator("platforms")
    @classmethod
    def _unique_platforms(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("a platform is listed twice; fix: list each platform once")
        return value


@dataclass(frozen=True)
class Recipe:
    """A validated recipe with where it came from."""

    name: str
    path: Path
    model: RecipeModel
    chain: tuple[Path, ...]  # the file and every file it extends, nearest first

    @property
    def hash(self) -> str:
        """sha256 over the resolved recipe and the bytes of every patch it names."""
        digest = hashlib.sha256(json.dumps(self.model.model_dump(mode="json"), sort_keys=True).encode())
        for name, component in self.model.components.items():
            for patch in component.patches:
                digest.update(f"{name}:{patch}:".encode())
                digest.update(hashlib.sha256((REPO_ROOT / patch).read_bytes()).digest())
        return digest.hexdigest()

    def patch_paths(self) -> list[Path]:
        return [REPO_ROOT / p for _, c in self.model.components.items() for p in c.patches]

    def resolved(self) -> dict[str, Any]:
        return self.model.model_dump(mode="json", exclude_none=True)


# ---- loading ------------------------------------------------------------------------------------


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise RecipeError(
                f"{loader.name}:{key_node.start_mark.line + 1}: key {key!r} appears twice; fix: keep one"
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _key_lines(node: yaml.Node, prefix: tuple[str, ...], out: dict[tuple[str, ...], int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = (*prefix, str(key_node.value))
            out[path] = key_node.start_mark.line + 1
            _key_lines(value_node, path, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            path = (*prefix, str(index))
            out[path] = item.start_mark.line + 1
            _key_lines(item, path, out)


@dataclass(frozen=True)
class _Doc:
    path: Path
    data: dict[str, Any]
    lines: dict[tuple[str, ...], int]


def _read_doc(path: Path) -> _Doc:
    try:
        text = path.read_text()
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe ({exc.strerror}); fix: check the path") from None
    try:
        loader = _LineLoader(text)
        loader.name = str(path)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise RecipeError(
            f"{where}: invalid YAML ({problem}); fix: correct the syntax at that line"
        ) from None
    if not isinstance(data, dict):
        raise RecipeError(
            f"{path}:1: a recipe must be a YAML mapping of keys; fix: start with 'description: ...'"
        )
    lines: dict[tuple[str, ...], int] = {}
    _key_lines(node, (), lines)
    return _Doc(path, data, lines)


def resolve_recipe_path(ref: str | Path, relative_to: Path | None = None) -> Path:
    """A recipe name in recipes/ or a path (relative paths from `relative_to` or the working directory)."""
    text = str(ref)
    if text.endswith((".yaml", ".yml")) or "/" in text:
        base = relative_to.parent if relative_to else Path.cwd()
        path = (base / text).resolve()
    else:
        path = RECIPES_DIR / f"{text}.yaml"
    if not path.is_file():
        known = ", ".join(list_recipe_names()) or "none"
        raise RecipeError(
            f"recipe {text!r} not found (looked for {path}); fix: use a name from recipes/ ({known}) or a path"
        )
    return path


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key; lists and scalars from `over` replace."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _load_chain(
    path: Path, stack: tuple[Path, ...]
) -> tuple[dict[str, Any], dict[tuple[str, ...], tuple[Path, int]], tuple[Path, ...]]:
    if path in stack:
        cycle = " -> ".join(p.name for p in (*stack, path))
        raise RecipeError(f"{stack[-1]}: 'extends' forms a cycle ({cycle}); fix: remove one of the extends")
    doc = _read_doc(path)
    data = dict(doc.data)
    origins = {k: (path, line) for k, line in doc.lines.items()}
    parent = data.pop("extends", None)
    if parent is None:
        return data, origins, (path,)
    if not isinstance(parent, str):
        raise RecipeError(
            f"{path}:{doc.lines[('extends',)]}: extends: must be a recipe name or path string; "
            "fix: e.g. 'extends: vllm-qwen35-wheels'"
        )
    parent_path = resolve_recipe_path(parent, relative_to=path)
    base, base_origins, chain = _load_chain(parent_path, (*stack, path))
    merged = _merge(base, data)
    return merged, {**base_origins, **origins}, (path, *chain)


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = RecipeModel
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        candidates = getattr(annotation, "__args__", (annotation,))
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return sorted(getattr(model, "model_fields", {}))


_TYPE_FIXES = {
    "string_type": "write a quoted string",
    "int_type": "write a whole number",
    "bool_type": "write true or false",
    "list_type": "write a YAML list (- item)",
    "dict_type": "write a YAML mapping (key: value)",
    "model_type": "write a YAML mapping (key: value)",
    "missing": "add this key",
    "too_short": "list at least one item",
    "greater_than_equal": "use a larger number",
    "less_than_equal": "use a smaller number",
    "literal_error": "use one of the allowed values",
}


def _explain(
    error: Mapping[str, Any], origins: Mapping[tuple[str, ...], tuple[Path, int]], path: Path
) -> str:
    loc = tuple(
        p
        for p in error["loc"]
        if not (isinstance(p, str) and ("[" in p or ("-" in p and p.startswith("function"))))
    )
    loc = tuple(str(p) for p in loc if p not in ("function-after",))
    key_path = ".".join(loc) or "(top level)"
    where_path, line = path, None
    for depth in range(len(loc), 0, -1):
        if loc[:depth] in origins:
            where_path, line = origins[loc[:depth]]
            break
    where = f"{where_path}:{line}" if line else str(where_path)
    kind = error["type"]
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(tuple(error["loc"]))
        return f"{where}: {key_path}: unknown key; fix: remove it or use one of: {', '.join(allowed)}"
    if kind == "value_error":
        return f"{where}: {key_path}: {message}"
    fix = _TYPE_FIXES.get(kind, "see README.md 'Recipe reference'")
    if kind == "literal_error":
        fix = message.replace("Input should be", "use")
    return f"{where}: {key_path}: {message}; fix: {fix}"


def load_recipe(ref: str | Path) -> Recipe:
    """Load, merge (`extends`) and validate a recipe; errors name file, line, key path and fix."""
    path = resolve_recipe_path(ref)
    data, origins, chain = _load_chain(path, ())
    try:
        model = RecipeModel.model_validate(data)
    except ValidationError as exc:
        problems = [_explain(e, origins, path) for e in exc.errors()]
        raise RecipeError(f"recipe {path.stem} is invalid:\n  " + "\n  ".join(problems)) from None
    for _, component in model.components.items():
        for patch in component.patches:
            if not (REPO_ROOT / patch).is_file():
                line = origins.get(("components",), (path, 0))[1]
                raise RecipeError(
                    f"{path}:{line}: patch {patch} does not exist; fix: add the file or remove it"
                )
    return Recipe(name=path.stem, path=path, model=model, chain=chain)


def list_recipe_names() -> list[str]:
    """Buildable recipes in recipes/ (files starting with '_' are shared partials)."""
    if not RECIPES_DIR.is_dir():
        return []
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml") if not p.name.startswith("_"))
