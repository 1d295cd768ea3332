"""Verify an image against its recipe: host-side label/lock/kernel checks, then the in-image suite."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sparkforge import engine
from sparkforge.boundary import MAX_JSON_BYTES, parse_json, write_output
from sparkforge.console import Stages
from sparkforge.errors import AuditError, EngineError, InputError, SparkforgeError, VerifyError
from sparkforge.recipe import plan
from sparkforge.recipe.budget import size_check
from sparkforge.recipe.loader import Recipe
from sparkforge.report import Check, Report
from sparkforge.verify import emulation, evidence, verified
from sparkforge.verify.gpuhost import compare_gpu, host_gpu
from sparkforge.verify.rust import check_rust_extensions

CarriedCheck = Callable[
    [Recipe, str], Check
]  # what a pulled image carried (registry.trust.attestation_check)

MARKER = "SPARKFORGE-CHECKS-JSON:"
NONCE_ENV = "SPARKFORGE_NONCE"
LOCK_PATH = "/opt/sparkforge/lock.json"
# The checkout's suite (this package's inimage/) judges the image, mounted read-only; the copy every image
# carries (/opt/sparkforge/image-tests) is for users' own checks.
SUITE_DIR = Path(__file__).resolve().parent / "inimage"
SUITE_MOUNT = "/opt/sparkforge/judge"
GpuMode = Literal["all", "none", "auto"]
GPU_MODES: tuple[GpuMode, ...] = ("all", "none", "auto")


def check_labels(recipe: Recipe, labels: dict[str, str]) -> Check:
    """The image's labels carry the recipe's hash and every pin."""
    wrong = plan.label_drift(recipe, labels)
    if wrong:
        return Check(
            "labels",
            "failed",
            f"{plan.drift_text(wrong)}; the image was built from another recipe or version: rebuild it or "
            "pass the matching --recipe",
            {"mismatched": {k: {"expected": b, "found": a} for k, (a, b) in wrong.items()}},
        )
    return Check("labels", "passed", f"recipe hash and {len(plan.pins(recipe))} pins match", {})


def check_base(recipe: Recipe, labels: dict[str, str]) -> Check:
    """Which base images the image was built on; an override is reported (push refuses it by default)."""
    override = plan.base_override(recipe, labels)
    found = {stage: labels.get(label) for stage, label in plan.BASE_LABELS.items()}
    if not override:
        return Check("base", "passed", "built on the recipe's pinned base images", {"bases": found})
    text = "; ".join(f"{stage}: {a or '(no label)'} instead of {b}" for stage, (a, b) in override.items())
    return Check(
        "base",
        "passed",
        f"BASE OVERRIDE: built on other base images than the recipe pins ({text}); push and publish refuse it "
        "without --allow-base-override",
        {"bases": found, "override": True},
    )


def read_image_file(image: str, path: str) -> bytes | None:
    """A file from an image without running it (None when absent)."""
    return engine.read_image_file(image, path)


def check_lock(recipe: Recipe, data: bytes | None) -> Check:
    if data is None:
        return Check("lock", "failed", f"{LOCK_PATH} is missing from the image; rebuild with 'invoke build'")
    try:
        lock = parse_json(data, f"{LOCK_PATH} in the image", fix="rebuild the image with 'invoke build'")
    except InputError as exc:
        return Check("lock", "failed", str(exc))
    if not isinstance(lock, dict):
        return Check(
            "lock", "failed", f"{LOCK_PATH} in the image is no JSON object; rebuild with 'invoke build'"
        )
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


def audit_subject(target: str, gpu: str, require: Sequence[str], only: Sequence[str] | None = None) -> Report:
    """Audit a directory, wheel or file, or else an image reference (exported, never run); `only`: see
    audit.scan.audit_target."""
    from sparkforge.audit.scan import audit_target
    from sparkforge.oci import check_reference
    from sparkforge.verify import imagefs

    path = Path(target).expanduser()
    if path.exists():
        return audit_target(path, gpu=gpu, require=require, only=only)
    if target.startswith(("/", "./", "../", "~")) or target.endswith((".whl", ".zip", ".so", ".o")):
        raise AuditError(
            f"{target}: no such file or directory; fix: check the path (or give an image reference)"
        )
    check_reference("TARGET", target)  # the boundary: the one grammar, before the engine
    # the layer store when readable, else the export stream
    return imagefs.audit_image(target, gpu, require, only=only)


def check_kernels(recipe: Recipe, image: str) -> Check:
    """Kernel coverage for the recipe's GPU from the image's binaries (no container is started)."""
    if recipe.model.device == "cpu":
        return Check(
            "kernels",
            "skipped",
            f"not applicable: recipe {recipe.name} is a CPU test vehicle (device: cpu); no GPU kernels to audit",
        )
    require = recipe.model.audit.require
    audit = audit_subject(image, recipe.model.gpu, require, only=require or None)  # nothing else decides
    failed = [c for c in audit.checks if c.status == "failed"]
    details = {
        "target": recipe.model.gpu,
        "summary": audit.extra.get("summary"),
        "required": [c.to_dict() for c in audit.checks],
    }
    if failed:
        return Check("kernels", "failed", "; ".join(c.reason for c in failed), details)
    return Check("kernels", "passed", f"every required library has kernels for {recipe.model.gpu}", details)


SUITE_TIMEOUT_S = 1800  # the in-image suite's limit on a native engine (emulation scales it)


def run_image_suite(
    image: str,
    gpus: bool,
    platform: str | None,
    model_dir: Path | None = None,
    suite: Path = SUITE_DIR,
    log_dir: Path | None = None,
    on_stderr_line: Callable[[str], None] | None = None,
) -> tuple[list[Check], dict[str, Any]]:
    """The checkout's suite, mounted read-only into a throwaway container of the image: (checks, the suite's
    own document: GPU, env). A report that is empty, lacks an expected check or has an unknown status fails."""
    nonce = secrets.token_hex(16)  # this run's report must echo it: no canned or replayed report counts
    environment = {
        "VLLM_LOGGING_LEVEL": "WARNING",
        "HF_HUB_OFFLINE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        NONCE_ENV: nonce,
    }
    environment.update(emulation.suite_environment(platform))  # thread settings under qemu-user only
    volumes: dict[str, str] = {str(suite.resolve()): SUITE_MOUNT}
    if model_dir is not None:
        if not model_dir.is_dir():
            raise VerifyError(f"--model-dir {model_dir}: not a directory; fix: pass a local model directory")
        volumes[str(model_dir.resolve())] = "/models/smoke"
        environment["SPARKFORGE_SMOKE_MODEL"] = "/models/smoke"
    run = SuiteRun(
        image,
        [f"{SUITE_MOUNT}/run_checks.py", "--lock", LOCK_PATH, "--nonce", nonce],
        gpus,
        platform,
        environment,
        volumes,
    )
    if log_dir is not None:  # the same run, replayable by hand, beside its log like every other step
        _save_replay(log_dir, run)
    result = engine.run_container(
        run.image,
        run.argv,
        entrypoint=[run.entrypoint],
        gpus=run.gpus,
        platform=run.platform,
        timeout_s=emulation.suite_timeout(platform, SUITE_TIMEOUT_S),
        environment=run.environment,
        volumes=run.volumes,
        on_stderr_line=on_stderr_line,
    )
    if log_dir is not None:
        write_output(log_dir / "image-suite.log", result.stdout + result.stderr, "suite log")
    if result.exit_code == 124 and MARKER not in result.stdout:
        return [
            Check(
                "image-suite", "failed", f"the in-image suite {result.stderr}; output: {result.stdout[-800:]}"
            )
        ], {}
    return read_suite_output(result.stdout, result.stderr, result.exit_code, nonce)


PROGRESS = re.compile(r"SPARKFORGE-PROGRESS: (\d{1,3})/\d{1,3} ([A-Za-z0-9_.-]{1,64})")


def suite_progress(stages: Stages) -> Callable[[str], None]:
    """The in-image suite's stderr line -> the stage that starts now (every other line is ignored here)."""

    def on_line(line: str) -> None:
        found = PROGRESS.fullmatch(line.strip())
        if found:
            stages.stage(int(found.group(1)), found.group(2))

    return on_line


