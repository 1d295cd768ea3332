"""Verify an image against its recipe: host-side label/lock/kernel checks, then the in-image suite."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from sparkforge import engine, plan
from sparkforge.errors import AuditError, EngineError, SparkforgeError, VerifyError
from sparkforge.recipe import Recipe
from sparkforge.report import Check, Report

MARKER = "SPARKFORGE-CHECKS-JSON:"
VERIFIED_DIR = Path(__file__).resolve().parent.parent / "build" / "verified"
SUITE = "/opt/sparkforge/image-tests/run_checks.py"
LOCK_PATH = "/opt/sparkforge/lock.json"
GpuMode = Literal["all", "none", "auto"]


def check_labels(recipe: Recipe, labels: dict[str, str]) -> Check:
    """The image's labels carry the recipe's hash and every pin."""
    expected = {k: v for k, v in plan.labels(recipe).items() if k.startswith(plan.LABEL_PREFIX)}
    wrong = {k: {"expected": v, "found": labels.get(k)} for k, v in expected.items() if labels.get(k) != v}
    if wrong:
        return Check(
            "labels",
            "failed",
            f"{len(wrong)} label(s) differ from the recipe ({', '.join(sorted(wrong))}); the image was built "
            "from another recipe or version: rebuild it or pass the matching --recipe",
            {"mismatched": wrong},
        )
    return Check(
        "labels", "passed", f"recipe hash and {len(plan.pins(recipe))} pins match", {"checked": len(expected)}
    )


def read_image_file(image: str, path: str) -> bytes | None:
    """A file from an image without running it (None when absent)."""
    return engine.read_image_file(image, path)


def check_lock(recipe: Recipe, data: bytes | None) -> Check:
    if data is None:
        return Check("lock", "failed", f"{LOCK_PATH} is missing from the image; rebuild with 'invoke build'")
    lock = json.loads(data)
    if lock.get("recipe_hash") != recipe.hash:
        return Check(
            "lock",
            "failed",
            "the image's lock file was written for another recipe hash",
            {"image": lock.get("recipe_hash"), "recipe": recipe.hash},
        )
    return Check(
        "lock", "passed", f"{LOCK_PATH} present and matches the recipe", {"recipe_hash": recipe.hash}
    )


def audit_subject(target: str, gpu: str, require: Sequence[str]) -> Report:
    """Audit a directory, wheel or file, or else an image reference (exported, never run)."""
    from sparkforge import imagefs
    from sparkforge.audit import audit_target

    path = Path(target).expanduser()
    if path.exists():
        return audit_target(path, gpu=gpu, require=require)
    if target.startswith(("/", "./", "../", "~")) or target.endswith((".whl", ".zip", ".so", ".o")):
        raise AuditError(
            f"{target}: no such file or directory; fix: check the path (or give an image reference)"
        )
    return imagefs.audit_image(target, gpu, require)  # the layer store when readable, else the export stream


def check_kernels(recipe: Recipe, image: str) -> Check:
    """Kernel coverage for the recipe's GPU from the image's binaries (no container is started)."""
    audit = audit_subject(image, recipe.model.gpu, recipe.model.audit.require)
    failed = [c for c in audit.checks if c.status == "failed"]
    details = {
        "target": recipe.model.gpu,
        "summary": audit.extra.get("summary"),
        "required": [c.to_dict() for c in audit.checks],
    }
    if failed:
        return Check("kernels", "failed", "; ".join(c.reason for c in failed), details)
    return Check("kernels", "passed", f"every required library has kernels for {recipe.model.gpu}", details)


def run_image_suite(
    image: str, gpus: bool, platform: str | None, timeout_s: int = 1800, model_dir: Path | None = None
) -> list[Check]:
    """The suite copied into the image, run in a throwaway container; one Check per in-image check."""
    environment = {"VLLM_LOGGING_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1"}
    volumes: dict[str, str] = {}
    if model_dir is not None:
        if not model_dir.is_dir():
            raise VerifyError(f"--model-dir {model_dir}: not a directory; fix: pass a local model directory")
        volumes[str(model_dir.resolve())] = "/models/smoke"
        environment["SPARKFORGE_SMOKE_MODEL"] = "/models/smoke"
    result = engine.run_container(
        image,
        [SUITE],
        entrypoint=["/opt/venv/bin/python3"],
        gpus=gpus,
        platform=platform,
        timeout_s=timeout_s,
        environment=environment,
        volumes=volumes,
    )
    if result.exit_code == 124 and MARKER not in result.stdout:
        return [
            Check(
                "image-suite", "failed", f"the in-image suite {result.stderr}; output: {result.stdout[-800:]}"
            )
        ]
    line = next((ln for ln in reversed(result.stdout.splitlines()) if ln.startswith(MARKER)), None)
    if line is None:
        return [
            Check(
                "image-suite",
                "failed",
                f"the in-image suite exited {result.exit_code} without a report; last output: "
                + (result.stderr or result.stdout)[-800:],
            )
        ]
    return [Check.from_dict(c) for c in json.loads(line[len(MARKER) :])["checks"]]


def _resolve_gpus(mode: GpuMode) -> tuple[bool, str]:
    if mode not in ("all", "none", "auto"):
        raise VerifyError(f"--gpus {mode!r}: use all, none or auto")
    if mode == "none":
        return False, "GPU checks disabled (--gpus none)"
    available = engine.gpu_runtime_available()
    if mode == "all" and not available:
        raise EngineError(
            "--gpus all: the engine has no NVIDIA runtime; fix: install nvidia-container-toolkit and restart "
            "Docker, or use --gpus auto"
        )
    return available, "GPU runtime present" if available else "no NVIDIA runtime in this engine"


def verify_image(
    recipe: Recipe, image: str, *, gpus: GpuMode = "auto", kernels: bool = True, model_dir: Path | None = None
) -> Report:
    """Every verify check for `image`; the report fails if any check failed."""
    report = Report(command="verify", subject=image, recipe=recipe.name)
    start = time.monotonic()
    labels = engine.image_labels(image)
    report.add(check_labels(recipe, labels)).duration_s = time.monotonic() - start
    start = time.monotonic()
    report.add(check_lock(recipe, read_image_file(image, LOCK_PATH))).duration_s = time.monotonic() - start
    if kernels:
        start = time.monotonic()
        try:
            check = check_kernels(recipe, image)
        except SparkforgeError as exc:
            check = Check("kernels", "failed", str(exc))
        check.duration_s = time.monotonic() - start
        report.add(check)
    use_gpus, why = _resolve_gpus(gpus)
    platform = engine.image_platform(image)
    for check in run_image_suite(image, use_gpus, platform, model_dir=model_dir):
        report.add(check)
    report.extra["gpus"] = {"used": use_gpus, "why": why}
    report.extra["platform"] = platform
    return report


def _record_path(image_id: str, directory: Path) -> Path:
    return directory / f"{image_id.removeprefix('sha256:')}.json"


def record_verified(image: str, report: Report, directory: Path = VERIFIED_DIR) -> Path | None:
    """Remember that this exact image (by ID) passed verify; `push` refuses images without such a record."""
    if report.status != "passed":
        return None
    path = _record_path(str(engine.inspect_image(image)["Id"]), directory)
    report.write_json(path)
    return path


def verified_record(image: str, directory: Path = VERIFIED_DIR) -> dict[str, Any] | None:
    """The passed verify report of this exact image (by ID), if there is one."""
    path = _record_path(str(engine.inspect_image(image)["Id"]), directory)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data if data.get("status") == "passed" else None
