"""The session's clean `invoke conform` run on the CPU twin with the trained tiny model (its report and golden are
used by test_conform_real.py: one run, three server starts)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from cluster import DOCKER, sh
from real_fixtures import REAL_TIMINGS, TWIN_RECIPE
from test_serve_real import invoke

from sparkforge.recipe.loader import REPO_ROOT

CONFORM_PROFILE = str(REPO_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe-conform.yaml")

PORT = "18481"
FAULTS = Path(__file__).with_name("planted_faults.py")
FAULTY = "sparkforge-run-test/cpu-twin:planted-faults"
SITE = "/opt/venv/lib/python3.11/site-packages"
HOOK = Path(__file__).with_name("planted_hook.py")  # the import hook every planted_*.py module installs
SPEC_FAULT = Path(__file__).with_name("planted_spec_fault.py")
SPEC_FAULTY = "sparkforge-run-test/cpu-twin:planted-spec-fault"
STATE_FAULT = Path(__file__).with_name("planted_state_fault.py")
STATE_FAULTY = "sparkforge-run-test/cpu-twin:planted-state-fault"


def faulty_image(cpu_twin: str, context: Path, tag: str = FAULTY) -> str:
    """The twin plus one layer holding tests/engine/planted_faults.py (built in seconds); the caller removes it."""
    context.mkdir()
    shutil.copy(FAULTS, context / "sparkforge_faults.py")
    (context / "Dockerfile").write_text(
        f"FROM {cpu_twin}\nCOPY sparkforge_faults.py {SITE}/sparkforge_faults.py\n"
    )
    sh(DOCKER, "build", "--quiet", "--tag", tag, str(context), timeout=600)
    return tag


def planted_image(cpu_twin: str, context: Path, source: Path, tag: str) -> str:
    """The twin plus one layer holding `source` (a planted_*.py module), the import hook it installs
    (planted_hook.py) and the .pth that calls its `install()` at every interpreter start (silent until vLLM
    imports the module it wraps); the caller removes it."""
    module = "sparkforge_" + source.stem.removeprefix("planted_")
    context.mkdir()
    shutil.copy(source, context / f"{module}.py")
    shutil.copy(HOOK, context / "sparkforge_planted_hook.py")
    (context / f"{module}.pth").write_text(f"import {module}; {module}.install()\n")
    (context / "Dockerfile").write_text(
        f"FROM {cpu_twin}\nCOPY sparkforge_planted_hook.py {module}.py {module}.pth {SITE}/\n"
    )
    sh(DOCKER, "build", "--quiet", "--tag", tag, str(context), timeout=600)
    return tag


def spec_faulty_image(cpu_twin: str, context: Path) -> str:
    """tests/engine/planted_spec_fault.py planted (the rejection sampler accepts every draft, shifted by one id)."""
    return planted_image(cpu_twin, context, SPEC_FAULT, SPEC_FAULTY)


def state_faulty_image(cpu_twin: str, context: Path) -> str:
    """tests/engine/planted_state_fault.py planted (the linear-attention state lost every 384 tokens)."""
    return planted_image(cpu_twin, context, STATE_FAULT, STATE_FAULTY)


def launch_args(image: str, model_dir: Path, cache: Path) -> list[str]:
    return ["--image", image, "--gpus", "none", "--model-dir", str(model_dir), "--cache-dir", str(cache),
            "--port", PORT, "--ulimit", "nofile=16384", "--health-timeout", "900"]  # fmt: skip


def conform(profile: str, *args: str) -> tuple[int, str, float]:
    return invoke("conform", "--recipe", TWIN_RECIPE, "--profile", profile, *args, timeout=2400)


def write_profile(doc: dict, name: str, folder: Path) -> Path:
    """A profile derived for a test, written as `folder/<name>.yaml` (the file's name is the profile's)."""
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def conform_faulty(
    build: Callable[[Path], str], profile: Path, model_dir: Path, tmp_path: Path, *extra: str
) -> tuple[int, str, float, dict]:
    """`invoke conform` of `profile` (and `extra` options) on the faulty image `build` makes (in
    tmp_path/faulty-image); the deployment and the image removed after: (exit status, output, seconds, the JSON report or {}); each row's verdict printed."""
    report = tmp_path / "conform.json"
    image = ""
    try:
        image = build(tmp_path / "faulty-image")
        code, out, seconds = conform(
            str(profile), *launch_args(image, model_dir, tmp_path / "cache"), *extra, "--json", str(report)
        )
    finally:
        invoke("serve.down", "--profile", profile.stem)
        if image:
            sh(DOCKER, "rmi", image, check=False)
    doc = json.loads(report.read_text()) if report.exists() else {}
    rows = {c["name"]: (c["status"], c["reason"][:400]) for c in doc.get("checks", [])}
    print(json.dumps(rows, indent=1))
    return code, out, seconds, doc


@pytest.fixture(scope="session")
def clean_conform(
    cpu_twin: str, trained_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict, Path]:
    """Every check on the trained model, the golden recorded: (the JSON report, the golden file)."""
    root = tmp_path_factory.mktemp("conform")
    golden, report = root / "golden.json", root / "conform.json"
    code, out, seconds = conform(
        CONFORM_PROFILE, *launch_args(cpu_twin, trained_model, root / "cache"), "--record", "--golden", str(golden),
        "--json", str(report), "--junit", str(root / "conform.xml"),
    )  # fmt: skip
    REAL_TIMINGS["conform_all_s"] = round(seconds, 1)
    assert code == 0, out[-5000:]
    assert (root / "conform.xml").read_text().count("<testcase") == len(
        json.loads(report.read_text())["checks"]
    )
    return json.loads(report.read_text()), golden