def read_suite_output(
    stdout: str, stderr: str, exit_code: int, nonce: str
) -> tuple[list[Check], dict[str, Any]]:
    """Exactly one report marker in the whole output, echoing this run's nonce; anything else is a failure.

    A second marker means something besides the suite wrote a report (an `atexit` hook, a sitecustomize in
    the image): the host refuses to choose between them.
    """
    lines = [ln for ln in (stdout + "\n" + stderr).splitlines() if MARKER in ln]
    if not lines:
        return [
            Check(
                "image-suite",
                "failed",
                f"the in-image suite exited {exit_code} without a report; last output: "
                + (stderr or stdout)[-800:],
            )
        ], {}
    if len(lines) > 1 or not lines[0].startswith(MARKER):
        return [
            Check(
                "image-suite",
                "failed",
                f"the suite's output holds {len(lines)} report markers where exactly one is expected: something "
                "in the image besides the suite wrote a report (an atexit hook, a sitecustomize); nothing in "
                "this output is trusted. Fix: rebuild the image from the recipe",
                {"markers": len(lines)},
            )
        ], {}
    checks, document = parse_suite_output(lines[0][len(MARKER) :])
    unreadable = not document and [c.name for c in checks] == ["image-suite"]
    if not unreadable and document.get("nonce") != nonce:
        return [
            Check(
                "image-suite",
                "failed",
                "the suite's report does not echo this run's nonce (a canned or replayed report); nothing in "
                "this output is trusted. Fix: run the checkout's suite (sparkforge/verify/inimage/run_checks.py)",
            )
        ], {}
    return checks, document


