"""Faults planted INSIDE the real vLLM, each caught by the right `invoke conform` row (never a mock of vLLM).

One server start: the trained tiny model served by the twin plus one layer holding tests/engine/planted_faults.py
(a derived image, built here in seconds), vLLM's own `--logits-processors` loading it (greedy decodes corrupted from token 40 on; sampled requests ignoring their seed) and prefix
caching switched off by its flag. determinism catches the seed, long-decode and golden the corruption (naming
token 40 and both continuations), prefix-cache the silent 0 %.
"""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from cluster import DOCKER, sh
from conform_fixtures import clean_conform, conform, launch_args  # noqa: F401
from real_fixtures import REAL_TIMINGS, TINY_PROFILE, cpu_twin, tiny_model  # noqa: F401

pytestmark = pytest.mark.engine
FAULTS = Path(__file__).with_name("planted_faults.py")
FAULTY = "sparkforge-run-test/cpu-twin:planted-faults"
SITE = "/opt/venv/lib/python3.11/site-packages"


def test_planted_faults_are_each_caught_by_their_check(
    cpu_twin: str, tiny_model: Path, clean_conform: tuple[dict, Path], tmp_path: Path
) -> None:
    _, golden = clean_conform
    context = tmp_path / "faulty-image"
    context.mkdir()
    shutil.copy(FAULTS, context / "sparkforge_faults.py")
    (context / "Dockerfile").write_text(
        f"FROM {cpu_twin}\nCOPY sparkforge_faults.py {SITE}/sparkforge_faults.py\n"
    )
    sh(DOCKER, "build", "--quiet", "--tag", FAULTY, str(context), timeout=600)
    try:
        _faults_caught(tiny_model, golden, tmp_path)
    finally:
        sh(DOCKER, "rmi", FAULTY, check=False)


def _faults_caught(tiny_model: Path, golden: Path, tmp_path: Path) -> None:
    doc = yaml.safe_load(Path(TINY_PROFILE).read_text())
    doc["args"]["logits-processors"] = [
        "sparkforge_faults:CorruptAfter",
        "sparkforge_faults:UnseededSampling",
    ]
    doc["args"]["enable-prefix-caching"] = False
    profile = tmp_path / "cpu-tiny-faulty.yaml"
    profile.write_text(yaml.safe_dump(doc, sort_keys=False))
    report = tmp_path / "faults.json"
    code, out, seconds = conform(
        str(profile), *launch_args(FAULTY, tiny_model, tmp_path / "cache"),
        "--checks", "determinism,prefix-cache,long-decode,golden", "--golden", str(golden), "--json", str(report),
    )  # fmt: skip
    REAL_TIMINGS["conform_faults_s"] = round(seconds, 1)
    assert code == 1 and "conform failed (determinism, prefix-cache, long-decode, golden)" in out, out[-5000:]
    rows = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    # The seed fault: greedy runs agree, seeded sampling does not.
    assert rows["determinism"]["status"] == "failed" and "seed 1234 run 1" in rows["determinism"]["reason"]
    # The corruption from token 40: the long decode's first wrong token, and the golden's first divergence.
    assert "not-the-answer at token 40" in rows["long-decode"]["reason"], rows["long-decode"]["reason"]
    assert rows["long-decode"]["details"]["right"] == 40
    assert rows["golden"]["details"]["position"] == 40 and "diverges at token 40" in rows["golden"]["reason"]
    assert "'user" in rows["golden"]["reason"]  # this run's continuation, detokenized by vLLM
    # The flag: no prefix-cache query at all.
    assert (
        rows["prefix-cache"]["status"] == "failed"
        and "no prefix-cache queries" in rows["prefix-cache"]["reason"]
    )
