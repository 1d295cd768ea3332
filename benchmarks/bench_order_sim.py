"""Why `bench --baseline OLD --image NEW` interleaves: a seeded simulation of two images benched in turn on a
machine whose speed moves with time, judged by bench.compare's random-effects rule (interval.py, both sides'
benches as benches), with the benches placed by the run's own schedule (pairing.PairPlan): A B A B ... against
A A A B B B.

Model (log scale), as benchmarks/bench_drift_sim.py: a figure = image effect + a bench's draw ~ N(0, tau^2) + a
repeat's noise ~ N(0, sigma^2), plus a trend: the machine `trend_pct` percent slower per bench over the run (a
warming machine, a load that grows). Without a trend the order changes nothing; with one, blocks put the
candidate's benches later, so the trend reads as a change of the image.

    python3 benchmarks/bench_order_sim.py > benchmarks/results/bench_order_sim.json
    python3 benchmarks/bench_order_sim.py --markdown      # the table of benchmarks/bench-drift.md

tests/unit/test_bench_pairing.py runs the same function with fewer draws and a fixed seed.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_drift_sim import MACHINES, SIGMA, THRESHOLD, draw_bench, simulation_cli, store_drift  # noqa: E402

from sparkforge.run.bench.interval import estimate  # noqa: E402
from sparkforge.run.bench.pairing import PairPlan  # noqa: E402

BENCHES, REPEATS = 3, 5  # bench --baseline's default benches of each image; bench's default repeats


def order_rates(
    seed: int, trials: int, tau_over_sigma: float, trend_pct: float, slowdown_pct: float
) -> dict[str, float]:
    """The share of comparisons called regressed, per order (`interleaved`, `blocks`), and each order's mean
    ratio new/old (`ratio_interleaved`, `ratio_blocks`: 1 - slowdown when the order cancels the trend)."""
    out = {}
    for interleave in (True, False):
        rng = random.Random(seed)
        plan = PairPlan("a", "b", BENCHES, interleave)
        hits, ratios = 0, []
        for _ in range(trials):
            drift = store_drift(rng, SIGMA, tau_over_sigma * SIGMA)
            sides: dict[str, list[list[float]]] = {"baseline": [], "candidate": []}
            for slot in plan.schedule():
                shift = slot.position * math.log(1 - trend_pct / 100)
                if slot.role == "candidate":
                    shift += math.log(1 - slowdown_pct / 100)
                sides[slot.role].append(draw_bench(rng, REPEATS, SIGMA, tau_over_sigma * SIGMA, shift))
            old, new = sides["baseline"], sides["candidate"]
            est = estimate(
                [x for b in old for x in b],
                [x for b in new for x in b],
                True,
                THRESHOLD,
                old_benches=[len(b) for b in old],
                new_benches=[len(b) for b in new],
                drift=drift,
            )
            hits += est.verdict == "regressed"
            ratios.append(est.ratio)
        name = "interleaved" if interleave else "blocks"
        out[name], out[f"ratio_{name}"] = hits / trials, round(sum(ratios) / trials, 4)
    return out


def study(trials: int = 1000, seed: int = 20261205) -> dict:
    cells = [
        {
            "machine": name,
            "tau_over_sigma": ratio,
            "trend_pct": trend,
            "slowdown_pct": slow,
            **order_rates(seed, trials, ratio, trend, slow),
        }
        for name, ratio in MACHINES
        for trend in (0.0, 4.0, -4.0)
        for slow in (0.0, 30.0)
    ]
    return {
        "what": "bench --baseline's order (interleaved vs blocks) under a trend, simulated (module docstring)",
        "seed": seed, "trials_per_cell": trials, "sigma": SIGMA, "threshold_pct": THRESHOLD,
        "benches_each": BENCHES, "repeats": REPEATS, "cells": cells,
    }  # fmt: skip


def markdown(doc: dict) -> str:
    lines = [
        "| machine (tau/sigma) | slower per bench | unchanged: interleaved | unchanged: blocks | mean ratio "
        "unchanged: interleaved / blocks | 30 % slower: interleaved | 30 % slower: blocks |",
        "|---|---|---|---|---|---|---|",
    ]
    cells = {(c["machine"], c["trend_pct"], c["slowdown_pct"]): c for c in doc["cells"]}
    for machine, ratio in MACHINES:
        for trend in (0.0, 4.0, -4.0):
            z, s = cells[(machine, trend, 0.0)], cells[(machine, trend, 30.0)]
            lines.append(
                f"| {machine} ({ratio}) | {trend:g} % | {z['interleaved']:.1%} | {z['blocks']:.1%} | "
                f"{z['ratio_interleaved']:.3f} / {z['ratio_blocks']:.3f} | {s['interleaved']:.1%} | "
                f"{s['blocks']:.1%} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    simulation_cli(study, markdown, "bench_order_sim.json", trials=1000)
