"""Recipe -> build plan: the values templates see, the lock, labels, tags. Pure functions, no I/O."""

from __future__ import annotations

import datetime as _dt
import hashlib
from dataclasses import dataclass, field
from typing import Any

from sparkforge import __version__
from sparkforge.recipe import REPO_ROOT, Recipe

PROJECT_SOURCE = "https://github.com/sparkforge/sparkforge"
LABEL_PREFIX = "dev.sparkforge"
STAGES_SOURCE = ("toolchain", "source", "build-env", "probe", "build", "runtime")
STAGES_WHEEL = ("runtime",)


def pins(recipe: Recipe) -> dict[str, str]:
    """One pin per component (label `dev.sparkforge.pin.<component>`): version, plus commit where pinned."""
    out: dict[str, str] = {}
    for name, component in recipe.model.components.items():
        out[name] = f"{component.version}@{component.commit}" if component.commit else component.version
    out["cuda"] = recipe.model.cuda
    return out


def labels(recipe: Recipe) -> dict[str, str]:
    """Static OCI and sparkforge labels (created/revision come from build args at build time)."""
    vllm = recipe.model.components.vllm
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
    return out


def lock(recipe: Recipe) -> dict[str, Any]:
    """Every resolved pin of the recipe; carried in the image at /opt/sparkforge/lock.json."""
    m = recipe.model
    patches = []
    for name, component in m.components.items():
        for patch in component.patches:
            data = (REPO_ROOT / patch).read_bytes()
            patches.append({"component": name, "path": patch, "sha256": hashlib.sha256(data).hexdigest()})
    return {
        "tool": "sparkforge",
        "version": __version__,
        "recipe": recipe.name,
        "recipe_hash": recipe.hash,
        "gpu": m.gpu,
        "cuda": m.cuda,
        "python": m.python,
        "platforms": list(m.platforms),
        "images": m.images.model_dump(mode="json"),
        "components": {
            name: c.model_dump(mode="json", exclude_none=True) for name, c in m.components.items()
        },
        "patches": patches,
        "build": m.build.model_dump(mode="json"),
        "models": m.models.model_dump(mode="json"),
        "audit": m.audit.model_dump(mode="json"),
        "env": dict(m.env),
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


def final_tags(recipe: Recipe, when: _dt.date, repository: str | None = None) -> Tags:
    """The recipe's tag scheme expanded, as full references."""
    repo = repository or recipe.model.publish.repository
    values = tag_values(recipe, when)
    expand = lambda t: f"{repo}:{t.format(**values)}"  # noqa: E731
    return Tags(
        tuple(expand(t) for t in recipe.model.publish.tags),
        tuple(expand(t) for t in recipe.model.publish.moving_tags),
    )


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


def template_values(recipe: Recipe) -> TemplateValues:
    m = recipe.model
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
        builder_image=m.images.builder,
        runtime_image=m.images.runtime,
        components=components,
        vllm_source=vllm.source,
        patches=[p.rsplit("/", 1)[-1] for p in vllm.patches],
        arch_list=" ".join(m.build.torch_cuda_arch_list),
        max_jobs=m.build.max_jobs,
        nvcc_threads=m.build.nvcc_threads,
        env=dict(m.env),
        labels=labels(recipe),
        stages=STAGES_SOURCE if vllm.source == "git" else STAGES_WHEEL,
        build={**m.build.model_dump(mode="json"), "probe": m.build.probe_settings.model_dump(mode="json")},
    )
