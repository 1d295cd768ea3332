"""NVIDIA's performance file from the committed real CPU-twin bench results: written, read back strictly, and used
as a baseline (comparable runs per level; another harness or dataset refused unless allowed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from sparkforge.errors import RecipeError
from sparkforge.run.bench.nvperf import compare_with_baseline, read_performance, write_performance
from sparkforge.run.bench.results import load_result

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "real"
DEFAULT = RESULTS / "bench-cpu-twin-default.json"  # vLLM's own client
ARENA = RESULTS / "bench-cpu-twin-spark-arena-v2.json"  # llama-benchy


def test_written_from_a_real_result_with_every_identity_field_and_read_back(tmp_path: Path) -> None:
    result = load_result(DEFAULT)
    path = write_performance(result, tmp_path / "perf.yaml", "ci-cpu-twin")
    perf = read_performance(path)
    ident = result["identity"]
    assert perf.recipe.id == "ci-cpu-twin" and perf.recipe.sha256 == ident["recipe_hash"]
    assert perf.image.digest == ident["image"]["id"] and perf.model.revision == ident["model"]["revision"]
    assert (perf.benchmark.harness, perf.benchmark.harness_version) == ("vllm bench serve", ident["vllm"])
    params = result["suite"]["params"]
    assert (perf.benchmark.dataset.input_tokens, perf.benchmark.dataset.output_tokens) == (
        params["input_len"],
        params["output_len"],
    )
    first = next(c for c in result["checks"] if c["status"] == "passed")
    row = next(
        r
        for r in perf.results
        if r.concurrency == first["details"]["concurrency"] and r.context_depth == first["details"]["depth"]
    )
    assert row.output_token_throughput_tok_s == pytest.approx(
        first["details"]["summary"]["output_tok_s"]["median"], abs=1e-3
    )
    arena = read_performance(write_performance(load_result(ARENA), tmp_path / "arena.yaml", "ci-cpu-twin"))
    assert arena.benchmark.harness == "llama-benchy" and arena.benchmark.harness_version != ident["vllm"]


def test_the_same_run_matches_its_own_file_and_a_published_figure_20pct_better_fails(tmp_path: Path) -> None:
    result = load_result(DEFAULT)
    path = write_performance(result, tmp_path / "perf.yaml", "ci-cpu-twin")
    same = compare_with_baseline(result, read_performance(path))
    assert same.status == "passed" and len(same.checks) == 1 + len(result["checks"])
    assert all(
        f["change_pct"] == pytest.approx(0, abs=0.01) for c in same.checks[1:] for f in c.details.values()
    )
    doc = yaml.safe_load(path.read_text())
    doc["results"][0]["output_token_throughput_tok_s"] *= 1.2  # NVIDIA published more tokens/s at that level
    path.write_text(yaml.safe_dump(doc))
    worse = compare_with_baseline(result, read_performance(path), threshold_pct=10)
    failed = [c.name for c in worse.failed]
    assert failed == [f"c{doc['results'][0]['concurrency']}-d{doc['results'][0]['context_depth']}"]
    assert "output_tok_s" in worse.failed[0].reason and "-16.7%" in worse.failed[0].reason


def test_another_harness_or_dataset_is_not_compared_unless_allowed(tmp_path: Path) -> None:
    published = read_performance(
        write_performance(load_result(ARENA), tmp_path / "arena.yaml", "ci-cpu-twin")
    )
    ours = load_result(DEFAULT)
    refused = compare_with_baseline(ours, published)
    assert [c.name for c in refused.checks] == ["comparable"] and refused.status == "failed"
    assert (
        "harness vllm bench serve" in refused.checks[0].reason and "llama-benchy" in refused.checks[0].reason
    )
    allowed = compare_with_baseline(ours, published, allow_different=True)
    assert allowed.checks[0].status == "passed" and allowed.extra["differences"]


def test_an_unknown_key_is_refused_with_its_line(tmp_path: Path) -> None:
    path = write_performance(load_result(DEFAULT), tmp_path / "perf.yaml", "ci-cpu-twin")
    doc = yaml.safe_load(path.read_text())
    doc["results"][0]["tokens_per_watt"] = 3.0
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(RecipeError, match=r"perf.yaml:\d+: results.0.tokens_per_watt"):
        read_performance(path)


def test_a_result_with_no_passed_level_writes_nothing(tmp_path: Path) -> None:
    from sparkforge.errors import RunError

    result = copy.deepcopy(json.loads(DEFAULT.read_text()))
    for check in result["checks"]:
        check["status"] = "failed"
    with pytest.raises(RunError, match="no passed level"):
        write_performance(result, tmp_path / "p.yaml", "x")
    assert not (tmp_path / "p.yaml").exists()
