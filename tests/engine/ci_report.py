"""The end of a CI run: the table of every engine test (ran, or not this run and when it last ran here), the
machine's CI history, the summary under build/, and the must-run tier's verdict (.ci/run calls it last).

  python3 tests/engine/ci_report.py --inventory F --record F [--record F ...] --history F --commit SHA
      --started EPOCH --limit-min 75 --goal-min 45 --out build/ci-summary

Exit 1 when a must-run test did not pass, or when set-up + unit + core + the must-run tier ended past
--limit-min (the tier is never left out for time: running late fails the run instead, and says so).
Standard library only: it runs from .ci/run with the venv's Python, outside pytest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def load(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def when(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch)) if epoch else "never here"


def merge_records(paths: list[Path]) -> tuple[dict[str, dict], list[dict]]:
    tests: dict[str, dict] = {}
    decisions: list[dict] = []
    for path in paths:
        doc = load(path)
        tests.update(doc.get("tests", {}))
        decisions += doc.get("decisions", [])
    return tests, decisions


def rows(inventory: dict[str, dict], ran: dict[str, dict], history: dict[str, dict]) -> list[dict]:
    order = {"must-run": 0, "core": 1, "rotating": 2}
    out = []
    for nodeid, facts in sorted(inventory.items(), key=lambda kv: (order.get(kv[1]["tier"], 3), kv[0])):
        this = ran.get(nodeid)
        before = history.get(nodeid, {})
        out.append({
            "test": nodeid,
            "tier": facts["tier"],
            "this_run": this["outcome"] if this else "not this run",
            "seconds": this["seconds"] if this else None,
            "cost_s": facts.get("cost_s"),
            "last_ran_here": when(before.get("ran_at")) if not this else "now",
            "last_outcome": before.get("outcome", "") if not this else "",
        })  # fmt: skip
    return out


def table(lines: list[dict]) -> str:
    head = ["test", "tier", "this run", "s", "stated s", "last ran here"]
    body = [[r["test"], r["tier"], r["this_run"], "" if r["seconds"] is None else f"{r['seconds']:.0f}",
             "" if r["cost_s"] is None else f"{r['cost_s']:.0f}",
             r["last_ran_here"] + (f" ({r['last_outcome']})" if r["last_outcome"] else "")] for r in lines]  # fmt: skip
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    fmt = "| " + " | ".join(f"{{:<{w}}}" for w in widths) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([fmt.format(*head), sep, *(fmt.format(*row) for row in body)])


def verdict(
    inventory: dict, ran: dict, started: float, limit_min: float, goal_min: float
) -> tuple[bool, list[str]]:
    """The must-run tier: every test passed, and ended (with set-up, unit and core before it) within the limit."""
    must = [n for n, f in inventory.items() if f["tier"] == "must-run"]
    said, ok = [], True
    missing = [n for n in must if ran.get(n, {}).get("outcome") != "passed"]
    for nodeid in missing:
        ok = False
        said.append(
            f"must-run test did not pass: {nodeid} ({ran.get(nodeid, {}).get('outcome', 'did not run')})"
        )
    ends = [ran[n]["ended_at"] for n in must if n in ran and "ended_at" in ran[n]]
    if must and ends:
        minutes = (max(ends) - started) / 60
        if minutes > limit_min:
            ok = False
            said.append(f"the must-run tier did not fit: set-up, unit, core and must-run ended at {minutes:.1f} min, "
                        f"past the {limit_min:.0f}-minute limit; fix: make the tier cheaper (benchmarks/ci.md) or "
                        "find what loads this machine")  # fmt: skip
        else:
            goal = "within" if minutes <= goal_min else "past"
            said.append(f"set-up + unit + core + must-run: {minutes:.1f} min ({goal} the {goal_min:.0f}-minute goal, "
                        f"limit {limit_min:.0f})")  # fmt: skip
    return ok, said


def update_history(history: dict, ran: dict[str, dict], commit: str) -> dict:
    tests = history.setdefault("tests", {})
    for nodeid, entry in ran.items():
        if entry.get("outcome") in ("passed", "failed") or entry.get("outcome", "").startswith("error"):
            tests[nodeid] = {"ran_at": entry.get("ended_at", time.time()), "commit": commit,
                             "outcome": entry["outcome"], "seconds": entry["seconds"]}  # fmt: skip
    history.setdefault("runs", []).append({"commit": commit, "at": round(time.time(), 1)})
    history["runs"] = history["runs"][-50:]
    return history


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", type=Path, required=True)
    parser.add_argument("--record", type=Path, action="append", default=[])
    parser.add_argument("--history", type=Path, required=True)
    parser.add_argument("--commit", default="")
    parser.add_argument("--started", type=float, required=True)
    parser.add_argument("--limit-min", type=float, default=75.0)
    parser.add_argument("--goal-min", type=float, default=45.0)
    parser.add_argument("--out", type=Path, required=True, help="PREFIX: writes PREFIX.md and PREFIX.json")
    args = parser.parse_args(argv)
    inventory = load(args.inventory).get("tests", {})
    if not inventory:
        print(f"ci_report: no inventory at {args.inventory}; fix: run the collection step of .ci/run first")
        return 1
    ran, decisions = merge_records(args.record)
    history = load(args.history)
    lines = rows(inventory, ran, history.get("tests", {}))
    ok, said = verdict(inventory, ran, args.started, args.limit_min, args.goal_min)
    counts = {tier: sum(1 for r in lines if r["tier"] == tier) for tier in ("must-run", "core", "rotating")}
    ran_counts = {tier: sum(1 for r in lines if r["tier"] == tier and r["this_run"] != "not this run")
                  for tier in counts}  # fmt: skip
    summary = ", ".join(f"{tier} {ran_counts[tier]}/{counts[tier]} ran" for tier in counts)
    text = "\n".join([
        f"## CI engine tests, commit {args.commit or '?'} ({when(time.time())} UTC)", "", summary, "",
        *(f"- {line}" for line in said), "", table(lines), "",
        "Rotation and budget decisions:", *(f"- {'runs' if d['runs'] else 'not run'} ({d['tier']}): {d['module']}: "
                                            f"~{d['cost_s']:.0f} s, {d['why']}" for d in decisions),
    ])  # fmt: skip
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text + "\n")
    doc = {"commit": args.commit, "ok": ok, "verdict": said, "tests": lines, "decisions": decisions}
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    args.history.parent.mkdir(parents=True, exist_ok=True)
    args.history.write_text(json.dumps(update_history(history, ran, args.commit), indent=1) + "\n")
    print(f"summary: {args.out.with_suffix('.md')} and .json; history: {args.history}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
