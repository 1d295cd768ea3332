"""Real builds and verification on a Docker engine: the real vLLM 0.33.0 image, negative cases, secrets."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkforge import engine
from sparkforge.errors import EngineError, PreflightError, SparkforgeError, VerifyError
from sparkforge.imagebuild.pipeline import build
from sparkforge.imagebuild.stage import BuildOptions, parse_base_image
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from tests.engine.sessions import build_session
from tests.recipe_files import write_recipe_file

pytestmark = pytest.mark.engine
CI_RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"
UNKNOWN_MODEL = "models:\n  architectures: [NoSuchModelForCausalLM]\n"


def _options(base: str, secrets: tuple[Path, Path], tmp_path: Path, **kw) -> BuildOptions:
    _, token = secrets
    kw.setdefault("preflight", False)
    return BuildOptions(
        platform="linux/amd64",
        bases=parse_base_image(base),
        secrets=(f"id=hf_token,src={token}",),
        gpus="none",
        log_root=tmp_path / "logs",
        **kw,
    )


@pytest.fixture(scope="module")
def real_image(base_amd64: str, canary_secrets, tmp_path_factory) -> tuple[object, object]:
    """The CI recipe (real vLLM 0.33.0 + torch 2.14.0 from PyPI) built, verified and tagged for real."""
    recipe = load_recipe(str(CI_RECIPE))
    tmp = tmp_path_factory.mktemp("real")
    result = build(
        build_session(canary_secrets[0]), recipe, _options(base_amd64, canary_secrets, tmp, preflight=True)
    )  # preflight runs first
    return recipe, result


def test_real_image_verified_and_tagged(real_image) -> None:
    recipe, result = real_image
    report = result.verify
    assert report is not None and report.status == "passed", report and report.to_dict()
    by_name = {c.name: c for c in report.checks}
    assert by_name["registry"].status == "passed"
    assert "Qwen3_5MoeForConditionalGeneration" in by_name["registry"].details["required"]
    assert by_name["versions"].status == "passed"
    assert by_name["versions"].details["vllm"].startswith("0.33.0")
    assert by_name["versions"].details["torch"].startswith("2.14.0")
    assert by_name["labels"].status == "passed" and by_name["lock"].status == "passed"
    assert by_name["kernels"].status == "passed", by_name["kernels"].reason
    for name in ("fp8.reference", "fp8.cutlass_scaled_mm", "fp8.cutlass_block", "fp8.linear"):
        assert by_name[name].status == "skipped" and "no GPU" in by_name[name].reason
    assert by_name["serve"].status == "skipped" and "no model mounted" in by_name["serve"].reason
    assert by_name["pip-check"].status == "passed", by_name["pip-check"].reason
    verbs = by_name["fabric.verbs"]  # the RDMA userspace NCCL needs, pinned, opened by the names NCCL uses
    assert verbs.status == "passed" and "opens libibverbs.so.1" in verbs.reason, verbs.reason
    assert by_name["gpu-verified"].status == "skipped"
    assert (
        report.extra["gpu_verified"]["reason"] == "no GPU was used; recipe targets sm_121: not GPU-verified"
    )
    # The checkout's suite judged the image (mounted read-only), and the report says which one.
    from sparkforge.verify.evidence import suite_digest
    from sparkforge.verify.suite import SUITE_DIR

    assert report.extra["suite"]["sha256"] == suite_digest(SUITE_DIR)
    replay = (result.log_dir / "image-suite.sh").read_text()  # the suite run is a replayable step too
    assert f"--volume {SUITE_DIR}:/opt/sparkforge/judge:ro" in replay and report.extra["image_id"] in replay
    assert "SPARKFORGE-CHECKS-JSON:" in (result.log_dir / "image-suite.log").read_text()
    # CI builds on the offline Debian base: labels, lock and verify all say so.
    assert by_name["base"].details.get("override") is True and "BASE OVERRIDE" in by_name["base"].reason
    assert report.extra["base_override"] is True
    scheme = plan.final_tags(recipe, dt.datetime.now(dt.UTC).date())
    assert result.tags == scheme.immutable  # moving tags wait for a GPU verify
    for tag in result.tags:  # final tags name the very image verify saw, not whatever the candidate is now
        assert engine.inspect_image(tag)["Id"] == report.extra["image_id"], tag
    from sparkforge.verify.suite import verified_record

    record = verified_record(result.candidate)
    assert record["recipe"] == recipe.name and record["image_id"] == report.extra["image_id"]
    assert record["gpu_verified"]["verified"] is False  # a CPU-only verify never satisfies a GPU requirement
    labels = engine.image_labels(result.tags[0])
    assert labels["dev.sparkforge.recipe-hash"] == recipe.hash
    assert labels["org.opencontainers.image.created"] != "unknown"
    assert labels["dev.sparkforge.base.runtime"] == "sparkforge-base/debian-bookworm:amd64"
    from sparkforge.verify.suite import LOCK_PATH, read_image_file

    lock = json.loads(read_image_file(result.candidate, LOCK_PATH) or b"{}")
    assert (
        lock["base_override"] is True and lock["images"]["runtime"] == "sparkforge-base/debian-bookworm:amd64"
    )


def test_the_checkouts_suite_judges_not_the_copy_in_the_image(real_image, tmp_path: Path) -> None:
    # The mounted suite is what runs: one that reports nothing fails verify, though the image's copy is intact.
    _, result = real_image
    from sparkforge.verify.suite import SUITE_DIR, run_image_suite

    broken = tmp_path / "suite"
    broken.mkdir()
    (broken / "run_checks.py").write_text("print('SPARKFORGE-CHECKS-JSON:' + '{\"checks\": []}')\n")
    checks, _ = run_image_suite(result.candidate, False, "linux/amd64", suite=broken)
    assert [c.name for c in checks] == ["image-suite"] and "reported no checks" in checks[0].reason
    checks, _ = run_image_suite(result.candidate, False, "linux/amd64", suite=SUITE_DIR)
    assert {c.name for c in checks} >= {"registry", "versions", "pip-check", "fp8.cutlass_block"}


def test_verify_task_writes_reports(real_image, tmp_path: Path) -> None:
    _, result = real_image
    report, junit = tmp_path / "verify.json", tmp_path / "verify.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "verify",
            "--recipe",
            str(CI_RECIPE),
            "--image",
            result.candidate,
            "--gpus",
            "none",
            "--report",
            str(report),
            "--junit",
            str(junit),
            "--no-kernels",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert data["tool"] == "sparkforge" and data["command"] == "verify" and data["status"] == "passed"
    assert {c["name"] for c in data["checks"]} >= {
        "labels",
        "lock",
        "base",
        "registry",
        "versions",
        "pip-check",
        "fp8.cutlass_scaled_mm",
        "gpu-verified",
    }
    assert data["suite"]["sha256"].startswith("sha256:") and data["gpu_verified"]["verified"] is False
    assert "<testsuite" in junit.read_text()
    assert "registry" in proc.stdout and "PASSED" in proc.stdout


def test_no_secret_in_any_layer(real_image, canary: str) -> None:
    _, result = real_image
    history = subprocess.run(
        ["/usr/bin/docker", "history", "--no-trunc", result.candidate],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert canary not in history
    needle = canary.encode()
    proc = subprocess.Popen(["/usr/bin/docker", "save", result.candidate], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    tail, scanned = b"", 0
    for chunk in iter(lambda: proc.stdout.read(1 << 22), b""):
        assert needle not in tail + chunk, "a build secret landed in an image layer"
        tail = chunk[-len(needle) :]
        scanned += len(chunk)
    assert proc.wait() == 0
    assert scanned > 1_000_000_000  # the whole multi-GB image was read


def test_missing_architecture_fails_verify_and_is_not_tagged(
    base_amd64, canary_secrets, tmp_path: Path
) -> None:
    recipe_path = write_recipe_file(tmp_path / "missing-arch.yaml", UNKNOWN_MODEL, extends=CI_RECIPE)
    recipe = load_recipe(str(recipe_path))
    options = _options(base_amd64, canary_secrets, tmp_path, tags=("sparkforge-test/missing-arch:final",))
    engine.remove_image("sparkforge-test/missing-arch:final")
    with pytest.raises(VerifyError, match="registry") as info:
        build(build_session(canary_secrets[0]), recipe, options)
    assert not engine.image_exists("sparkforge-test/missing-arch:final")
    assert "no final tag" in str(info.value)
    report = json.loads(next((tmp_path / "logs").rglob("verify.json")).read_text())
    registry = next(c for c in report["checks"] if c["name"] == "registry")
    assert registry["status"] == "failed" and "NoSuchModelForCausalLM" in registry["reason"]


def test_preflight_runs_first_and_stops_the_build(base_amd64, canary_secrets, tmp_path: Path) -> None:
    recipe_path = write_recipe_file(tmp_path / "old-vllm.yaml", UNKNOWN_MODEL, extends=CI_RECIPE)
    recipe = load_recipe(str(recipe_path))
    candidate = plan.candidate_tag(recipe, "linux/amd64")
    with pytest.raises(PreflightError, match="nothing was built"):
        build(
            build_session(canary_secrets[0]),
            recipe,
            _options(base_amd64, canary_secrets, tmp_path, preflight=True),
        )
    assert not engine.image_exists(candidate)
    assert not list((tmp_path / "logs").rglob("*-build.log"))


def test_failing_run_step_leaves_no_tag_and_keeps_logs(base_amd64, canary_secrets, tmp_path: Path) -> None:
    bad_pin = "components:\n  transformers:\n    version: 5.99.0\n"
    recipe_path = write_recipe_file(tmp_path / "bad-pin.yaml", bad_pin, extends=CI_RECIPE)
    recipe = load_recipe(str(recipe_path))
    candidate = plan.candidate_tag(recipe, "linux/amd64")
    engine.remove_image(candidate)
    with pytest.raises(
        EngineError, match=r"stage 'runtime', step \d+/\d+ \(RUN .*\); nothing was tagged"
    ) as info:
        build(
            build_session(canary_secrets[0]),
            recipe,
            _options(base_amd64, canary_secrets, tmp_path, tags=("sparkforge-test/bad-pin:final",)),
        )
    assert not engine.image_exists(candidate)
    assert not engine.image_exists("sparkforge-test/bad-pin:final")
    log = next((tmp_path / "logs").rglob("*-build.log"))
    assert "transformers==5.99.0" in log.read_text()
    assert str(log) in str(info.value) and str(log.with_suffix(".sh")) in str(info.value)  # log and replay
    assert "last lines" not in str(info.value)  # the stream was printed once; the error is one paragraph
    assert "pip could not install the pinned set" in str(info.value)
    assert (log.parent / log.name.replace(".log", ".sh")).read_text().count("--secret") == 2


def test_engine_stopped_gives_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "build", "--recipe", str(CI_RECIPE), "--no-preflight"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1
    assert "invoke engine.up" in out and "Traceback" not in out


def test_arm64_smoke_build_under_qemu(base_arm64, tmp_path: Path) -> None:
    recipe = load_recipe(str(REPO_ROOT / "tests" / "recipes" / "smoke-multiarch.yaml"))  # lists linux/arm64
    result = build(
        build_session(),
        recipe,
        BuildOptions(
            preflight=False,
            platform="linux/arm64",
            target="base",
            bases=parse_base_image(base_arm64),
            verify=False,
            log_root=tmp_path / "logs",
        ),
    )
    assert engine.image_platform(result.candidate) == "linux/arm64"
    run = engine.run_container(
        result.candidate,
        ["-c", "import platform, venv; print(platform.machine())"],
        entrypoint=["/opt/venv/bin/python3"],
        platform="linux/arm64",
    )
    assert run.exit_code == 0 and run.stdout.strip() == "aarch64", run
    assert engine.image_labels(result.candidate)["dev.sparkforge.recipe-hash"] == recipe.hash


def test_platform_the_recipe_does_not_list_is_refused_before_building(tmp_path: Path) -> None:
    recipe = load_recipe(str(CI_RECIPE))  # linux/amd64 only
    options = BuildOptions(
        preflight=False, platform="linux/arm64", target="base", verify=False, log_root=tmp_path
    )
    with pytest.raises(
        SparkforgeError, match="--platform linux/arm64: recipe ci-wheels-amd64 builds linux/amd64"
    ):
        build(build_session(), recipe, options)
    assert not (tmp_path / recipe.name).exists()


def test_unpullable_base_image_says_how_to_fix(engine_ready, tmp_path: Path) -> None:
    recipe = load_recipe(str(CI_RECIPE))
    options = BuildOptions(
        preflight=False,
        platform="linux/amd64",
        target="base",
        bases=parse_base_image("sparkforge-test/no-such-base:1"),
        verify=False,
        log_root=tmp_path / "logs",
    )
    with pytest.raises(EngineError, match="A base image could not be pulled") as info:
        build(build_session(), recipe, options)
    assert "--base-image" in str(info.value) and "invoke engine.bases" in str(info.value)


def test_container_that_hangs_is_stopped_with_a_timeout(base_amd64: str) -> None:
    run = engine.run_container(base_amd64, ["-c", "sleep 60"], entrypoint=["/bin/bash"], timeout_s=3)
    assert run.exit_code == 124 and "timed out after 3 s" in run.stderr
