"""NVIDIA's performance file from the committed real CPU-twin bench results: written, read back strictly, and used
as a baseline (comparable runs per concurrency; another harness or token lengths refused unless allowed); our own
sample in the catalog's shape (tests/unit/fixtures/nvidia/performance.yaml) read and compared."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from sparkforge.errors import RecipeError, RunError
from sparkforge.run.bench.nvperf import compare_with_baseline, read_performance, write_performance
from sparkforge.run.bench.results import load_result

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "real"
DEFAULT = RESULTS / "bench-cpu-twin-default.json"  # vLLM's own client
ARENA = RESULTS / "bench-cpu-twin-spark-arena-v2.json"  # llama-benchy (records prefill tokens/s)
SAMPLE = Path(__file__).parent / "fixtures" / "nvidia" / "performance.yaml"


def test_written_from_a_real_result_one_profile_per_level_and_read_back(tmp_path: Path) -> None:
    result = load_result(DEFAULT)
    perf = read_performance(write_performance(result, tmp_path / "performance.yaml"))
    ident = result["identity"]
    assert perf.recipe_sha256 == ident["recipe_hash"]  # no recipe.yaml beside it: sparkforge's recipe hash
    assert perf.software.runtime_revision == ident["image"]["id"]
    assert perf.software.model_revision == ident["model"]["revision"]
    assert (perf.harness.name, perf.harness.version) == ("vllm bench serve", ident["vllm"])
    assert str(perf.measured_at) == ident["date"][:10]
    passed = [c for c in result["checks"] if c["status"] == "passed"]
    assert len(perf.profiles) == len(passed)
    first = passed[0]
    profile = next(
        p
        for p in perf.profiles
        if (p.workload.concurrency, p.workload.context_tokens)
        == (first["details"]["concurrency"], first["details"]["depth"])
    )
    runs = first["details"]["repeats"]
    assert profile.results.decode_tokens_per_second_mean == pytest.approx(
        sum(r["output_tok_s"] for r in runs) / len(runs), abs=1e-3
    )
    out = result["suite"]["params"]["output_len"]
    assert profile.results.e2e_latency_ms_mean == pytest.approx(
        sum(r["ttft_ms"] + (out - 1) * r["itl_ms"] for r in runs) / len(runs), abs=1e-3
    )
    arena = read_performance(write_performance(load_result(ARENA), tmp_path / "arena" / "performance.yaml"))
    arena_runs = load_result(ARENA)["checks"][0]["details"]["repeats"]
    assert arena.harness.name == "llama-benchy" and arena.profiles[0].results.e2e_latency_ms_mean is None
    assert arena.profiles[0].results.prefill_tokens_per_second_mean == pytest.approx(
        sum(r["prefill_tok_s"] for r in arena_runs) / len(arena_runs), abs=1e-3
    )


def test_recipe_sha256_is_the_sibling_recipe_files_hash(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((SAMPLE.parent / "v3-qwen35-35b-spark.recipe.yaml").read_text())
    perf = read_performance(write_performance(load_result(DEFAULT), tmp_path / "performance.yaml"))
    assert perf.recipe_sha256 == hashlib.sha256(recipe.read_bytes()).hexdigest()


def test_the_same_run_matches_its_own_file_and_a_published_figure_20pct_better_fails(tmp_path: Path) -> None:
    result = load_result(DEFAULT)
    path = write_performance(result, tmp_path / "performance.yaml")
    same = compare_with_baseline(result, read_performance(path))
    assert same.status == "passed" and len(same.checks) == 1 + len(result["checks"])
    assert all(
        f["change_pct"] == pytest.approx(0, abs=0.01) for c in same.checks[1:] for f in c.details.values()
    )
    doc = yaml.safe_load(path.read_text())
    doc["profiles"][0]["results"]["decode_tokens_per_second_mean"] *= 1.2  # NVIDIA published more tokens/s
    path.write_text(yaml.safe_dump(doc))
    worse = compare_with_baseline(result, read_performance(path), threshold_pct=10)
    assert [c.name.split(" ")[0] for c in worse.failed] == [doc["profiles"][0]["id"]]
    assert "decode_tokens_per_second_mean" in worse.failed[0].reason and "-16.7%" in worse.failed[0].reason


def test_the_catalog_sample_is_read_and_compared_per_concurrency() -> None:
    sample = read_performance(SAMPLE)
    assert sample.harness.name == "aiperf" and [p.workload.concurrency for p in sample.profiles] == [1, 2, 1]
    ours = load_result(DEFAULT)
    refused = compare_with_baseline(ours, sample)
    assert [c.name for c in refused.checks] == ["comparable"] and refused.status == "failed"
    assert (
        "harness vllm bench serve" in refused.checks[0].reason and "aiperf 0.12.0" in refused.checks[0].reason
    )
    allowed = compare_with_baseline(ours, sample, allow_different=True, threshold_pct=10)
    by_id = {c.name.split(" ")[0]: c for c in allowed.checks[1:]}
    assert by_id["long-c1"].status == "skipped"  # 8192 prompt tokens: context 0 at c1 is short-c1's level
    # CPU twin c1 decodes ~150 tok/s vs 150 published; c2 ~1000 published is far above it: failed.
    assert (
        by_id["short-c2"].status == "failed" and "decode_tokens_per_second_mean" in by_id["short-c2"].reason
    )
    assert set(by_id["short-c1"].details) == {
        "prefill_tokens_per_second_mean",
        "decode_tokens_per_second_mean",
        "e2e_latency_ms_mean",
    }


def test_an_unknown_key_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "performance.yaml"
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["profiles"][0]["results"]["tokens_per_watt"] = 3.0
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(RecipeError, match=r"performance.yaml:\d+: profiles.0.results.tokens_per_watt"):
        read_performance(path)


def test_a_result_with_no_passed_level_writes_nothing(tmp_path: Path) -> None:
    result = copy.deepcopy(json.loads(DEFAULT.read_text()))
    for check in result["checks"]:
        check["status"] = "failed"
    with pytest.raises(RunError, match="no passed level"):
        write_performance(result, tmp_path / "p.yaml")
    assert not (tmp_path / "p.yaml").exists()
