"""Recipe -> build plan: the values templates see, the lock, labels, tags. Pure functions, no I/O."""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkforge import __version__, oci
from sparkforge.boundary import MAX_PATCH_BYTES, sha256_file
from sparkforge.errors import RecipeError, SparkforgeError
from sparkforge.recipe.loader import REPO_ROOT, Recipe

PROJECT_SOURCE = "https://github.com/sparkforge/sparkforge"
LABEL_PREFIX = "dev.sparkforge"
STAGES_SOURCE = ("toolchain", "source", "build-env", "probe", "build", "runtime")
STAGES_WHEEL = ("runtime",)
# The base images a build really used (the recipe's pins, or a --base-image override): labels and lock say so.
BASE_LABELS = {"builder": f"{LABEL_PREFIX}.base.builder", "runtime": f"{LABEL_PREFIX}.base.runtime"}


@dataclass(frozen=True)
class Bases:
    """The effective base images of one build; `override` when they are not the recipe's pinned ones."""

    builder: str
    runtime: str

    def differs_from(self, recipe: Recipe) -> bool:
        return (self.builder, self.runtime) != (recipe.model.images.builder, recipe.model.images.runtime)


def bases(recipe: Recipe, overrides: Mapping[str, str] | None = None) -> Bases:
    """The recipe's base images with `overrides` ({"builder": REF, "runtime": REF}, either optional) applied."""
    images = recipe.model.images
    over = overrides or {}
    return Bases(over.get("builder", images.builder), over.get("runtime", images.runtime))


def pins(recipe: Recipe) -> dict[str, str]:
    """One pin per component (label `dev.sparkforge.pin.<component>`): version, plus commit where pinned."""
    out: dict[str, str] = {}
    for name, component in recipe.model.components.items():
        out[name] = f"{component.version}@{component.commit}" if component.commit else component.version
    out["cuda"] = recipe.model.cuda
    return out


def labels(recipe: Recipe, effective: Bases | None = None) -> dict[str, str]:
    """Static OCI and sparkforge labels (created/revision come from build args at build time)."""
    vllm = recipe.model.components.vllm
    effective = effective or bases(recipe)
    out = {
        "org.opencontainers.image.title": recipe.name,
        "org.opencontainers.image.description": recipe.model.description,
        "org.opencontainers.image.source": PROJECT_SOURCE,
        "org.opencontainers.image.version": vllm.version,
        f"{LABEL_PREFIX}.recipe": recipe.name,
        f"{LABEL_PREFIX}.recipe-hash": recipe.hash,
        f"{LABEL_PREFIX}.gpu": recipe.model.gpu,
    }
    for name, value in pins(recipe).items():
        out[f"{LABEL_PREFIX}.pin.{name}"] = value
    out[BASE_LABELS["builder"]] = effective.builder
    out[BASE_LABELS["runtime"]] = effective.runtime
    return out


def label_drift(recipe: Recipe, found: Mapping[str, str]) -> dict[str, tuple[str | None, str]]:
    """label -> (image's value, recipe's value) for every sparkforge label of the recipe that differs.

    The base-image labels are left out: a base override is reported (and refused by push) on its own.
    """
    expected = {
        k: v
        for k, v in labels(recipe).items()
        if k.startswith(LABEL_PREFIX + ".") and k not in BASE_LABELS.values()
    }
    return {k: (found.get(k), v) for k, v in sorted(expected.items()) if found.get(k) != v}


def drift_text(drift: Mapping[str, tuple[str | None, str]]) -> str:
    items = "; ".join(
        f"{k}: image {a if a is not None else '(missing)'}, recipe {b}" for k, (a, b) in drift.items()
    )
    return f"{len(drift)} label(s) differ ({items})"


def base_override(recipe: Recipe, found: Mapping[str, str]) -> dict[str, tuple[str | None, str]]:
    """stage -> (image's base, recipe's pinned base) for each stage built on another base than the recipe's."""
    pinned = bases(recipe)
    wanted = {"builder": pinned.builder, "runtime": pinned.runtime}
    return {
        stage: (found.get(label), wanted[stage])
        for stage, label in BASE_LABELS.items()
        if found.get(label) != wanted[stage]
    }


