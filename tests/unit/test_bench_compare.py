"""bench.compare on real results (benchmarks/results/real: both suites against the CPU twin): the interval rule
(interval.py) on real files, failed and missing levels, identities that differ, and the committed results staying
readable. The rule's statistics on their own: test_bench_interval.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sparkforge.errors import RunError
from sparkforge.run.bench import figures
from sparkforge.run.bench.compare import RULE, compare, pool, verdict_line
from sparkforge.run.bench.interval import estimate
from sparkforge.run.bench.results import load_result

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "real"
DEFAULT = RESULTS / "bench-cpu-twin-default.json"
STUDY_RULE = (
    "regressed = even the best new repeat is worse than the worst old repeat by more than the threshold: the "
    "change exceeds the measured noise and, beyond it, the threshold (noise.py)"
)
ARENA = RESULTS / "bench-cpu-twin-spark-arena-v2.json"


def _write(tmp_path: Path, name: str, doc: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _scaled(doc: dict, level: str, metric: str, factor: float) -> dict:
    out = copy.deepcopy(doc)
    check = next(c for c in out["checks"] if c["name"] == level)
    for repeat in check["details"]["repeats"]:
        repeat[metric] *= factor
    return out


@pytest.mark.parametrize("path", [DEFAULT, ARENA], ids=["default", "spark-arena-v2"])
def test_committed_results_are_readable_by_this_code_and_equal_runs_pass(path: Path) -> None:
    doc = load_result(path)
    assert doc["schema"] == 2 and doc["status"] == "passed" and len(doc["checks"]) == 4
    report = compare(path, path, 10)
    assert report.status == "passed" and report.extra["differences"] == {}
    assert {c.name.split(":")[0] for c in report.checks} == {"c1-d0", "c2-d0", "c1-d512", "c2-d512"}


@pytest.mark.parametrize(
    "path",
    [*sorted(RESULTS.glob("bench-*.json")), *sorted((RESULTS.parent / "bench_noise").glob("*/*.json"))],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_every_committed_bench_file_is_read_by_this_code_and_was_written_by_it(path: Path) -> None:
    doc = json.loads(path.read_text())
    if path.name.startswith("bench-raw-vllm"):  # vLLM's client's own file, as it wrote it
        assert figures.vllm_repeat(path.name, doc)[1] > 0
    elif path.name.startswith("bench-raw-llama-benchy"):  # llama-benchy's own file: one round (--runs 1)
        assert len(figures.benchy_levels(path.name, doc, 1)) == 4
    elif doc.get("command") == "bench.compare" and path.parent.name in ("final", "quiet"):
        # the live study's run-time verdicts, kept as written by the rule of their day (bench-noise.md); the
        # current rule's verdicts on the same files: benchmarks/bench_noise_replay.py
        assert doc["rule"] == STUDY_RULE and doc["checks"]
    elif doc.get("command") == "bench.compare":
        assert doc["rule"] == RULE and doc["verdict"] in ("regressed", "inconclusive", "passed")
    else:  # a result of the current runner: interleaved rounds, read by the current reader
        assert load_result(path)["suite"]["params"]["order"] == "interleaved rounds"


def test_a_slowdown_whose_whole_interval_is_beyond_the_threshold_fails_naming_level_and_metric(
    tmp_path: Path,
) -> None:
    doc = json.loads(DEFAULT.read_text())
    slower = _write(tmp_path, "slower.json", _scaled(doc, "c2-d0", "output_tok_s", 0.5))
    report = compare(DEFAULT, slower, 10)
    assert [c.name for c in report.failed] == ["c2-d0:output_tok_s"]
    failed = report.failed[0]
    assert failed.reason.startswith("regressed: ratio 0.500 [") and "could detect >= " in failed.reason
    assert failed.details["high"] < 0.9 and failed.details["n_old"] == failed.details["n_new"] == 3
    assert report.extra["verdict"] == "regressed" and verdict_line(report).startswith(
        "verdict: REGRESSED: 1 "
    )


def test_the_same_file_is_never_regressed_and_a_noisy_level_says_inconclusive_not_passed() -> None:
    report = compare(DEFAULT, DEFAULT, 10)
    assert not report.failed and report.extra["verdict"] in ("inconclusive", "passed")
    for check in report.checks:
        d = check.details
        assert d["ratio"] == pytest.approx(1.0) and d["low"] < 1 < d["high"] and d["mde_pct"] > 10
        # passed only when the whole interval is within 10 %; otherwise the check says it could not tell
        within = d["low"] >= 0.9 if check.name.endswith("tok_s") else d["high"] <= 1.1
        assert (check.status, d["verdict"]) == (
            ("passed", "passed") if within else ("skipped", "inconclusive")
        )
    if report.extra["verdict"] == "inconclusive":
        assert "could not tell" in verdict_line(report) and "PASSED" not in verdict_line(report)


def test_the_verdict_reads_the_interval_against_the_threshold_in_each_metrics_direction() -> None:
    # throughput 10 % lower with a tight spread: the interval is around 0.9, straddling the 10 % limit
    old, tight = [100.0, 101.0, 99.0, 100.5, 99.5], [90.0, 90.5, 89.5, 90.2, 89.8]
    assert estimate(old, tight, True, 10).verdict == "inconclusive"
    assert estimate(old, [x * 0.8 for x in tight], True, 10).verdict == "regressed"
    assert estimate(old, [x * 1.1 for x in tight], True, 10).verdict == "passed"  # 1 % lower: within
    # latency: higher is worse; the same numbers read the other way
    assert estimate(old, [x * 1.3 for x in old], False, 10).verdict == "regressed"
    assert estimate(old, [x * 0.7 for x in old], False, 10).verdict == "passed"
    assert estimate([10.0], [20.0], False, 10).verdict == "inconclusive"  # one repeat a side: no interval


def test_several_old_results_of_one_image_are_pooled_as_one_baseline(tmp_path: Path) -> None:
    doc = json.loads(DEFAULT.read_text())
    slower = _scaled(doc, "c2-d0", "output_tok_s", 0.5)  # another bench of the same image, slower at c2-d0
    a, b = _write(tmp_path, "a.json", doc), _write(tmp_path, "b.json", slower)
    # the pooled baseline holds b's repeats: its interval spans b, not regressed
    report = compare([a, b], b, 10)
    assert report.status == "passed" and report.subject == f"{a}+{b} -> {b}"
    assert next(c for c in report.checks if c.name == "c2-d0:output_tok_s").details["n_old"] == 6
    assert compare([a], b, 10).status == "failed"  # against a alone, c2-d0 regressed
    pooled = pool([("a", doc), ("b", slower)])
    check = next(c for c in pooled["checks"] if c["name"] == "c2-d0")
    assert len(check["details"]["repeats"]) == 2 * len(doc["checks"][0]["details"]["repeats"])
    other = copy.deepcopy(doc)
    other["identity"]["image"]["id"] = "sha256:" + "0" * 64
    with pytest.raises(RunError, match="pooled as one baseline but were not measured alike \\(image\\)"):
        pool([("a", doc), ("other", other)])
    failed = copy.deepcopy(doc)
    failed["checks"][0].update(status="failed", reason="2 of 4 requests failed")
    assert pool([("a", doc), ("f", failed)])["checks"][0]["status"] == "failed"


def test_a_failed_or_missing_level_in_either_file_fails(tmp_path: Path) -> None:
    doc = json.loads(DEFAULT.read_text())
    failed = copy.deepcopy(doc)
    failed["checks"][1].update(status="failed", reason="2 of 4 requests failed")
    failed["status"] = "failed"
    missing = copy.deepcopy(doc)
    del missing["checks"][3]
    path_failed = _write(tmp_path, "failed.json", failed)
    path_missing = _write(tmp_path, "missing.json", missing)
    report = compare(path_failed, DEFAULT, 10)
    assert [c.name for c in report.failed] == ["c2-d0"] and "2 of 4 requests failed" in report.failed[
        0
    ].reason
    report = compare(DEFAULT, path_missing, 10)
    assert [c.name for c in report.failed] == ["c2-d512"] and "missing in" in report.failed[0].reason


def test_different_hardware_or_serve_command_is_refused_unless_allowed_and_then_listed(
    tmp_path: Path,
) -> None:
    doc = json.loads(DEFAULT.read_text())
    other = copy.deepcopy(doc)
    other["identity"]["hardware"]["cpus"] = 64
    argv = other["identity"]["serve"]["argv"]
    argv[argv.index("--max-num-seqs") + 1] = "1"
    path = _write(tmp_path, "other.json", other)
    with pytest.raises(RunError, match=r"not measured alike \(hardware: .*serve argv: .*--allow-different"):
        compare(DEFAULT, path, 10)
    report = compare(DEFAULT, path, 10, allow_different=True)
    assert (
        set(report.extra["allowed_differences"]) == {"hardware", "serve argv"} and report.status == "passed"
    )


def test_image_and_vllm_differences_are_what_compare_is_for_and_are_shown(tmp_path: Path) -> None:
    doc = json.loads(DEFAULT.read_text())
    newer = copy.deepcopy(doc)
    newer["identity"]["vllm"], newer["identity"]["image"]["id"] = "0.33.0", "sha256:" + "b" * 64
    report = compare(DEFAULT, _write(tmp_path, "newer.json", newer), 10)
    assert set(report.extra["differences"]) == {"vllm", "image"} and report.status == "passed"


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda d: d.update(model="another"), "different models measure different things"),
        (lambda d: d["suite"].update(name="quick"), "different suites measure different things"),
    ],
)
def test_other_models_and_suites_are_refused_even_when_allowed(tmp_path: Path, change, needle: str) -> None:
    doc = json.loads(DEFAULT.read_text())
    change(doc)
    with pytest.raises(RunError, match=needle):
        compare(DEFAULT, _write(tmp_path, "other.json", doc), 10, allow_different=True)
