"""`invoke bench --harness aiperf` for real: NVIDIA's AIPerf 0.13.0 against the served CPU twin, NVIDIA's
performance file written and read back by `invoke bench.baseline`.

No mock: the CPU twin image sparkforge built (the CI candidate tag, used as is, never removed) serves the committed
tiny trained Qwen3.5-MoE through vLLM's OpenAI server (tests/profiles/cpu-tiny-aiperf.yaml: its own profile name and
port 18495, so it never meets the other real tests' container and port); aiperf is installed from its pinned lock
into sparkforge's cache (once per machine: ~1 min, 1.2 GB) and run on this host against that port at small sizes
(prompt 128 / generate 32, concurrency 1 and 2, 4 requests, 2 repeats; depth 0 only: at depth 256 the twin
streamed 3 of 18 runs' responses as one chunk, which the reader refuses, see the unit tests); its exports are read into
the result, which records the harness and version, as does the performance file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import tiny_fixture
import yaml
from test_bench_real import TIMINGS, invoke  # the same `invoke` subprocess, timed

from sparkforge.recipe.loader import REPO_ROOT

pytestmark = [pytest.mark.engine]
IMAGE = "sparkforge-candidate/ci-cpu-twin:e34fec4f7f42-amd64"  # built by CI's core suite; never removed here
RECIPE = str(REPO_ROOT / "tests" / "recipes" / "ci-cpu-twin.yaml")
PROFILE = str(REPO_ROOT / "tests" / "profiles" / "cpu-tiny-aiperf.yaml")
PORT = "18495"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        pytest.skip(f"the CPU twin {IMAGE} is not on this engine (CI's core suite builds it)")
    stale = tiny_fixture.problems()
    if stale:
        pytest.skip("the committed tiny model is stale: " + "; ".join(stale))
    model = tmp_path_factory.mktemp("aiperf-model") / "tiny-qwen35moe"
    shutil.copytree(tiny_fixture.FIXTURE, model)
    cache = tmp_path_factory.mktemp("aiperf-serve-cache")
    code, out = invoke(
        "serve", "--recipe", RECIPE, "--profile", PROFILE, "--image", IMAGE, "--gpus", "none",
        "--model-dir", str(model), "--cache-dir", str(cache), "--port", PORT, "--ulimit", "nofile=16384",
    )  # fmt: skip
    try:
        assert code == 0, out[-3000:]
        assert "answer: 28 27 26 25 24 23 22 21 20 19 18 17 16 15 14 13\n" in out, out[-3000:]
        yield model
    finally:
        invoke("serve.down", "--profile", Path(PROFILE).stem)
        print(f"aiperf bench test timings (s): {TIMINGS}")


@pytest.mark.slow(
    cost_s=200,
    rank=30,
    reason="a served twin (60 s), aiperf installed once per machine (60 s), 6 aiperf runs and the baseline (73 s)",
)
def test_aiperf_measures_every_level_and_its_performance_file_reads_back(
    served: Path, tmp_path: Path
) -> None:
    result, perf = tmp_path / "aiperf.json", tmp_path / "performance.yaml"
    code, out = invoke(
        "bench", "--recipe", RECIPE, "--profile", PROFILE, "--harness", "aiperf", "--concurrency", "1,2",
        "--depth", "0", "--input-len", "128", "--output-len", "32", "--num-prompts", "4", "--repeats", "2",
        "--store", str(tmp_path / "store"), "--json", str(result), "--performance", str(perf),
    )  # fmt: skip
    assert code == 0, out[-4000:]
    assert "Traceback" not in out and f"aiperf 0.13.0 on this host -> 127.0.0.1:{PORT}" in out
    doc = json.loads(result.read_text())
    assert doc["suite"]["client"] == "aiperf" and doc["suite"]["params"]["client_version"] == "0.13.0"
    assert doc["suite"]["harness"] == {"name": "aiperf", "client": "aiperf", "version": "0.13.0"}
    assert [c["name"] for c in doc["checks"]] == ["c1-d0", "c2-d0"]
    for check in doc["checks"]:
        d = check["details"]
        assert check["status"] == "passed" and len(d["repeats"]) == 2 and len(d["seeds"]) == 2, check
        for metric in ("output_tok_s", "ttft_ms", "itl_ms"):
            s = d["summary"][metric]
            assert 0 < s["min"] <= s["median"] <= s["max"], (check["name"], metric, s)
    # aiperf's own exports: the pinned version, the exact token counts it sent and got (depth as a shared prefix)
    runs = Path(doc["stopping"]["artifacts"])
    for name, isl in (("c1-d0-r1", 128), ("c2-d0-r2", 128)):
        export = json.loads((runs / name / "profile_export_aiperf.json").read_text())
        assert export["aiperf_version"] == "0.13.0" and export["completed_request_count"]["avg"] == 4
        assert export["output_sequence_length"]["p50"] == 32 and export["input_sequence_length"]["p50"] == isl
    assert (runs / "c1-d0-warmup").is_dir()  # the warm-up round ran, and is not among the repeats
    # NVIDIA's performance file: the harness and version, one profile per level with the means of its repeats;
    # read back as a baseline, it matches
    written = yaml.safe_load(perf.read_text())
    assert written["harness"] == {"name": "aiperf", "version": "0.13.0"}
    repeats = doc["checks"][0]["details"]["repeats"]
    mean = sum(r["output_tok_s"] for r in repeats) / len(repeats)
    assert written["profiles"][0]["results"]["decode_tokens_per_second_mean"] == round(mean, 3)
    code, out = invoke("bench.baseline", str(result), "--performance", str(perf))
    assert code == 0 and "same harness (aiperf) and token lengths" in out, out[-3000:]
