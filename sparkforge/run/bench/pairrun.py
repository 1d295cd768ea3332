"""The executor of a two-image bench (pairing.PairPlan): each bench of the schedule serves its image with the
profile (serve's own start: health, the answer check), benches it as `bench` does, stops it; every result is
stored with the run's `pairing` (order, position, role); then the baseline's benches, pooled, against the
candidate's, pooled (bench.compare's interval with both sides' benches as benches).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from sparkforge.boundary import parse_json
from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.report import Report
from sparkforge.run.bench.compare import compare_docs, drift_from_results, pool
from sparkforge.run.bench.pairing import PairPlan, missing_images
from sparkforge.run.bench.runner import BenchOptions, run_bench
from sparkforge.run.bench.store import entries, save
from sparkforge.run.launchplan import LaunchPlan
from sparkforge.run.nodes import NodeEngine
from sparkforge.run.serve.serve import ServeOptions, serve_down, serve_up

Results = dict[str, list[tuple[str, dict[str, Any]]]]


def run_pairs(
    session: Session,
    pair: PairPlan,
    launches: dict[str, LaunchPlan],
    options: BenchOptions,
    store: str | None,
) -> Results:
    """Every bench of the schedule, in order, one server at a time; per role the stored results (path, doc)."""
    engine = NodeEngine(launches[pair.candidate].nodes[0])
    refusal = missing_images({image: engine.image_id(image) is not None for image in launches})
    if refusal:
        raise RunError(refusal)
    results: Results = {"baseline": [], "candidate": []}
    slots = pair.schedule()
    for slot in slots:
        plan = launches[slot.image]
        session.echo(f"bench {slot.position}/{len(slots)}: {slot.role} {slot.image} (order {pair.order()})")
        serve_up(
            session,
            engine,
            plan.profile,
            ServeOptions(plan.launch, chat=True, down_on_fail=True, containers=plan.containers),
        )
        try:
            report = run_bench(session, engine, plan.profile, replace(options, recipe_hash=plan.recipe.hash))
        finally:
            serve_down(engine, plan.profile.name)  # one server at a time: stopped before the next starts
        report.extra["pairing"] = {**pair.record(), "position": slot.position, "role": slot.role}
        text = json.dumps(report.to_dict(), indent=2) + "\n"
        path = save(report.to_dict(), text, store)
        session.echo(f"  stored: {path}")
        results[slot.role].append((str(path), parse_json(text, str(path))))  # as bench.compare reads it
    return results


def compare_pairs(pair: PairPlan, results: Results, threshold_pct: float, store: str | None) -> Report:
    """The baseline's benches pooled against the candidate's pooled (each bench kept as a bench), the drift
    between benches from the store (which now holds this run's benches too)."""
    sides = [
        pool(results[role]) if len(results[role]) > 1 else results[role][0][1]
        for role in ("baseline", "candidate")
    ]
    old, new = sides
    stored = [entry.doc for entry in entries(store)[0]]
    drift = drift_from_results(stored, new.get("model"), new["suite"]["name"])
    report = compare_docs(
        old,
        new,
        (f"baseline {pair.baseline}", f"candidate {pair.candidate}"),
        threshold_pct,
        allow_different=False,
        drift=drift,
    )
    report.extra["pairing"] = {**pair.record(), "results": {k: [p for p, _ in v] for k, v in results.items()}}
    return report
