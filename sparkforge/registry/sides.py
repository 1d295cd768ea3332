"""Each side of `invoke diff`: what sparkforge knows about an image (pulled first when only its registry has
it) or a recipe: labels, lock, installed Python distributions, kernel audit, JIT checks, size by layer and
package, this machine's verify record, and benchmark results when given.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkforge import engine
from sparkforge.boundary import parse_json
from sparkforge.context import Session
from sparkforge.errors import EngineError, PublishError
from sparkforge.verify import kernels_report, verified

RECIPE_LABEL = "dev.sparkforge.recipe"
DIFF_PROFILE = "qwen35-35b-a3b-fp8"  # the checkpoint whose kernel selection diff compares
_DIST = re.compile(r"python:(?P<name>.+?)-(?P<version>\d[^-]*)$")


@dataclass(frozen=True)
class Side:
    """One side of a diff: what sparkforge knows about an image or a recipe."""

    subject: str
    kind: str  # image or recipe
    recipe: str
    recipe_hash: str
    gpu: str
    labels: dict[str, str]
    lock: dict[str, Any] | None = None
    packages: dict[str, str] | None = None  # distribution -> version (images only)
    kernels: dict[str, str] | None = None  # library (below site-packages) -> verdict
    backends: dict[str, str] | None = None
    jit: dict[str, str] | None = None
    size: dict[str, Any] | None = None
    verify: dict[str, Any] | None = None
    bench: dict[str, float] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    selection: dict[str, str] | None = None  # layer -> what vLLM selects ('KERNEL (verdict)')
    sbom: Any = None  # verify.sbom.Sbom read from the image's layers (images only)


def _library_key(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(data, Mapping):
        out: dict[str, str] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(data, list) and data and all(isinstance(v, Mapping) for v in data):
        out = {}
        for i, value in enumerate(data):
            out.update(flatten(value, f"{prefix}[{i}]"))
        return out
    return {prefix: json.dumps(data, sort_keys=True) if isinstance(data, list | dict) else str(data)}


def bench_numbers(path: Path) -> dict[str, float]:
    """Every numeric leaf of a benchmark results JSON (`invoke bench --json`), by dotted key."""
    from sparkforge.boundary import read_json

    data = read_json(path, "--bench")  # the boundary: regular file, bounded, finite numbers only
    out = {}
    for key, value in flatten(data).items():
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number):  # a "nan" or "inf" string is no measurement
            out[key] = number
    return out


def _fetch(session: Session, ref: str) -> None:
    """Pull `ref` when the engine does not have it; one-paragraph error when the registry has no such image."""
    if engine.image_exists(ref):
        return
    if "/" not in ref.split("@")[0].split(":")[0] and "@" not in ref:
        raise PublishError(
            f"{ref}: no such image in the local engine, and it names no registry; fix: pass a local image, a "
            "registry reference (host/repository:tag or @sha256:...), or a recipe name"
        )
    session.echo(f"sparkforge: pulling {ref}")
    try:
        engine.run_cli(session.runner, session.container_engine, "diff-pull", "pull", "-q", ref)
    except EngineError as exc:
        what = "digest" if "@" in ref else "tag"
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip().strip("-")]
        why = (lines[-1] if lines else "no answer").removeprefix("Error response from daemon: ")[-200:]
        raise PublishError(
            f"{ref}: not in the local engine, and its registry has no such {what} ({why}); "
            "fix: check the reference ('invoke history --recipe R' lists the digests a tag has named) or log "
            "in to the registry"
        ) from None


def image_side(session: Session, ref: str, bench: Path | None = None) -> Side:
    """Read an image (pulled first when only its registry has it); refuse one without sparkforge labels."""
    from sparkforge.verify.imagefs import image_tree
    from sparkforge.verify.sbom import image_sbom
    from sparkforge.verify.size import packages
    from sparkforge.verify.suite import LOCK_PATH, audit_subject

    _fetch(session, ref)
    attrs = engine.inspect_image(ref)
    labels = dict((attrs.get("Config") or {}).get("Labels") or {})
    if not labels.get(RECIPE_LABEL):
        raise PublishError(
            f"{ref} carries no sparkforge metadata (no {RECIPE_LABEL} label): it was not built by 'invoke build', "
            "so there are no pins, lock or recipe to compare; fix: diff images that sparkforge built"
        )
    image_id = str(attrs["Id"])
    raw_lock = engine.read_image_file(image_id, LOCK_PATH)
    gpu = labels.get("dev.sparkforge.gpu", "sm_121")
    notes: list[str] = []
    audit = audit_subject(image_id, gpu, [])
    libraries = list(audit.extra.get("libraries") or [])
    record = verified.read_record(image_id, verified.VERIFIED_DIR)
    jit = kernels_report.jit_results((record or {}).get("checks"))
    chosen, why = _selection(image_id, gpu)
    if why:
        notes.append(f"{ref}: vLLM's selection not compared ({why})")
    rows = kernels_report.layer_rows(chosen or {}, libraries, jit)
    backends = kernels_report.backend_verdicts(rows)
    tree = image_tree(image_id)
    size = None
    dists: dict[str, str] | None = None
    if tree is None:
        notes.append(f"{ref}: the layer store is not readable here; size and packages not compared")
    else:
        owned = packages(tree)
        dists = {m["name"]: m["version"] for p in owned if (m := _DIST.match(p["name"]))}
        layers = [{"index": s.index, "bytes": s.bytes} for s in tree.layers]
        size = {
            "image_bytes": int(attrs.get("Size") or 0),
            "layers": layers,
            "packages": {p["name"].removeprefix("python:"): p["bytes"] for p in owned},
        }
    return Side(
        ref,
        "image",
        labels.get(RECIPE_LABEL, ""),
        labels.get("dev.sparkforge.recipe-hash", ""),
        gpu,
        labels,
        parse_json(raw_lock.decode("utf-8", "replace"), f"{ref}:{LOCK_PATH}") if raw_lock else None,
        dists,
        {_library_key(str(lib["path"])): str(lib["verdict"]) for lib in libraries},
        {
            b["name"]: f"{b['verdict']}, vLLM {'accepts' if b['vllm_accepts'] else 'refuses'}"
            for b in backends
        },
        {k: str(v["status"]) for k, v in jit.items()} if jit is not None else None,
        size,
        _verify_of(record, gpu),
        bench_numbers(bench) if bench else None,
        tuple(notes),
        kernels_report.selected_by_layer({"layers": rows}) if chosen else None,
        image_sbom(image_id) if tree is not None else None,  # the packages diff's sbom section compares
    )


def _selection(image_id: str, gpu: str) -> tuple[dict[str, Any] | None, str]:
    """vLLM's selection in the image for the mission profile's checkpoint (cached), or why there is none."""
    from sparkforge.errors import SparkforgeError
    from sparkforge.verify.kernels_run import selection_input
    from sparkforge.verify.selection import run_selection

    try:
        ask = selection_input(DIFF_PROFILE, "", "")
        if ask is None:
            return None, "no checkpoint config"
        return run_selection(image_id, gpu, ask.config, ask.args), ""
    except SparkforgeError as exc:
        return None, str(exc)[:200]


def _verify_of(record: Mapping[str, Any] | None, gpu: str) -> dict[str, Any]:
    if record is None:
        return {"status": "none on this machine", "gpu_verified": "no"}
    verdict = record.get("gpu_verified") or {}
    return {
        "status": record.get("status"),
        "gpu_verified": "yes"
        if verified.is_gpu_verified(dict(record), gpu)
        else f"no ({verdict.get('reason', '')})",
    }


def recipe_side(name: str, bench: Path | None = None) -> Side:
    from sparkforge.recipe import plan
    from sparkforge.recipe.loader import load_recipe

    recipe = load_recipe(name)
    return Side(
        name,
        "recipe",
        recipe.name,
        recipe.hash,
        recipe.model.gpu,
        plan.labels(recipe),
        plan.lock(recipe),
        bench=bench_numbers(bench) if bench else None,
    )


def side_of(session: Session, subject: str, bench: Path | None = None) -> Side:
    """A recipe (a name in recipes/ or a .yaml path) or else an image reference."""
    from sparkforge.recipe.loader import list_recipe_names

    if subject.endswith((".yaml", ".yml")) or subject in list_recipe_names():
        return recipe_side(subject, bench)
    return image_side(session, subject, bench)
