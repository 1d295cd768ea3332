"""Declared removals and the image's size budget: the schema, the recipe hash and lock, the rendered steps,
slim-venv deleting what is declared (a real run of the script on a real folder), the verify check and the diff."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from sparkforge.imagebuild.render import render_dockerfile
from sparkforge.recipe import plan
from sparkforge.recipe.budget import ImageBudget, Removal, size_check
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.registry.diff import compare
from sparkforge.registry.sides import recipe_side

SLIM = REPO_ROOT / "dockerfiles" / "files" / "slim-venv.py"
REASON = "static archives: nothing links against them at serve time"


def _recipe(tmp_path: Path, extra: str, name: str = "slim.yaml") -> Path:
    path = tmp_path / name
    path.write_text("extends: vllm-qwen35-wheels\n" + extra)
    return path


SLIMMED = f"""runtime:
  remove:
    - glob: "triton/**/*.a"
      reason: "{REASON}"
    - glob: torch/share/cmake
      reason: "CMake config files: no extension is configured against torch at serve time"
image:
  max_size: 8GB
"""


@pytest.mark.parametrize(
    "glob", ["../etc/passwd", "/usr/lib", "a;rm -rf /", "torch/../../x", "a//b", " x", ""]
)
def test_a_removal_must_be_a_glob_below_site_packages(glob: str) -> None:
    with pytest.raises(ValidationError, match="not a relative path glob below site-packages; fix:"):
        Removal(glob=glob, reason=REASON)


@pytest.mark.parametrize(
    ("reason", "ok"), [("too short", False), ("x\ny is two lines long", False), (REASON, True)]
)
def test_a_removal_says_why(reason: str, ok: bool) -> None:
    if ok:
        assert Removal(glob="a/*.a", reason=reason).reason == reason
    else:
        with pytest.raises(ValidationError, match="fix: say why nothing the recipe serves loads"):
            Removal(glob="a/*.a", reason=reason)


@pytest.mark.parametrize(
    ("text", "size"), [("8GB", 8_000_000_000), ("7500MB", 7_500_000_000), ("7.5GB", 7_500_000_000)]
)
def test_the_budget_reads_decimal_sizes(text: str, size: int) -> None:
    assert ImageBudget(max_size=text).max_bytes == size
    with pytest.raises(ValidationError, match=r"fix: write e\.g\. '8GB'"):
        ImageBudget(max_size="8 gigabytes")


def test_removals_are_declared_in_the_recipe_its_hash_lock_and_both_pip_steps(tmp_path: Path) -> None:
    plain = load_recipe(str(_recipe(tmp_path, "runtime:\n  remove: []\n", "bare.yaml")))  # nothing removed
    slimmed = load_recipe(str(_recipe(tmp_path, SLIMMED)))
    assert slimmed.hash != plain.hash  # a removal is part of what the recipe builds
    lock = plan.lock(slimmed)
    assert [r["glob"] for r in lock["runtime"]["remove"]] == ["triton/**/*.a", "torch/share/cmake"]
    assert lock["image"] == {"max_size": "8GB"}
    assert "remove" not in plan.lock(plain)["runtime"] and "image" not in plan.lock(plain)  # as before
    text = render_dockerfile(slimmed)
    assert text.count("--remove 'triton/**/*.a' --remove torch/share/cmake") == 2  # in each pip step
    assert "--remove" not in render_dockerfile(plain)


def test_the_wheels_recipe_declares_its_removals_each_with_a_reason() -> None:
    wheels = load_recipe("vllm-qwen35-wheels")
    globs = [r.glob for r in wheels.model.runtime.remove]
    assert "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" in globs and "tokenspeed_triton" in globs
    assert not [g for g in globs if g.startswith(("torch/lib", "nvidia/cudnn", "triton/"))]  # kept on purpose
    lock = plan.lock(wheels)
    assert [r["glob"] for r in lock["runtime"]["remove"]] == globs  # what the image's lock carries
    assert render_dockerfile(wheels).count("--remove tokenspeed_triton") == 2
    ci = load_recipe(str(REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"))
    assert (
        ci.model.runtime.remove == wheels.model.runtime.remove and ci.model.image.max_bytes == 8_000_000_000
    )


def test_invoke_diff_shows_what_a_recipe_removes(tmp_path: Path) -> None:
    bare = str(_recipe(tmp_path, "runtime:\n  remove: []\n", "bare.yaml"))
    report = compare(recipe_side(bare), recipe_side(str(_recipe(tmp_path, SLIMMED))))
    items = {r["item"]: r for r in report.extra["changes"] if r["section"] == "lock"}
    removed = [k for k in items if k.startswith("runtime.remove")]
    assert removed and all(items[k]["change"] == "added" for k in removed), items
    assert any(items[k]["b"] == REASON for k in removed)


def test_slim_venv_deletes_what_the_recipe_declares_and_its_record_lines(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    stamp = tmp_path / "step-began"
    stamp.touch()
    time.sleep(0.05)
    files = {
        "triton/backends/nvidia/lib/libcupti_static.a": 3_000_000,
        "triton/_C/libproton.a": 1_000_000,
        "triton/_C/libtriton.so": 500,
        "torch/share/cmake/Torch/TorchConfig.cmake": 2_000,
        "torch/share/cmake/Caffe2/Caffe2Config.cmake": 1_000,
        "torch/lib/libtorch.so": 700,
    }
    for rel, size in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))  # distinct bytes: nothing for the dedupe rule to join
    dist = site / "triton-3.0.0.dist-info"
    dist.mkdir()
    rows = [f"{rel},sha256=x,{size}" for rel, size in files.items() if rel.startswith("triton/")]
    (dist / "RECORD").write_text("\n".join([*rows, "triton-3.0.0.dist-info/RECORD,,"]) + "\n")
    proc = subprocess.run(
        [sys.executable, str(SLIM), "--site", str(site), "--since", str(stamp), "--cuda", "13.0",
         "--remove", "triton/**/*.a", "--remove", "torch/share/cmake", "--remove", "nothing/here"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    left = sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file())
    assert left == ["torch/lib/libtorch.so", "triton-3.0.0.dist-info/RECORD", "triton/_C/libtriton.so"]
    assert not (site / "torch" / "share" / "cmake").exists()  # the emptied folders go too
    assert (
        dist / "RECORD"
    ).read_text() == "triton/_C/libtriton.so,sha256=x,500\ntriton-3.0.0.dist-info/RECORD,,\n"
    assert "slim-venv: declared removal triton/**/*.a: 4.0 MB" in proc.stdout
    assert "slim-venv: declared removal torch/share/cmake: 0.0 MB" in proc.stdout
    assert (
        "slim-venv: declared removal nothing/here: 0.0 MB" in proc.stdout
    )  # said, even when it matched nothing
    assert "RECORD lines dropped for declared removals: 2" in proc.stdout


def test_slim_venv_leaves_a_lower_layers_files_alone(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    lower = site / "triton" / "old.a"
    lower.parent.mkdir(parents=True)
    lower.write_bytes(b"o" * 100)
    time.sleep(0.05)
    stamp = tmp_path / "step-began"
    stamp.touch()  # the step began after the lower layer's file was written
    proc = subprocess.run([sys.executable, str(SLIM), "--site", str(site), "--since", str(stamp), "--cuda", "13.0",
                           "--remove", "triton/*.a"], capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert lower.is_file()  # deleting it would only add a whiteout: the bytes stay in the lower layer


def test_verify_checks_the_budget(tmp_path: Path) -> None:
    slimmed = load_recipe(str(_recipe(tmp_path, SLIMMED))).model
    ok = size_check(7_900_000_000, slimmed.image, slimmed.runtime.remove)
    assert ok.status == "passed" and ok.reason == "7.90 GB, within image.max_size 8GB"
    over = size_check(9_070_000_000, slimmed.image, slimmed.runtime.remove)
    assert over.status == "failed"
    assert over.reason.startswith(
        "the image is 9.07 GB, over the recipe's image.max_size 8GB by 1.07 GB (2 declared"
    )
    assert "fix:" in over.reason and over.details["max_bytes"] == 8_000_000_000
    plain = load_recipe("vllm-qwen35-wheels").model
    none = size_check(9_070_000_000, plain.image, plain.runtime.remove)
    assert none.status == "skipped" and "no image.max_size" in none.reason
