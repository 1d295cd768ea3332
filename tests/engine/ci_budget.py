"""CI's tiers for the slow engine tests, and which of them this run holds (.ci/run; docs/contributing.md).

The engine tests fall in three tiers:
- core: every engine test not marked `slow`; every run (`pytest -m "not slow" tests/engine`).
- must-run: slow tests also marked `must_run`: the real-world proofs (a served answer, conform's reference and
  known-answers rows, a planted fault caught, a two-node launch, the doctor, bench). Every run, first, and never
  left out for time: when the tier is forecast past the hard limit the log says so and the tier still runs
  (.ci/run then fails the run, naming the overrun: tests/engine/ci_report.py).
- rotating: every other slow test. Its modules are packed, largest first, into rotation slots of at most
  SLOT_S seconds of stated cost; run number R of this checkout (`git rev-list --count HEAD`, deterministic by
  commit) is due slot R mod N, so every module is due once every N runs. The due slot runs while it fits before
  the hard limit; then the other modules, those that ran longest ago on this machine first (the CI history),
  while they fit before the soft deadline. A module longer than HAND_ONLY_S fits no CI run: it is named as run
  by hand only.

A slow test states its cost on a fresh CI machine (`@pytest.mark.slow(cost_s=N, reason=..., rank=R)`; measured
and recorded in benchmarks/ci.md). A mark on the module counts once for the module's items that carry it, a mark
on a test for that test; a must-run test carries its own `slow` mark so that its module's mark prices the rest.

Environment (set by .ci/run; none of it set: a developer's `pytest -m slow` runs every slow test in collection
order): SPARKFORGE_CI_DEADLINE (soft, seconds since the epoch), SPARKFORGE_CI_LIMIT (hard), SPARKFORGE_CI_RUN
(the run number), SPARKFORGE_CI_HISTORY (the machine's history file, tests/engine/ci_report.py).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DEFAULT_COST_S = 600  # a slow test that states no cost is assumed long
DEFAULT_RANK = 100  # a slow test that states no rank comes after those that do
SLOT_S = 900  # the stated cost one rotation slot holds at most
HAND_ONLY_S = 1800  # a module costing more fits no CI run next to the rest


def _slow_mark(item: pytest.Item) -> pytest.Mark | None:
    return item.get_closest_marker("slow")


def is_must_run(item: pytest.Item) -> bool:
    return item.get_closest_marker("must_run") is not None


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def cost_of(marks: dict[int, pytest.Mark]) -> float:
    return sum(float(mark.kwargs.get("cost_s", DEFAULT_COST_S)) for mark in marks.values())


def costs(items: list[pytest.Item]) -> dict[str, float]:
    """Each module's stated cost over `items`: every distinct slow mark they carry, counted once."""
    seen: dict[str, dict[int, pytest.Mark]] = {}
    for item in items:
        mark = _slow_mark(item)
        if mark is not None:
            seen.setdefault(module_of(item), {})[id(mark)] = mark
    return {module: cost_of(marks) for module, marks in seen.items()}


def ranks(items: list[pytest.Item]) -> dict[str, int]:
    """Each slow module's rank: the smallest `rank` among its slow marks."""
    found: dict[str, int] = {}
    for item in items:
        mark = _slow_mark(item)
        if mark is not None:
            rank = int(mark.kwargs.get("rank", DEFAULT_RANK))
            found[module_of(item)] = min(rank, found.get(module_of(item), rank))
    return found


def slots(module_costs: dict[str, float], slot_s: float = SLOT_S) -> tuple[list[list[str]], list[str]]:
    """The rotation: modules packed largest first into the emptiest slot they fit (a module larger than a slot
    gets one of its own), and the modules too long for any CI run. Deterministic: ties by name."""
    hand = sorted(m for m, c in module_costs.items() if c > HAND_ONLY_S)
    packed: list[list[str]] = []
    totals: list[float] = []
    for module in sorted(module_costs, key=lambda m: (-module_costs[m], m)):
        if module in hand:
            continue
        cost = module_costs[module]
        fitting = [i for i, total in enumerate(totals) if total + cost <= slot_s]
        if fitting:
            index = min(fitting, key=lambda i: (totals[i], i))
            packed[index].append(module)
            totals[index] += cost
        else:
            packed.append([module])
            totals.append(cost)
    return packed, hand


@dataclass
class Decision:
    """Why a slow module runs or not in this run; `runs_in` counts the runs until its slot is due again."""

    module: str
    tier: str  # "must-run" | "rotating" | "by hand"
    runs: bool
    why: str
    cost_s: float
    runs_in: int = 0


@dataclass
class Plan:
    kept: list[pytest.Item] = field(default_factory=list)
    left_out: list[pytest.Item] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    must_run_forecast_s: float = 0.0
    slot_count: int = 0


def last_ran(history: dict) -> dict[str, float]:
    """Each module's latest run on this machine (seconds since the epoch), from the CI history."""
    latest: dict[str, float] = {}
    for nodeid, entry in history.get("tests", {}).items():
        if isinstance(entry, dict):
            module = nodeid.split("::")[0]
            latest[module] = max(latest.get(module, 0.0), float(entry.get("ran_at", 0.0)))
    return latest