def lock(recipe: Recipe, effective: Bases | None = None) -> dict[str, Any]:
    """Every resolved pin of the recipe; carried in the image at /opt/sparkforge/lock.json."""
    m = recipe.model
    effective = effective or bases(recipe)
    patches = []
    for name, component in m.components.items():
        for patch in component.patches:
            digest = sha256_file(REPO_ROOT / patch, "patch", MAX_PATCH_BYTES)
            patches.append({"component": name, "path": patch, "sha256": digest})
    return {
        "tool": "sparkforge",
        "version": __version__,
        "recipe": recipe.name,
        "recipe_hash": recipe.hash,
        **({"device": m.device} if m.device != "cuda" else {}),
        "gpu": m.gpu,
        "cuda": m.cuda,
        "python": m.python,
        "platforms": list(m.platforms),
        "images": {"builder": effective.builder, "runtime": effective.runtime},
        "base_override": effective.differs_from(recipe),
        "components": {
            name: c.model_dump(mode="json", exclude_none=True) for name, c in m.components.items()
        },
        "patches": patches,
        "build": m.build.model_dump(mode="json"),
        "models": m.models.model_dump(mode="json"),
        "audit": m.audit.model_dump(mode="json"),
        "env": dict(m.env),
        "runtime": m.runtime.model_dump(mode="json"),  # runtime.remove too: what the build left out, and why
        **({"image": m.image.model_dump(mode="json")} if m.image.max_size is not None else {}),
    }


def constraints(recipe: Recipe) -> str:
    """pip constraints installed with every step: nothing may swap torch, transformers or flashinfer."""
    lines = ["# Written by sparkforge from the recipe; pip refuses any other version of these."]
    for name, component in recipe.model.components.items():
        if name == "vllm" and component.source == "git":
            continue  # the locally built wheel carries a local version; its pin is checked by verify
        lines.append(f"{component.package or name}=={component.version}")
    return "\n".join(lines) + "\n"


def tag_values(recipe: Recipe, when: _dt.date) -> dict[str, str]:
    return {
        "recipe": recipe.name,
        "vllm": recipe.model.components.vllm.version,
        "torch": recipe.model.components.torch.version,
        "cuda": recipe.model.cuda.replace(".", ""),
        "date": when.strftime("%Y%m%d"),
        "hash": recipe.hash[:12],
    }


@dataclass(frozen=True)
class Tags:
    immutable: tuple[str, ...]
    moving: tuple[str, ...]

    @property
    def all(self) -> tuple[str, ...]:
        return (*self.immutable, *self.moving)


# The OCI tag grammar (oci.py): checked after the placeholders are filled, at plan time, so a version with '+'
# or '!' fails here and not after the hour-long build.
OCI_TAG = oci.OCI_TAG


def expand_tag(recipe: Recipe, template: str, when: _dt.date) -> str:
    """One tag template of the recipe's scheme with its placeholders filled (no repository); RecipeError if the
    result is not a valid OCI tag."""
    tag = template.format(**tag_values(recipe, when))
    if not OCI_TAG.fullmatch(tag):
        values = tag_values(recipe, when)
        culprits = [
            f"{{{k}}} = {v!r}"
            for k, v in values.items()
            if f"{{{k}}}" in template and not OCI_TAG.fullmatch(v)
        ]
        bad = sorted({c for c in tag if not re.fullmatch(r"[A-Za-z0-9._-]", c)})
        why = (
            f"{len(tag)} characters (at most 128)"
            if len(tag) > 128
            else f"holds {', '.join(repr(c) for c in bad) or 'a leading ' + repr(tag[:1])}"
        )
        raise RecipeError(
            f"{recipe.path}: publish tag template {template!r} expands to {tag!r}, which is not a valid OCI tag "
            f"({why}{'; from ' + ', '.join(culprits) if culprits else ''}); fix: change the template (drop or "
            "replace that placeholder) so the tag is letters, digits, '_', '.' and '-', at most 128 characters"
        )
    return tag


