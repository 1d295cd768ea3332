"""How many rounds a bench runs: `--target-detect PCT` keeps adding rounds until a comparison of the bench with an
equal one could detect a PCT slowdown in every metric of every level (interval.needed_mde), or the budget ends.

The runner calls `more_rounds` after its `--repeats` rounds with two callables: what was measured so far (per
level: repeats, problems, seeds) and one more round. The outcome (why it stopped: `reached`, `budget` or
`failed`; the rounds; the widest floor and where) goes into the result's `stopping`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkforge.context import Session
from sparkforge.run.bench.interval import needed_mde
from sparkforge.run.bench.noise import METRICS
from sparkforge.run.bench.suites import level_name


@dataclass(frozen=True)
class Target:
    """--target-detect PCT at bench.compare's --threshold, within --budget seconds."""

    pct: float
    threshold_pct: float = 10.0
    budget_s: float = 1800.0


def more_rounds(
    session: Session,
    target: Target | None,
    rounds: int,
    measured: Callable[[], dict],
    one_more_round: Callable[[int], None],
    started: float,
) -> dict[str, Any]:
    """--target-detect: after `rounds` rounds, more until every metric's floor is at most the target, a level
    failed, or one more round would overrun the budget (counted from `started`, time.monotonic())."""
    if target is None:
        return {}
    last_round_s = 0.0
    while True:
        now = measured()
        floor, where = widest_floor(now, target.threshold_pct)
        spent = time.monotonic() - started
        if any(problems or not repeats for repeats, problems, _seeds in now.values()):
            why = "failed"  # a level failed: more rounds cannot make it pass
        elif floor is not None and floor <= target.pct:
            why = "reached"
        elif spent + last_round_s > target.budget_s:
            why = "budget"
        else:
            session.echo(
                f"  round {rounds + 1}: the widest floor is {_floor(floor)} ({where}), target "
                f"{target.pct:g}% ..."
            )
            began = time.monotonic()
            one_more_round(rounds + 1)
            rounds, last_round_s = rounds + 1, time.monotonic() - began
            continue
        session.echo(
            f"--target-detect {target.pct:g}%: {why} after {rounds} rounds: the widest floor is "
            f"{_floor(floor)} ({where})"
            + (f"; the budget of {target.budget_s:g} s ended first" if why == "budget" else "")
        )
        return {"target_detect": {"pct": target.pct, "threshold_pct": target.threshold_pct,
                                  "stopped": why, "rounds": rounds, "widest_floor_pct": floor, "widest": where,
                                  "budget_s": target.budget_s}}  # fmt: skip


def _floor(floor: float | None) -> str:
    return "unknown (fewer than 2 repeats)" if floor is None else f"{floor:.1f}%"


def widest_floor(measured: dict, threshold_pct: float) -> tuple[float | None, str]:
    """The largest smallest-detectable slowdown over every level and metric (interval.needed_mde), and where."""
    worst: tuple[float | None, str] = (None, "no metric measured")
    for level, (repeats, _problems, _seeds) in measured.items():
        for metric, higher in METRICS.items():
            values = [r[metric] for r in repeats if metric in r]
            if not values or len(values) != len(repeats):
                continue
            floor = needed_mde(values, higher, threshold_pct)
            if floor is None:
                return None, f"{level_name(*level)}:{metric}"
            if worst[0] is None or floor > worst[0]:
                worst = (floor, f"{level_name(*level)}:{metric}")
    return worst
