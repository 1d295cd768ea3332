"""The comparison's statistics (interval.py, tdist.py) as properties over many seeded draws, and the committed noise
study replayed through them (benchmarks/bench_noise_replay.py, the figures bench-noise.md publishes)."""

from __future__ import annotations

import importlib.util
import math
import random
import statistics
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sparkforge.run.bench.interval import CONFIDENCE, POWER, estimate, needed_mde
from sparkforge.run.bench.tdist import t_cdf, t_quantile

REPO = Path(__file__).parents[2]
TRIALS = 300
# binomial slack for a rate measured over TRIALS draws: three standard deviations at the rate tested
SLACK = 3 * math.sqrt(0.2 * 0.8 / TRIALS)
# derandomized: the same examples every run (the draws inside are seeded by them), so a rate's slack is not
# spent again on every CI run
# (no shrinking: each example draws hundreds of comparisons; a failure prints its example as drawn)
PROPERTY = settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)


def _draw(rng: random.Random, n: int, sigma: float, factor: float = 1.0) -> list[float]:
    """n repeats of a figure around 100 * factor with multiplicative (log-normal) noise of sigma."""
    return [100 * factor * math.exp(rng.gauss(0, sigma)) for _ in range(n)]


def _replay():
    spec = importlib.util.spec_from_file_location(
        "bench_noise_replay", REPO / "benchmarks" / "bench_noise_replay.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("p", "df", "expected"),  # Student's t table values
    [(0.975, 1, 12.706205), (0.975, 2, 4.302653), (0.975, 4, 2.776445), (0.975, 10, 2.228139),
     (0.8, 4, 0.940965), (0.95, 30, 1.697261), (0.975, 1e7, 1.959964), (0.025, 3, -3.182446)],
)  # fmt: skip
def test_the_t_quantile_matches_the_table(p: float, df: float, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, abs=2e-6)
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