def check_reference(option: str, ref: str) -> str:
    """An image reference from the command line (NAME[:TAG] or NAME@sha256:...): the one grammar in oci.py."""
    return oci.check_reference(option, ref)


def final_tags(recipe: Recipe, when: _dt.date, repository: str | None = None) -> Tags:
    """The recipe's tag scheme expanded, as full references."""
    repo = repository or recipe.model.publish.repository
    return Tags(
        tuple(f"{repo}:{expand_tag(recipe, t, when)}" for t in recipe.model.publish.tags),
        tuple(f"{repo}:{expand_tag(recipe, t, when)}" for t in recipe.model.publish.moving_tags),
    )


LOG_ROOT = REPO_ROOT / "logs"


def log_dir(recipe: Recipe, what: str, root: Path = LOG_ROOT, now: _dt.datetime | None = None) -> Path:
    """logs/<recipe>/<UTC stamp>-<what>/: where one run's numbered step logs and replay scripts go."""
    stamp = (now or _dt.datetime.now(_dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    return root / recipe.name / f"{stamp}-{what.replace('/', '-')}"


def candidate_tag(recipe: Recipe, platform: str) -> str:
    """Where a build lands before verification: never a published name."""
    arch = platform.split("/")[-1]
    return f"sparkforge-candidate/{recipe.name}:{recipe.hash[:12]}-{arch}"


@dataclass(frozen=True)
class TemplateValues:
    """Everything a Dockerfile template may read; every string has passed the recipe's patterns."""

    recipe: str
    description: str
    recipe_hash: str
    gpu: str
    cuda: str
    python: str
    builder_image: str
    runtime_image: str
    components: dict[str, dict[str, Any]]
    vllm_source: str
    patches: list[str]
    arch_list: str
    max_jobs: int
    nvcc_threads: int
    env: dict[str, str]
    labels: dict[str, str]
    stages: tuple[str, ...]
    # The recipe's build section (probe settings filled in, rust, cuda_wheels).
    build: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    runtime: dict[str, Any] = field(default_factory=dict)
    cuda_major: str = ""
    device: str = "cuda"


def template_values(recipe: Recipe, effective: Bases | None = None) -> TemplateValues:
    final_tags(recipe, _dt.datetime.now(_dt.UTC).date())  # every tag expanded and checked: fails at plan time
    m = recipe.model
    effective = effective or bases(recipe)
    components = {
        name: {**c.model_dump(mode="json"), "package": c.package or name} for name, c in m.components.items()
    }
    vllm = m.components.vllm
    return TemplateValues(
        recipe=recipe.name,
        description=m.description,
        recipe_hash=recipe.hash,
        gpu=m.gpu,
        cuda=m.cuda,
        python=m.python,
        builder_image=effective.builder,
        runtime_image=effective.runtime,
        components=components,
        vllm_source=vllm.source,
        patches=[p.rsplit("/", 1)[-1] for p in vllm.patches],
        arch_list=" ".join(m.build.torch_cuda_arch_list),
        max_jobs=m.build.max_jobs,
        nvcc_threads=m.build.nvcc_threads,
        env=dict(m.env),
        labels=labels(recipe, effective),
        stages=STAGES_SOURCE if vllm.source == "git" else STAGES_WHEEL,
        runtime=m.runtime.model_dump(mode="json"),
        cuda_major=m.cuda.split(".")[0],
        device=m.device,
        build={**m.build.model_dump(mode="json"), "probe": m.build.probe_settings.model_dump(mode="json")},
    )


def recipe_platform(
    recipe: Recipe, platform: str | None, error: type[SparkforgeError] = SparkforgeError
) -> str:
    """The one platform check (build, push, publish): `platform` or the recipe's first, refused unless it builds it."""
    chosen = platform or recipe.model.platforms[0]
    if chosen not in recipe.model.platforms:
        raise error(
            f"--platform {chosen}: recipe {recipe.name} builds {', '.join(recipe.model.platforms)}; fix: use "
            "one of those, or add the platform to the recipe's platforms"
        )
    return chosen
