"""What drift between benches does to bench.compare's interval: a seeded simulation of the random-effects model
the project's own studies show, judged by the rule with repeats taken as independent and by the random-effects
rule (sparkforge/run/bench/interval.py), both as shipped.

Model (log scale): a figure = image effect + a bench's draw ~ N(0, tau^2) + a repeat's noise ~ N(0, sigma^2);
sigma and the ratio tau/sigma from the committed studies (results/bench_noise/{quiet,final}: 13 unchanged benches
of one image each), or the issue's round figures 0.5 (quiet) and 1.5 (busy).

    python3 benchmarks/bench_drift_sim.py > benchmarks/results/bench_drift_sim.json
    python3 benchmarks/bench_drift_sim.py --markdown      # the tables of benchmarks/bench-drift.md

tests/unit/test_bench_drift.py runs the same functions with fewer draws and fixed seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkforge.run.bench.interval import Drift, between_variance, estimate  # noqa: E402

THRESHOLD = 10.0
SIGMA = 0.14  # a repeat's log-noise: the committed studies' within-bench sd is 0.12-0.18 (measured_ratios)
STORE_BENCHES = 13  # a store like each committed study: 13 unchanged benches of 3 repeats
STORE_REPEATS = 3
MACHINES = (("quiet", 0.5), ("busy", 1.5))  # tau/sigma: the round figures, a quiet and a busy machine


def draw_bench(rng: random.Random, repeats: int, sigma: float, tau: float, shift: float = 0.0) -> list[float]:
    """One bench: its own draw of the drift, then `repeats` repeats around it (figures, throughput-like)."""
    level = rng.gauss(0, tau) + shift
    return [100 * math.exp(level + rng.gauss(0, sigma)) for _ in range(repeats)]


def store_drift(rng: random.Random, sigma: float, tau: float) -> Drift | None:
    """What the store would estimate: STORE_BENCHES unchanged benches of one image."""
    benches = [
        [math.log(x) for x in draw_bench(rng, STORE_REPEATS, sigma, tau)] for _ in range(STORE_BENCHES)
    ]
    found = between_variance(benches)
    return Drift(found[0], found[1], STORE_BENCHES, "store") if found else None


def flagged(rule: str, old: list[list[float]], new: list[float], drift: Drift | None) -> bool:
    """Whether a comparison says regressed: 'independent' (every repeat one draw: the rule before) or
    'random-effects' (the baseline's benches and the store's drift)."""
    values = [x for bench in old for x in bench]
    if rule == "independent":
        return estimate(values, new, True, THRESHOLD).verdict == "regressed"
    sizes = [len(b) for b in old]
    return estimate(values, new, True, THRESHOLD, old_benches=sizes, drift=drift).verdict == "regressed"


def rates(
    seed: int, trials: int, sigma: float, ratio: float, repeats: int, benches: int, slowdown: float
) -> dict:
    """Per rule, the share of comparisons flagged: `benches` baseline benches and one new bench of `repeats`
    repeats each, the new one slowed by `slowdown` percent (0: an unchanged rerun, a false alarm when flagged)."""
    rng = random.Random(seed)
    tau = ratio * sigma
    shift = math.log(1 - slowdown / 100)
    hits = {"independent": 0, "random-effects": 0}
    for _ in range(trials):
        drift = store_drift(rng, sigma, tau)
        old = [draw_bench(rng, repeats, sigma, tau) for _ in range(benches)]
        new = draw_bench(rng, repeats, sigma, tau, shift)
        for rule in hits:
            hits[rule] += flagged(rule, old, new, drift)
    return {rule: round(count / trials, 4) for rule, count in hits.items()}


def pooling_studies(
    seed: int, studies: int, sigma: float, ratio: float, slowdown: float, reruns: int = 10
) -> dict:
    """The committed studies' shape: 3 baseline benches, `reruns` new benches slowed by `slowdown`; per study, how
    many the pooled baseline (3) and one baseline (base-0) catch. Per rule: the share of studies where pooling
    caught FEWER than one baseline, and the mean catch rates."""
    rng = random.Random(seed)
    tau = ratio * sigma
    shift = math.log(1 - slowdown / 100)
    out = {}
    draws = []
    for _ in range(studies):
        drift = store_drift(rng, sigma, tau)
        base = [draw_bench(rng, 3, sigma, tau) for _ in range(3)]
        news = [draw_bench(rng, 3, sigma, tau, shift) for _ in range(reruns)]
        draws.append((drift, base, news))
    for rule in ("independent", "random-effects"):
        fewer, pooled_rate, single_rate = 0, [], []
        for drift, base, news in draws:
            pooled = sum(flagged(rule, base, n, drift) for n in news)
            single = sum(flagged(rule, base[:1], n, drift) for n in news)
            fewer += pooled < single
            pooled_rate.append(pooled / reruns)
            single_rate.append(single / reruns)
        out[rule] = {
            "studies_pooled_caught_fewer": round(fewer / studies, 4),
            "mean_catch_pooled": round(statistics.fmean(pooled_rate), 4),
            "mean_catch_one_baseline": round(statistics.fmean(single_rate), 4),
        }
    return out


def measured_ratios() -> dict:
    """tau/sigma of output_tok_s in the committed studies (13 unchanged benches each), from their files."""
    from sparkforge.run.bench.results import levels, load_result

    out = {}
    for study in ("quiet", "final"):
        folder = REPO / "benchmarks" / "results" / "bench_noise" / study
        files = [folder / f"base-{i}.json" for i in range(3)] + [
            folder / f"rerun-{i}.json" for i in range(10)
        ]
        docs = [load_result(f) for f in files if f.is_file()]
        per_level = {}
        for name in levels(docs[0]):
            benches = [
                [math.log(r["output_tok_s"]) for r in levels(d)[name]["details"]["repeats"]]
                for d in docs
                if levels(d).get(name, {}).get("status") == "passed"
            ]
            tau2, _ = between_variance(benches)
            within = statistics.fmean(statistics.variance(b) for b in benches if len(b) > 1)
            per_level[name] = {
                "sigma": round(math.sqrt(within), 4),
                "tau_over_sigma": round(math.sqrt(tau2 / within), 2),
            }
        out[study] = per_level
    return out


def study(trials: int = 1000, studies: int = 300, seed: int = 20261204) -> dict:
    cells = []
    for name, ratio in MACHINES:
        for benches in (1, 3):
            for repeats in (3, 5, 10, 20):
                for slowdown in (0.0, 30.0):
                    r = rates(seed, trials, SIGMA, ratio, repeats, benches, slowdown)
                    cells.append({"machine": name, "tau_over_sigma": ratio, "baseline_benches": benches,
                                  "repeats": repeats, "slowdown_pct": slowdown, **r})  # fmt: skip
    pooling = {
        name: {str(s): pooling_studies(seed, studies, SIGMA, ratio, s) for s in (20.0, 30.0, 40.0)}
        for name, ratio in MACHINES
    }
    return {
        "what": "bench.compare's verdict under drift between benches, simulated (see the module docstring)",
        "seed": seed, "trials_per_cell": trials, "studies": studies, "sigma": SIGMA, "threshold_pct": THRESHOLD,
        "store_benches": STORE_BENCHES, "measured": measured_ratios(), "cells": cells, "pooling": pooling,
    }  # fmt: skip


def markdown(doc: dict) -> str:
    lines = ["| machine (tau/sigma) | baseline benches | repeats | unchanged: independent | unchanged: random-effects "
             "| 30 % slower: independent | 30 % slower: random-effects |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    cells = {(c["machine"], c["baseline_benches"], c["repeats"], c["slowdown_pct"]): c for c in doc["cells"]}
    for machine, ratio in MACHINES:
        for benches in (1, 3):
            for repeats in (3, 5, 10, 20):
                z, s = cells[(machine, benches, repeats, 0.0)], cells[(machine, benches, repeats, 30.0)]
                lines.append(
                    f"| {machine} ({ratio}) | {benches} | {repeats} | {z['independent']:.1%} | "
                    f"{z['random-effects']:.1%} | {s['independent']:.1%} | {s['random-effects']:.1%} |"
                )
    lines += ["", "| machine | slowdown | rule | studies where pooling (3) caught fewer than one baseline | "
              "mean catch, pooled | mean catch, one baseline |", "|---|---|---|---|---|---|"]  # fmt: skip
    for machine, by_slow in doc["pooling"].items():
        for slow, rules in by_slow.items():
            for rule, r in rules.items():
                lines.append(
                    f"| {machine} | {float(slow):.0f} % | {rule} | {r['studies_pooled_caught_fewer']:.1%} | "
                    f"{r['mean_catch_pooled']:.1%} | {r['mean_catch_one_baseline']:.1%} |"
                )
    return "\n".join(lines)


def simulation_cli(
    study: Callable[..., dict], markdown: Callable[[dict], str], results: str, **counts: int
) -> None:
    """A simulation's command line: `study(**counts)` as JSON on stdout (each count an option, `--trials N`), or
    `--markdown`: the tables from the committed results/<results>."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--markdown", action="store_true", help="print the tables from the committed results")
    for name, default in counts.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads((REPO / "benchmarks" / "results" / results).read_text())))
        return
    print(json.dumps(study(**{name: getattr(args, name) for name in counts}), indent=2))


if __name__ == "__main__":
    simulation_cli(study, markdown, "bench_drift_sim.json", trials=1000, studies=300)
