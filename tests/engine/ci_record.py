"""What one pytest run of the engine tests did, written for tests/engine/ci_report.py (.ci/run sets the paths).

SPARKFORGE_CI_INVENTORY=FILE (with --collect-only): every collected engine test with its tier (core, must-run,
rotating) and stated cost. SPARKFORGE_CI_RECORD=FILE: each test's outcome, seconds (set-up + call + teardown)
and end time, and the plan's decisions (tests/engine/ci_budget.py) when the run had one. Unset: nothing written.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import ci_budget
import pytest


def tier_of(item: pytest.Item) -> str:
    if item.get_closest_marker("slow") is None:
        return "core"
    return "must-run" if ci_budget.is_must_run(item) else "rotating"


def stated_cost(item: pytest.Item) -> float | None:
    mark = item.get_closest_marker("slow")
    return None if mark is None else float(mark.kwargs.get("cost_s", ci_budget.DEFAULT_COST_S))


def write_json(path: str, doc: dict) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.part")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(target)


class Recorder:
    """A pytest plugin: outcomes per test (the worst of set-up, call and teardown) and their seconds."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tests: dict[str, dict] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        inventory = os.environ.get("SPARKFORGE_CI_INVENTORY")
        if inventory:
            write_json(inventory, {"tests": {
                item.nodeid: {"tier": tier_of(item), "cost_s": stated_cost(item)} for item in session.items
            }})  # fmt: skip

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.tests.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0})
        entry["seconds"] = round(entry["seconds"] + report.duration, 2)
        entry["ended_at"] = round(time.time(), 1)
        if report.failed:
            entry["outcome"] = "failed" if report.when == "call" else f"error in {report.when}"
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.path:
            return
        result = session.config.stash.get(ci_budget.PLAN_KEY, None)
        decisions = [asdict(d) for d in result.decisions] if result is not None else []
        write_json(
            self.path, {"tests": self.tests, "decisions": decisions, "finished_at": round(time.time(), 1)}
        )


def register(config: pytest.Config) -> None:
    path = os.environ.get("SPARKFORGE_CI_RECORD") or os.environ.get("SPARKFORGE_CI_INVENTORY")
    if path:
        config.pluginmanager.register(
            Recorder(os.environ.get("SPARKFORGE_CI_RECORD", "")), "sparkforge-ci-record"
        )
