"""The `speculative-acceptance` row: the share of draft tokens the served configuration (as profiled) accepted,
from vLLM's own counters, against the floor the profile sets (`conform.speculative.min_acceptance`).

It runs after `equivalence`, whose variants replace the server as profiled: that server's counts were read
just before it stopped (sparkforge/run/conform/servers.py, its `spec_decode` entry in the report), so they cover
every request conform sent it. Where it still runs (no variants, an attached deployment, several nodes) its
/metrics is read now. A drafter that is accepted proves nothing about the answers (equivalence:speculative
does that); it shows the speculation pays: an untrained or mismatched draft head is accepted at ~0.
"""

from __future__ import annotations

import time

from sparkforge.errors import InputError, RunError
from sparkforge.report import Check
from sparkforge.run.conform.conformrun import ConformRun
from sparkforge.run.conform.spec_decode import SpecDecodeCounts, parse_spec_decode, uses_speculative

NAME = "speculative-acceptance"
KEY = "conform.speculative.min_acceptance"


def judge(counts: SpecDecodeCounts, floor: float | None) -> Check:
    """passed at or above the floor, failed below it or when nothing was drafted (speculation not running);
    without a floor the acceptance is reported and only drafting is required."""
    details = {**counts.as_report(), "min_acceptance": floor}
    counted = f"{counts.accepted_tokens} of {counts.draft_tokens} draft tokens accepted"
    if counts.acceptance is None:
        return Check(
            NAME,
            "failed",
            "vLLM counted 0 draft tokens: the server as profiled did not speculate although the profile sets a "
            "speculative-config (vllm:spec_decode_num_draft_tokens_total)",
            details,
        )
    rate = f"{counts.acceptance:.3f}"
    if floor is None:
        return Check(
            NAME,
            "passed",
            f"{counted} ({rate}); no floor set: fix: set {KEY} to judge it",
            details,
        )
    if counts.acceptance < floor:
        return Check(
            NAME, "failed", f"{counted}: acceptance {rate}, below the floor {floor} ({KEY})", details
        )
    return Check(
        NAME, "passed", f"{counted}: acceptance {rate}, at or above the floor {floor} ({KEY})", details
    )


def speculative_acceptance(run: ConformRun) -> None:
    """The as-profiled server's acceptance against the profile's floor; skipped without speculative decoding."""
    start = time.monotonic()
    floor = run.settings.speculative.min_acceptance
    first = run.servers.started[0] if run.servers.started else {}
    if not uses_speculative(run.profile):
        check = Check(NAME, "skipped", "the profile sets no speculative decoding (no speculative-config)")
    elif "spec_decode" in first:
        check = judge(SpecDecodeCounts.from_report(first["spec_decode"]), floor)
    elif "spec_decode_error" in first:
        check = Check(NAME, "failed", f"the server's counters were not read: {first['spec_decode_error']}")
    else:  # still serving: attached, several nodes, or no variant replaced it
        try:
            counts = parse_spec_decode(run.client.metrics(timeout=60), f"{run.client.base}/metrics")
            check = judge(counts, floor)
        except (RunError, InputError) as exc:
            check = Check(NAME, "failed", f"the server's counters were not read: {str(exc)[:600]}")
    check.duration_s = time.monotonic() - start
    run.report.add(check)
    run.echo(f"  {check.name}: {check.status} {check.reason[:300]}")