@PROPERTY
@given(
    sigma=st.floats(0.02, 0.4),
    n_old=st.integers(3, 15),
    n_new=st.integers(3, 8),
    higher=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_a_change_at_the_threshold_is_called_regressed_at_most_at_the_stated_rate(
    sigma: float, n_old: int, n_new: int, higher: bool, seed: int
) -> None:
    # the hardest case for the false-alarm rate: the true change is exactly the threshold (10 %); identical
    # distributions (no change) are further from the limit and flagged even less
    rng = random.Random(seed)
    at_limit = 0.9 if higher else 1.1
    regressed = sum(
        estimate(_draw(rng, n_old, sigma), _draw(rng, n_new, sigma, at_limit), higher, 10).verdict
        == "regressed"
        for _ in range(TRIALS)
    )
    identical = sum(
        estimate(_draw(rng, n_old, sigma), _draw(rng, n_new, sigma), higher, 10).verdict == "regressed"
        for _ in range(TRIALS)
    )
    stated = (1 - CONFIDENCE) / 2
    assert regressed / TRIALS <= stated + 3 * math.sqrt(stated * (1 - stated) / TRIALS)
    assert identical <= regressed


@PROPERTY
@given(
    sigma=st.floats(0.03, 0.3),
    n_old=st.integers(3, 12),
    n_new=st.integers(3, 6),
    slowdown=st.floats(15, 60),
    seed=st.integers(0, 2**32),
)
def test_a_slowdown_at_or_above_the_printed_floor_is_caught_at_the_stated_power(
    sigma: float, n_old: int, n_new: int, slowdown: float, seed: int
) -> None:
    rng = random.Random(seed)
    runs = [
        estimate(_draw(rng, n_old, sigma), _draw(rng, n_new, sigma, 1 - slowdown / 100), True, 10)
        for _ in range(TRIALS)
    ]
    # every comparison that printed "could detect >= X%" with X at most the true slowdown
    promised = [e for e in runs if e.mde_pct is not None and e.mde_pct <= slowdown]
    if len(promised) >= 30:
        caught = sum(e.verdict == "regressed" for e in promised) / len(promised)
        assert caught >= POWER - 3 * math.sqrt(POWER * (1 - POWER) / len(promised))
    # and planted at the typical printed floor (the median over unchanged comparisons), caught about POWER of
    # the time: the floor is computed from the measured noise, which a few repeats underestimate a little
    floor = statistics.median(
        estimate(_draw(rng, n_old, sigma), _draw(rng, n_new, sigma), True, 10).mde_pct for _ in range(TRIALS)
    )
    at_floor = sum(
        estimate(_draw(rng, n_old, sigma), _draw(rng, n_new, sigma, 1 - floor / 100), True, 10).verdict
        == "regressed"
        for _ in range(TRIALS)
    )
    assert at_floor / TRIALS >= POWER - 0.07 - SLACK


@PROPERTY
@given(
    sigma=st.floats(0.03, 0.3),
    per_bench=st.integers(3, 5),
    slowdown=st.floats(15, 45),
    seed=st.integers(0, 2**32),
)
def test_pooling_more_baselines_never_lowers_power_and_narrows_the_interval(
    sigma: float, per_bench: int, slowdown: float, seed: int
) -> None:
    rng = random.Random(seed)
    caught = [0, 0, 0, 0]
    width = [0.0, 0.0, 0.0, 0.0]
    for _ in range(TRIALS):
        benches = [_draw(rng, per_bench, sigma) for _ in range(4)]
        new = _draw(rng, per_bench, sigma, 1 - slowdown / 100)
        for k in range(4):  # the same draws, pooled from 1, 2, 3, 4 baseline benches
            e = estimate([x for b in benches[: k + 1] for x in b], new, True, 10)
            caught[k] += e.verdict == "regressed"
            width[k] += math.log(e.high / e.low)
    for k in range(3):
        assert caught[k + 1] >= caught[k] - SLACK * TRIALS / 2, caught
        assert width[k + 1] < width[k], width


def test_the_floor_shrinks_with_repeats_and_needs_two() -> None:
    rng = random.Random(7)
    values = _draw(rng, 20, 0.1)
    floors = [needed_mde(values[:n], True, 10) for n in (3, 5, 10, 20)]
    assert floors == sorted(floors, reverse=True) and all(f > 10 for f in floors)
    assert needed_mde(values[:1], True) is None and needed_mde([0.0, 1.0], True) is None


def test_a_zero_or_a_single_repeat_a_side_is_inconclusive_never_passed() -> None:
    assert estimate([0.0, 1.0, 2.0], [1.0, 1.0, 1.0], True, 10).verdict == "inconclusive"
    single = estimate([100.0], [100.0], True, 10)
    assert single.verdict == "inconclusive" and single.mde_pct is None and "no interval" in single.describe()
    # one repeat on one side: the other side's spread stands for both
    one_side = estimate([100.0, 101.0, 99.0, 100.0], [60.0], True, 10)
    assert one_side.verdict == "regressed" and one_side.df == 3


@pytest.mark.parametrize("study", ["final", "quiet"])
def test_the_committed_study_replayed_unchanged_reruns_flag_at_most_one_of_ten(study: str) -> None:
    replay = _replay()
    baselines, reruns, _live = replay.load_study(study)
    pooled = replay.pool([(f"base-{i}", b) for i, b in enumerate(baselines)])
    flagged = [replay.verdict(pooled, r) for r in reruns].count("regressed")
    assert flagged <= 1


def test_the_committed_quiet_study_replayed_a_planted_30_pct_slowdown_is_caught_8_of_10_pooled() -> None:
    replay = _replay()
    baselines, reruns, _live = replay.load_study("quiet")
    pooled = replay.pool([(f"base-{i}", b) for i, b in enumerate(baselines)])
    caught = [replay.verdict(pooled, replay.plant(r, 0.30)) for r in reruns].count("regressed")
    one = [replay.verdict(baselines[0], replay.plant(r, 0.30)) for r in reruns].count("regressed")
    assert caught >= 8 and caught >= one - 1  # the pooled baseline is not weaker than one baseline


def _rounds(sigma: float, seed: int):
    """A bench's rounds as the runner keeps them: one level, a repeat of output_tok_s and ttft_ms per round."""
    rng, repeats = random.Random(seed), []

    def one_more_round(_index: int) -> None:
        repeats.append({"output_tok_s": _draw(rng, 1, sigma)[0], "ttft_ms": _draw(rng, 1, sigma)[0]})

    return repeats, one_more_round


@pytest.mark.parametrize(
    ("sigma", "target", "budget", "stopped"), [(0.03, 14, 60, "reached"), (0.3, 12, 0.5, "budget")]
)
def test_target_detect_runs_rounds_until_the_floor_is_reached_or_the_budget_ends(
    sigma: float, target: float, budget: float, stopped: str
) -> None:
    from sparkforge.commands import Runner
    from sparkforge.context import Session
    from sparkforge.run.bench.rounds import Target, more_rounds, widest_floor

    repeats, one_more_round = _rounds(sigma, 3)
    for i in range(2):
        one_more_round(i + 1)
    options = Target(target, 10, budget)
    said: list[str] = []
    started = time.monotonic()
    session = Session(echo=said.append, runner=Runner(stream=False))
    out = more_rounds(
        session, options, 2, lambda: {(1, 0): (list(repeats), [], None)}, one_more_round, started
    )
    target_state = out["target_detect"]
    assert target_state["stopped"] == stopped and target_state["rounds"] == len(repeats)
    floor, where = widest_floor({(1, 0): (repeats, [], None)}, 10)
    assert target_state["widest_floor_pct"] == floor and where == target_state["widest"]
    if stopped == "reached":  # 3 % noise: more rounds bring every floor under 14 %
        assert 2 < len(repeats) < 40 and floor <= target
    else:  # 30 % noise cannot reach 12 % in half a second of rounds: the budget ends it, and it says so
        assert floor > target and "budget" in said[-1]
    assert said[-1].startswith(f"--target-detect {target:g}%: {stopped} after {len(repeats)} rounds")
