"""CI's time budget for the slow engine tests: `.ci/run` runs them after the rest, each only while it still fits.

A slow test states what it costs on a fresh CI machine once the non-slow suite has built the shared images
(`@pytest.mark.slow(cost_s=N, reason=...)`, measured and recorded in benchmarks/ci.md). With the environment's
SPARKFORGE_CI_DEADLINE (seconds since the epoch) set, a slow test whose cost would end past the deadline is
deselected and named with its cost and the time left, so the log says exactly what this run did not prove.
Without the deadline (a developer's `pytest -m slow`) every slow test runs.
"""

from __future__ import annotations

import os
import time

import pytest

DEFAULT_COST_S = 600  # a slow test that states no cost is assumed long


def _slow_mark(item: pytest.Item) -> pytest.Mark | None:
    return item.get_closest_marker("slow")


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def module_costs(items: list[pytest.Item]) -> dict[str, float]:
    """Each module's slow cost: a mark on the module counts once for the module, a mark on a test for that test."""
    seen: dict[str, dict[int, float]] = {}
    for item in items:
        mark = _slow_mark(item)
        if mark is not None:
            seen.setdefault(_module(item), {})[id(mark)] = float(mark.kwargs.get("cost_s", DEFAULT_COST_S))
    return {module: sum(marks.values()) for module, marks in seen.items()}


def within_budget(
    items: list[pytest.Item], deadline: float, now: float
) -> tuple[list[pytest.Item], list[tuple[pytest.Item, float, float]]]:
    """The items to run, in their order, and those left out with (their module's cost, seconds left then).
    A module's slow tests are kept or left out together (they share its module fixtures); in collection order,
    a module runs when its cost fits in what the modules kept before it leave; non-slow items always run."""
    costs = module_costs(items)
    kept: list[pytest.Item] = []
    left_out: list[tuple[pytest.Item, float, float]] = []
    decided: dict[str, tuple[bool, float]] = {}
    spent = 0.0
    for item in items:
        module = _module(item)
        if _slow_mark(item) is None:
            kept.append(item)
            continue
        if module not in decided:
            left = deadline - now - spent
            fits = costs[module] <= left
            spent += costs[module] if fits else 0.0
            decided[module] = (fits, left)
        fits, left = decided[module]
        if fits:
            kept.append(item)
        else:
            left_out.append((item, costs[module], left))
    return kept, left_out


def apply(config: pytest.Config, items: list[pytest.Item]) -> None:
    raw = os.environ.get("SPARKFORGE_CI_DEADLINE")
    if not raw:
        return
    kept, left_out = within_budget(items, float(raw), time.time())
    if not left_out:
        return
    config.hook.pytest_deselected(items=[item for item, _, _ in left_out])
    items[:] = kept
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for item, cost, left in left_out:
        line = f"not run (CI budget): {item.nodeid}: costs ~{cost:.0f} s, {max(left, 0):.0f} s were left"
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line)
