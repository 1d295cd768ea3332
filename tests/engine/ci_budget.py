"""CI's time budget for the slow engine tests: `.ci/run` runs them after the rest, each only while it still fits.

A slow test states what it costs on a fresh CI machine once the non-slow suite has built the shared images
(`@pytest.mark.slow(cost_s=N, reason=..., rank=R)`, measured and recorded in benchmarks/ci.md). With the
environment's SPARKFORGE_CI_DEADLINE (seconds since the epoch) set, the slow modules are taken in the order of
their rank (the smallest rank of their marks; a lower rank proves more per minute, DEFAULT_RANK when unstated;
collection order among equals), and a slow test whose cost would end past the deadline is deselected and named
with its cost and the time left, so the log says exactly what this run did not prove. Without the deadline (a
developer's `pytest -m slow`) every slow test runs, in collection order.
"""

from __future__ import annotations

import os
import time

import pytest

DEFAULT_COST_S = 600  # a slow test that states no cost is assumed long
DEFAULT_RANK = 100  # a slow test that states no rank comes after those that do


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


def module_ranks(items: list[pytest.Item]) -> dict[str, int]:
    """Each slow module's rank: the smallest `rank` among its slow marks."""
    ranks: dict[str, int] = {}
    for item in items:
        mark = _slow_mark(item)
        if mark is not None:
            rank = int(mark.kwargs.get("rank", DEFAULT_RANK))
            ranks[_module(item)] = min(rank, ranks.get(_module(item), rank))
    return ranks


def by_rank(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items with the non-slow ones first (in their order), then the slow modules by rank; a module's items
    stay together and in their order."""
    ranks = module_ranks(items)
    first_index: dict[str, int] = {}
    for index, item in enumerate(items):
        first_index.setdefault(_module(item), index)

    def key(indexed: tuple[int, pytest.Item]) -> tuple[int, int, int]:
        index, item = indexed
        if _slow_mark(item) is None:
            return (-1, 0, index)
        module = _module(item)
        return (ranks[module], first_index[module], index)

    return [item for _, item in sorted(enumerate(items), key=key)]


def within_budget(
    items: list[pytest.Item], deadline: float, now: float
) -> tuple[list[pytest.Item], list[tuple[pytest.Item, float, float]]]:
    """The items to run (non-slow first, then the slow modules by rank) and those left out, with their module's
    cost and the seconds left then. A module's slow tests are kept or left out together (they share its module
    fixtures); in rank order, a module runs when its cost fits in what the modules kept before it leave; non-slow items always run."""
    items = by_rank(items)
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
    items[:] = kept
    if not left_out:
        return
    config.hook.pytest_deselected(items=[item for item, _, _ in left_out])
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for item, cost, left in left_out:
        line = f"not run (CI budget): {item.nodeid}: costs ~{cost:.0f} s, {max(left, 0):.0f} s were left"
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line)
