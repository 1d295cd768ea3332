"""bench --baseline OLD --image NEW: the two-image schedule (interleaved A B A B by default, blocks with
--no-interleave), what the results and the comparison record, the refusals, `bench --dry` printing the schedule,
and the comparison of both sides' pooled benches on real results (benchmarks/results/real). No engine: the
executor's serving is tests/engine/test_bench_real.py's."""

from __future__ import annotations

import copy
import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from sparkforge.errors import InputError
from sparkforge.run.bench.compare import pool
from sparkforge.run.bench.interval import Drift, estimate
from sparkforge.run.bench.pairing import ROLES, missing_images, plan_pairs
from sparkforge.run.bench.pairrun import compare_pairs
from sparkforge.run.bench.results import load_result

ROOT = Path(__file__).parents[2]
DEFAULT = ROOT / "benchmarks" / "results" / "real" / "bench-cpu-twin-default.json"


@pytest.mark.parametrize("benches", [1, 2, 3, 5])
def test_interleaved_by_default_alternates_and_blocks_keep_each_image_together(benches: int) -> None:
    mixed = plan_pairs("old:1", "new:2", benches)
    blocks = plan_pairs("old:1", "new:2", benches, interleave=False)
    assert mixed.interleave and mixed.order() == "AB" * benches
    assert blocks.order() == "A" * benches + "B" * benches
    for plan in (mixed, blocks):
        slots = plan.schedule()
        assert [s.position for s in slots] == list(range(1, 2 * benches + 1))
        for role, image in zip(ROLES, ("old:1", "new:2"), strict=True):
            mine = [s for s in slots if s.role == role]
            assert {s.image for s in mine} == {image} and [s.round for s in mine] == list(
                range(1, benches + 1)
            )

    # A drift that grows with time: interleaved, the two sides' mean positions differ by one bench (whatever the
    # count), in blocks by `benches` (the drift then reads as a change of the image).
    def lag(plan) -> float:
        at = {r: statistics.fmean(s.position for s in plan.schedule() if s.role == r) for r in ROLES}
        return at["candidate"] - at["baseline"]

    assert lag(mixed) == 1 and lag(blocks) == benches


def test_the_record_and_the_dry_lines_name_the_order() -> None:
    plan = plan_pairs("old:1", "new:2", 2)
    assert plan.record() == {
        "baseline": "old:1", "candidate": "new:2", "benches_each": 2, "interleaved": True, "order": "ABAB",
    }  # fmt: skip
    lines = plan.lines()
    assert "interleaved: order ABAB" in lines[0] and "one server at a time" in lines[0]
    assert [line.split()[2] for line in lines[1:]] == ["baseline", "candidate", "baseline", "candidate"]
    assert "in blocks (--no-interleave): order AABB" in plan_pairs("a", "b", 2, interleave=False).lines()[0]


def test_refused_one_image_twice_no_bench_or_an_image_not_local() -> None:
    with pytest.raises(InputError, match="is also the --image"):
        plan_pairs("same:1", "same:1", 3)
    with pytest.raises(InputError, match="at least 1"):
        plan_pairs("a", "b", 0)
    assert missing_images({"a": True, "b": True}) == ""
    said = missing_images({"a": True, "b": False})
    assert said.startswith("bench: b not on this engine") and "invoke pull" in said and "fix:" in said


def test_one_new_bench_given_as_benches_is_the_one_bench_interval() -> None:
    old, new = [100.0, 98.0, 103.0, 90.0, 92.0, 91.0], [97.0, 99.0, 95.0]
    one = estimate(old, new, True, 10, old_benches=[3, 3])
    assert estimate(old, new, True, 10, old_benches=[3, 3], new_benches=[3]) == one
    # Two candidate benches: the new mean is the mean of the benches' means, and the drift counts 1/2 a side.
    drift = Drift(0.002, 10.0, 6, "store")
    two = estimate(
        old, [97.0, 99.0, 80.0, 82.0, 81.0], True, 10, old_benches=[3, 3], new_benches=[2, 3], drift=drift
    )
    assert two.ratio == pytest.approx(
        statistics.geometric_mean(
            [statistics.geometric_mean([97, 99]), statistics.geometric_mean([80, 82, 81])]
        )
        / statistics.geometric_mean([statistics.geometric_mean(old[:3]), statistics.geometric_mean(old[3:])])
    )


def _bench(doc: dict, image: str, factor: float, position: int) -> tuple[str, dict]:
    out = copy.deepcopy(doc)
    out["identity"]["image"]["id"] = image
    for check in out["checks"]:
        for repeat in check["details"]["repeats"]:
            repeat["output_tok_s"] *= factor
    return f"bench-{position}.json", out