@dataclass(frozen=True)
class SuiteRun:
    """One run of the in-image suite: the container verify starts (and the replay script beside its log)."""

    image: str
    argv: list[str]
    gpus: bool
    platform: str | None
    environment: dict[str, str]
    volumes: dict[str, str]  # host path -> mount point, read-only
    entrypoint: str = "/opt/venv/bin/python3"


def _save_replay(log_dir: Path, run: SuiteRun) -> None:
    import shlex

    command = ["docker", "run", "--rm", "--entrypoint", run.entrypoint]
    command += ["--gpus", "all"] if run.gpus else []
    command += ["--platform", run.platform] if run.platform else []
    for key, value in sorted(run.environment.items()):
        command += ["--env", f"{key}={value}"]
    for host, target in run.volumes.items():
        command += ["--volume", f"{host}:{target}:ro"]
    log_dir.mkdir(parents=True, exist_ok=True)
    script = (
        "#!/usr/bin/env bash\n# The in-image suite as verify ran it.\nset -euo pipefail\n"
        + shlex.join([*command, run.image, *run.argv])
        + "\n"
    )
    write_output(log_dir / "image-suite.sh", script, "suite replay", mode=0o755)


def parse_suite_output(text: str) -> tuple[list[Check], dict[str, Any]]:
    """The suite's JSON document -> checks; anything untrustworthy in it becomes a failed 'image-suite' check."""
    try:
        # NaN stays readable: a GPU check may print one (a figure it could not measure); the check judges it.
        document = parse_json(text, "the suite's report", max_bytes=MAX_JSON_BYTES, nonfinite=True)
        raw = list(document["checks"])
    except (InputError, ValueError, KeyError, TypeError) as exc:
        return [Check("image-suite", "failed", f"the suite's report is not readable ({exc})")], {}
    problems = evidence.suite_problems(raw)
    checks = [
        Check.from_dict(c)
        for c in raw
        if isinstance(c, dict) and c.get("status") in evidence.STATUSES and "name" in c
    ]
    if problems:
        checks.append(Check("image-suite", "failed", "; ".join(problems) + "; fix: run the checkout's suite"))
    return checks, {k: v for k, v in document.items() if k != "checks"}


def gpu_mode(text: str) -> GpuMode:
    """--gpus as typed: all, none or auto; anything else is a user error before anything runs."""
    for mode in GPU_MODES:
        if text == mode:
            return mode
    raise VerifyError(f"--gpus {text!r}: use all, none or auto")


