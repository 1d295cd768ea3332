"""bench.compare on a real result file (benchmarks/results/real: vLLM's own client against the CPU twin)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkforge.errors import RunError
from sparkforge.run.bench import backends, summarize
from sparkforge.run.benchcompare import compare

REAL = Path(__file__).parents[2] / "benchmarks" / "results" / "real" / "bench-cpu-twin-1node.json"


def test_equal_runs_pass_and_a_slower_run_fails_naming_metric_and_differences(tmp_path: Path) -> None:
    assert compare(REAL, REAL, 10).status == "passed"
    doc = json.loads(REAL.read_text())
    doc["checks"][1]["details"]["itl_ms"]["p50"] *= 1.5
    doc["backends"] = {"moe": {"names": ["TRITON"], "lines": ["Using TRITON MoE backend"]}}
    slower = tmp_path / "slower.json"
    slower.write_text(json.dumps(doc))
    report = compare(REAL, slower, 10)
    failed = [c.name for c in report.failed]
    assert report.status == "failed" and failed == ["c2:itl_ms.p50"]
    assert "+50.0%" in report.failed[0].reason and "differs: backends" in report.failed[0].reason


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{", "not JSON"),
        ('{"command": "verify", "checks": []}', "not a bench result"),
        (
            '{"command": "bench", "model": "x", "checks": [{"name": "c", "details": {"concurrency": 1}}]}',
            "lacks bench figures",
        ),
    ],
)
def test_malformed_files_are_refused(tmp_path: Path, text: str, needle: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(RunError, match=needle):
        compare(REAL, bad, 10)


def test_other_models_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads(REAL.read_text()), "model": "another"}))
    with pytest.raises(RunError, match="same model"):
        compare(REAL, other, 10)


def test_summary_and_backends_from_vllm_shapes() -> None:
    result = {"completed": 2, "failed": 0, "output_throughput": 10.0, "output_lens": [4, 4], "ttfts": [0.1, 0.2],
              "itls": [[0.1, 0.1, 0.1], [0.1, 0.1, 0.1]], "p50_ttft_ms": 150.0, "p99_itl_ms": 100.0}  # fmt: skip
    figures = summarize(result)
    assert figures["ttft_ms"]["p50"] == 150.0 and figures["itl_ms"]["p99"] == 100.0
    assert figures["request_output_tok_s"]["p50"] == pytest.approx(9.0)  # median of 4/0.4 and 4/0.5
    log = "INFO Using FLASH_ATTN attention backend.\nINFO Using TRITON MoE backend\nINFO Using default backend X for vit attention"
    found = backends(log)
    assert found["attention"]["names"] == ["FLASH_ATTN"] and found["moe"]["names"] == ["TRITON"]