def test_the_comparison_pools_each_side_as_benches_and_records_the_order(tmp_path: Path) -> None:
    doc = load_result(DEFAULT)
    plan = plan_pairs("old:1", "new:2", 2)
    equal = {
        "baseline": [_bench(doc, "sha256:a", 1.0, 1), _bench(doc, "sha256:a", 1.01, 3)],
        "candidate": [_bench(doc, "sha256:b", 1.0, 2), _bench(doc, "sha256:b", 0.99, 4)],
    }
    report = compare_pairs(plan, equal, 10, str(tmp_path / "store"))
    assert report.extra["verdict"] != "regressed" and report.extra["pairing"]["order"] == "ABAB"
    assert report.extra["pairing"]["results"]["candidate"] == ["bench-2.json", "bench-4.json"]
    throughput = next(c for c in report.checks if c.name.endswith(":output_tok_s"))
    repeats = len(doc["checks"][0]["details"]["repeats"])
    assert throughput.details["n_new"] == 2 * repeats and throughput.details["benches_old"] == 2
    slower = {**equal, "candidate": [_bench(doc, "sha256:b", 0.5, 2), _bench(doc, "sha256:b", 0.5, 4)]}
    report = compare_pairs(plan, slower, 10, str(tmp_path / "store"))
    assert report.extra["verdict"] == "regressed"
    assert {c.name.split(":")[1] for c in report.failed} == {"output_tok_s"}
    assert pool(slower["candidate"])["checks"][0]["details"]["bench_sizes"] == [repeats, repeats]


def _invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "invoke", "bench", "--dry", "--recipe", "tests/recipes/ci-cpu-twin.yaml",
         "--profile", "tests/profiles/cpu-tiny-qwen35moe-bench.yaml", "--no-preflight",
         "--model-dir", str(ROOT / "tests" / "fixtures" / "tiny-qwen35moe"), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_bench_dry_prints_the_interleaved_schedule_and_blocks_on_request() -> None:
    both = (
        "--baseline",
        "sparkforge/ci-cpu-twin:old",
        "--image",
        "sparkforge/ci-cpu-twin:new",
        "--benches",
        "2",
    )
    run = _invoke(*both)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout + run.stderr
    assert "would serve cpu-tiny-qwen35moe-bench" in out and "interleaved: order ABAB" in out
    assert (
        "1. A baseline sparkforge/ci-cpu-twin:old" in out
        and "4. B candidate sparkforge/ci-cpu-twin:new" in out
    )
    blocks = _invoke(*both, "--no-interleave")
    assert blocks.returncode == 0 and "order AABB" in blocks.stdout + blocks.stderr
    alone = _invoke("--no-interleave")
    assert alone.returncode == 1 and "--no-interleave orders the benches of two images" in alone.stderr
    # A flag that only shapes a server bench would start is refused without --baseline, not ignored.
    idle = _invoke("--gpus", "none", "--weights", "skip")
    assert idle.returncode == 1 and "--gpus, --weights shape(s) a server bench starts" in idle.stderr
    assert _invoke("--baseline", "x:1", "--image", "x:2", "--gpus", "none").returncode == 0
    no_new = _invoke("--baseline", "sparkforge/ci-cpu-twin:old")
    assert no_new.returncode == 1 and "fix: add --image NEW" in no_new.stderr
    same = _invoke("--baseline", "x:1", "--image", "x:1")
    assert same.returncode == 1 and "is also the --image" in same.stderr


def _order_sim():
    spec = importlib.util.spec_from_file_location(
        "bench_order_sim", ROOT / "benchmarks" / "bench_order_sim.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_interleaving_cancels_a_trend_that_blocks_read_as_a_change_of_the_image() -> None:
    # benchmarks/bench_order_sim.py (bench-drift.md, "Two images in turn"), fewer draws, a fixed seed.
    sim = _order_sim()
    slowing = sim.order_rates(7, 300, 0.5, 4.0, 0.0)  # the machine 4 % slower per bench, no change
    assert slowing["ratio_interleaved"] == pytest.approx(0.96, abs=0.01)  # one bench apart
    assert slowing["ratio_blocks"] == pytest.approx(0.96**3, abs=0.015)  # three benches apart
    assert slowing["blocks"] >= slowing["interleaved"] + 0.02  # false alarms from the order alone
    hiding = sim.order_rates(7, 300, 0.5, -4.0, 30.0)  # speeding up while the candidate is 30 % slower
    assert hiding["interleaved"] >= hiding["blocks"] + 0.2
    flat = sim.order_rates(7, 300, 0.5, 0.0, 0.0)  # no trend: the order changes nothing
    assert (
        abs(flat["ratio_interleaved"] - flat["ratio_blocks"]) < 0.015
        and max(flat["interleaved"], flat["blocks"]) < 0.03
    )
    committed = json.loads((ROOT / "benchmarks" / "results" / "bench_order_sim.json").read_text())
    assert committed["benches_each"] == sim.BENCHES and len(committed["cells"]) == 12
