"""The cluster doctor's memory stage: each node's MemAvailable, swap and page cache (read by the doctor's probe
from /proc/meminfo) against the profile's memory plan."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sparkforge.report import Check
from sparkforge.run.facts import NodeFacts


def memory_stage(check: Check, facts: Sequence[NodeFacts], plan: dict[str, Any] | None) -> None:
    """Each node's MemAvailable, swap and page cache against the memory plan: vLLM's start check needs the budget
    (gpu-memory-utilization x total) free when it starts; swap in use on unified memory means the host is already
    short; a large page cache is memory the budget can only get after the kernel drops it."""
    GiB = 1 << 30
    nodes = (plan or {}).get("nodes") or []
    problems, notes, rows = [], [], {}
    for fact in facts:
        mem = fact.host.get("memory") or {}
        if not mem.get("total"):
            notes.append(f"{fact.label}: /proc/meminfo not read")
            continue
        budget = next((n["budget_gib"] for n in nodes if n["node"] == fact.rank), None)
        swap = mem.get("swap_total", 0) - mem.get("swap_free", 0)
        rows[fact.label] = {"available_gib": round(mem.get("available", 0) / GiB, 2), "swap_used_gib": round(swap / GiB, 2),
                            "page_cache_gib": round(mem.get("page_cache", 0) / GiB, 2), "plan_budget_gib": budget}  # fmt: skip
        if budget is not None and mem.get("available", 0) < budget * GiB:
            problems.append(
                f"{fact.label}: {mem['available'] / GiB:.1f} GiB available, the plan's budget is {budget:.1f} GiB "
                "(vLLM's start check refuses less); fix: stop what holds memory there, drop the page cache "
                "('sync; echo 3 | sudo tee /proc/sys/vm/drop_caches'), or lower gpu-memory-utilization"
            )
        if swap > GiB:
            notes.append(
                f"{fact.label}: {swap / GiB:.1f} GiB of swap in use (the host is already short of memory)"
            )
    check.details = {"nodes": rows, "plan": {"verdict": plan.get("verdict")} if plan else None}
    if problems:
        check.status, check.reason = "failed", "; ".join(problems)
        return
    check.reason = "; ".join(
        f"{label} {row['available_gib']} GiB available, page cache {row['page_cache_gib']} GiB"
        + (f", budget {row['plan_budget_gib']} GiB" if row["plan_budget_gib"] is not None else "")
        for label, row in rows.items()
    ) + ("" if plan else " (no profile: no plan to compare)")
    if notes:
        check.reason += "; warning: " + "; ".join(notes)
