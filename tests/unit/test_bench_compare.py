"""bench.compare on real results (benchmarks/results/real: both suites against the CPU twin): the noise rule,
failed and missing levels, identities that differ, and the committed results staying readable."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sparkforge.errors import RunError
from sparkforge.run.bench import figures
from sparkforge.run.bench.compare import RULE, compare, pool
from sparkforge.run.bench.noise import Spread, judge
from sparkforge.run.bench.results import load_result

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "real"
DEFAULT = RESULTS / "bench-cpu-twin-default.json"
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
    elif doc.get("command") == "bench.compare":
        assert doc["rule"] == RULE and doc["checks"]  # the current rule wrote it
    else:  # a result of the current runner: interleaved rounds, read by the current reader
        assert load_result(path)["suite"]["params"]["order"] == "interleaved rounds"


def test_a_slowdown_beyond_threshold_and_noise_fails_naming_the_level_and_metric(tmp_path: Path) -> None:
    doc = json.loads(DEFAULT.read_text())
    slower = _write(tmp_path, "slower.json", _scaled(doc, "c2-d0", "output_tok_s", 0.5))
    report = compare(DEFAULT, slower, 10)
    assert [c.name for c in report.failed] == ["c2-d0:output_tok_s"]
    assert "-50.0%" in report.failed[0].reason and "outside the old repeats' range" in report.failed[0].reason


def test_a_change_within_the_repeats_noise_passes_even_beyond_the_threshold() -> None:
    old, new = Spread.of([100.0, 70.0]), Spread.of([80.0, 72.0])  # median -11.8 %, but 80 is inside 70..100
    verdict = judge(old, new, True, 10)
    assert verdict.beyond_threshold and not verdict.beyond_noise and not verdict.regressed
    assert judge(Spread.of([100.0, 98.0]), Spread.of([80.0, 79.0]), True, 10).regressed
    assert judge(Spread.of([10.0, 11.0]), Spread.of([13.0, 14.0]), False, 10).regressed  # latency rose
    assert not judge(
        Spread.of([10.0, 10.2]), Spread.of([10.9, 11.5]), False, 10
    ).regressed  # best +9.0 %: within


def test_the_rule_asks_the_best_new_repeat_to_be_beyond_the_worst_old_one_by_the_threshold() -> None:
    # two of three new repeats slowed by something outside (one-sided noise), the least-disturbed one as before:
    # the median fell 39 % and every new repeat is below every old one, but only by 1 %: not a regression
    old, new = Spread.of([100.0, 99.0, 98.0]), Spread.of([97.0, 60.0, 55.0])
    verdict = judge(old, new, True, 10)
    assert verdict.beyond_noise and round(verdict.change_pct) == -39 and round(verdict.gap_pct) == 1
    assert (
        not verdict.regressed
        and "ranges are apart [98..100] -> [55..97] but only by 1.0%" in verdict.reason(old, new, 10)
    )
    # a real slowdown moves every repeat, the best included: 85 is 13 % below the worst old repeat
    verdict = judge(old, Spread.of([85.0, 60.0, 55.0]), True, 10)
    assert verdict.regressed and round(verdict.gap_pct, 1) == 13.3
    # latency: the best is the lowest; 11.4 is 3.6 % above the worst old 11.0: within the noise and the threshold
    verdict = judge(Spread.of([10.0, 11.0]), Spread.of([11.4, 11.5]), False, 10)
    assert verdict.beyond_noise and verdict.beyond_threshold and not verdict.regressed
    assert judge(Spread.of([10.0, 11.0]), Spread.of([12.2, 12.5]), False, 10).regressed  # +10.9 % beyond 11.0


def test_several_old_results_of_one_image_are_pooled_as_one_baseline(tmp_path: Path) -> None:
    doc = json.loads(DEFAULT.read_text())
    slower = _scaled(doc, "c2-d0", "output_tok_s", 0.5)  # another bench of the same image, slower at c2-d0
    a, b = _write(tmp_path, "a.json", doc), _write(tmp_path, "b.json", slower)
    report = compare([a, b], b, 10)  # the union of both ranges holds b's repeats: nothing regressed
    assert report.status == "passed" and report.subject == f"{a}+{b} -> {b}"
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