def plan(
    items: list[pytest.Item],
    *,
    now: float,
    deadline: float,
    limit: float,
    run: int,
    history: dict | None = None,
) -> Plan:
    """Which items this run holds, in order: non-slow items, the must-run tests by their module's rank (never
    left out), then the rotating modules: the due slot while it fits before `limit`, the others (longest since
    they ran here first) while they fit before `deadline`. A module's kept items stay together and in order."""
    result = Plan()
    must = [item for item in items if _slow_mark(item) is not None and is_must_run(item)]
    rotating = [item for item in items if _slow_mark(item) is not None and not is_must_run(item)]
    must_cost, rotating_cost, rank = costs(must), costs(rotating), ranks(items)
    result.must_run_forecast_s = sum(must_cost.values())
    packed, hand = slots(rotating_cost)
    result.slot_count = len(packed)
    due = run % len(packed) if packed else 0
    slot_of = {module: index for index, group in enumerate(packed) for module in group}
    latest = last_ran(history or {})
    for module in sorted(must_cost, key=lambda m: (rank.get(m, DEFAULT_RANK), m)):
        result.decisions.append(Decision(module, "must-run", True, "every run", must_cost[module]))

    def order(module: str) -> tuple[int, float, int, str]:
        return (slot_of.get(module) != due, latest.get(module, 0.0), rank.get(module, DEFAULT_RANK), module)

    spent = result.must_run_forecast_s
    for module in sorted(rotating_cost, key=order):
        cost = rotating_cost[module]
        if module in hand:
            why = f"by hand only: {cost:.0f} s fit no CI run (python3 -m pytest -m slow {module})"
            result.decisions.append(Decision(module, "by hand", False, why, cost))
            continue
        runs_in = (slot_of[module] - due) % len(packed)
        left = deadline - now - spent
        if runs_in == 0 and now + spent + cost <= limit:
            fits, why = True, f"its rotation slot ({slot_of[module] + 1} of {len(packed)}) is due"
        elif runs_in == 0:
            fits, why = (
                False,
                f"due, but {cost:.0f} s would end past the hard limit ({limit - now - spent:.0f} s left)",
            )
        elif cost <= left:
            fits, why = True, f"{max(left, 0):.0f} s of budget were left"
        else:
            fits = False
            why = f"slot {slot_of[module] + 1} of {len(packed)}, due in {runs_in} run(s); {max(left, 0):.0f} s were left"
        spent += cost if fits else 0.0
        result.decisions.append(Decision(module, "rotating", fits, why, cost, runs_in))
    runs = {(d.tier, d.module) for d in result.decisions if d.runs}
    position: dict[str, int] = {}
    for decision in result.decisions:
        if decision.runs:
            position.setdefault(decision.module, len(position))

    def kept(item: pytest.Item) -> bool:
        if _slow_mark(item) is None:
            return True
        return ("must-run" if is_must_run(item) else "rotating", module_of(item)) in runs

    def key(pair: tuple[int, pytest.Item]) -> tuple[int, int, int, int]:
        index, item = pair
        if _slow_mark(item) is None:
            return (0, 0, 0, index)
        return (1, position[module_of(item)], 0 if is_must_run(item) else 1, index)

    for _, item in sorted(((i, item) for i, item in enumerate(items) if kept(item)), key=key):
        result.kept.append(item)
    result.left_out = [item for item in items if not kept(item)]
    return result


PLAN_KEY = pytest.StashKey[Plan]()


def check_named(items: list[pytest.Item], named: list[str]) -> None:
    """The must-run tests .ci/run names are exactly those marked `must_run`, and none is marked skippable."""
    marked = {item.nodeid for item in items if is_must_run(item)}
    problems = [
        f"named in .ci/run but not marked must_run (or not collected): {n}"
        for n in sorted(set(named) - marked)
    ]
    problems += [
        f"marked must_run but not named in .ci/run's MUST_RUN: {n}" for n in sorted(marked - set(named))
    ]
    problems += [f"a must-run test may not be skippable (@{m.name}): {item.nodeid}" for item in items
                 if is_must_run(item) for m in item.iter_markers() if m.name in SKIPPING]  # fmt: skip
    if problems:
        raise pytest.UsageError("the must-run tier is not what .ci/run names:\n  " + "\n  ".join(problems))


SKIPPING = ("skip", "skipif", "xfail")


def read_history(path: str | None) -> dict:
    if not path or not Path(path).is_file():
        return {}
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def apply(config: pytest.Config, items: list[pytest.Item]) -> None:
    raw = os.environ.get("SPARKFORGE_CI_DEADLINE")
    if not raw:
        return
    deadline = float(raw)
    limit = float(os.environ.get("SPARKFORGE_CI_LIMIT", raw))
    run = int(os.environ.get("SPARKFORGE_CI_RUN", "0") or 0)
    named = os.environ.get("SPARKFORGE_CI_MUST_RUN")
    if named is not None:
        check_named(items, named.split())
    now = time.time()
    result = plan(
        items, now=now, deadline=deadline, limit=limit, run=run,
        history=read_history(os.environ.get("SPARKFORGE_CI_HISTORY")),
    )  # fmt: skip
    items[:] = result.kept
    config.stash[PLAN_KEY] = result
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"CI plan: run {run}, {result.slot_count} rotation slot(s); must-run forecast "
             f"{result.must_run_forecast_s:.0f} s, {limit - now:.0f} s to the hard limit"]  # fmt: skip
    if now + result.must_run_forecast_s > limit:
        lines.append(
            f"the must-run tier is forecast past the hard limit by {now + result.must_run_forecast_s - limit:.0f} s: "
            "it runs all the same (never left out for time) and the run fails after it, naming the overrun"
        )
    for decision in result.decisions:
        verdict = "runs" if decision.runs else "not run"
        lines.append(
            f"{verdict} ({decision.tier}): {decision.module}: ~{decision.cost_s:.0f} s, {decision.why}"
        )
    if result.left_out:
        config.hook.pytest_deselected(items=result.left_out)
    for line in lines:
        reporter.write_line(line) if reporter is not None else print(line)