def resolve_gpus(mode: str) -> tuple[bool, str]:
    """(use a GPU, why) for a --gpus mode; raises before anything runs when the mode cannot be honoured."""
    if mode not in GPU_MODES:
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
    recipe: Recipe,
    image: str,
    *,
    gpus: GpuMode = "auto",
    kernels: bool = True,
    model_dir: Path | None = None,
    log_dir: Path | None = None,
    carried: CarriedCheck | None = None,
) -> Report:
    """Every verify check for `image` (resolved to its image ID first: every check sees the same image).

    `carried` checks what the image carried from its registry (signed attestations); the registry side hands
    it in, since verify sits below the registry.
    """
    use_gpus, why = resolve_gpus(gpus)
    image_id = str(engine.inspect_image(image)["Id"])
    report = Report(command="verify", subject=image, recipe=recipe.name)
    report.extra["image_id"] = image_id
    start = time.monotonic()
    labels = engine.image_labels(image_id)
    report.add(check_labels(recipe, labels)).duration_s = time.monotonic() - start
    report.add(check_base(recipe, labels))
    size = int(engine.inspect_image(image_id).get("Size") or 0)
    report.add(size_check(size, recipe.model.image, recipe.model.runtime.remove))
    start = time.monotonic()
    report.add(check_lock(recipe, read_image_file(image_id, LOCK_PATH))).duration_s = time.monotonic() - start
    if kernels:
        start = time.monotonic()
        try:
            check = check_kernels(recipe, image_id)
        except SparkforgeError as exc:
            check = Check("kernels", "failed", str(exc))
        check.duration_s = time.monotonic() - start
        report.add(check)
    report.add(check_rust_extensions(recipe, image_id))
    report.add(
        carried(recipe, image)
        if carried is not None
        else Check("attestation", "skipped", "signed attestations are checked for pulled images only")
    )
    platform = engine.image_platform(image_id)
    gpu, probe = host_gpu(plan.bases(recipe).runtime, use_gpus, platform)
    report.add(probe)
    with Stages("verify: in-image suite", len(evidence.EXPECTED_IMAGE_CHECKS)) as stages:
        checks, document = run_image_suite(
            image_id,
            use_gpus,
            platform,
            model_dir=model_dir,
            log_dir=log_dir,
            on_stderr_line=suite_progress(stages),
        )
    if gpus == "all":
        checks = [Check.from_dict(c) for c in evidence.require_gpu_checks([c.to_dict() for c in checks])]
    for check in checks:
        report.add(check)
    report.add(compare_gpu(gpu, document.get("gpu")))
    # The verdict's GPU is the host's reading; the suite's own claim only has to agree with it.
    verdict = evidence.gpu_verdict([c.to_dict() for c in report.checks], gpu, recipe.model.gpu)
    report.add(
        Check("gpu-verified", "passed" if verdict.verified else "skipped", verdict.reason, verdict.to_dict())
    )
    report.extra["recipe_hash"] = recipe.hash
    report.extra["gpus"] = {"mode": gpus, "used": use_gpus, "why": why}
    report.extra["gpu"] = gpu
    report.extra["suite_gpu"] = document.get("gpu")
    report.extra["gpu_verified"] = verdict.to_dict()
    report.extra["suite"] = {"source": str(SUITE_DIR), "sha256": evidence.suite_digest(SUITE_DIR)}
    report.extra["base_override"] = bool(plan.base_override(recipe, labels))
    report.extra["platform"] = platform
    return report


@dataclass(frozen=True)
class VerifyOptions:
    """What one verify was told (`invoke verify`, or the build's verify step)."""

    gpus: GpuMode = "auto"
    kernels: bool = True  # the kernel coverage audit of the image's libraries
    model_dir: Path | None = None  # a local model for the suite's smoke generation
    log_dir: Path | None = None  # the suite's log and replay script
    carried: CarriedCheck | None = None  # what the image carried from its registry (signed attestations)
    directory: Path = verified.VERIFIED_DIR  # where the result is kept, by image ID


def verify_recorded(recipe: Recipe, image: str, options: VerifyOptions) -> Report:
    """Verify `image` and keep the result for its image ID (passed or failed: a failure revokes a pass).

    A verify that ends in an exception is a failure too: it is recorded (revoking an earlier pass), then raised.
    """
    image_id = str(engine.inspect_image(image)["Id"])
    try:
        report = verify_image(
            recipe,
            image_id,
            gpus=options.gpus,
            kernels=options.kernels,
            model_dir=options.model_dir,
            log_dir=options.log_dir,
            carried=options.carried,
        )
    except BaseException as exc:
        failed = Report(command="verify", subject=image, recipe=recipe.name)
        failed.add(Check("verify", "failed", f"verify did not finish: {exc.__class__.__name__}: {exc}"))
        failed.extra.update({"image_id": image_id, "recipe_hash": recipe.hash})
        record_verified(failed, options.directory)
        raise
    report.subject = image
    record_verified(report, options.directory)
    return report


def record_verified(report: Report, directory: Path = verified.VERIFIED_DIR) -> Path:
    """Keep this verify's result for the exact image (by ID); a failure revokes an earlier pass."""
    return verified.write_record(str(report.extra["image_id"]), report.to_dict(), directory)


def verified_record(image: str, directory: Path = verified.VERIFIED_DIR) -> dict[str, Any] | None:
    """The passed verify report of this exact image (by ID), if its latest verify passed."""
    return verified.passed_record(str(engine.inspect_image(image)["Id"]), directory)
