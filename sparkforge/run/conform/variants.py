"""The `equivalence` row: in the served configuration, streaming and concurrent requests against the reference
pass; then one server per configuration the row compares (prefix caching toggled, chunked prefill off, speculative
decoding off where the profile uses it), one after the other on one node. It runs last: its variants replace
the server the other rows ask.
"""

from __future__ import annotations

import time
from typing import Any

from sparkforge.errors import RunError
from sparkforge.preflight.knownbad import refusals
from sparkforge.recipe.profile import Profile
from sparkforge.report import Check
from sparkforge.run.conform import served_checks as checks
from sparkforge.run.conform.client import Completion
from sparkforge.run.conform.conformrun import ConformRun
from sparkforge.run.conform.logprobs import TOP_K
from sparkforge.run.conform.servers import refusal
from sparkforge.run.postmortem import keep_logs

# The rows this one writes, in order: two in the served configuration, three on server variants.
EQUIVALENCE_ROWS = ("streaming", "concurrency", "prefix-caching", "chunked-prefill", "speculative")


def norm(args: dict[str, Any]) -> dict[str, Any]:
    """Serve flags as vLLM spells them (a profile may write `max_model_len` or `max-model-len`)."""
    return {k.replace("_", "-"): v for k, v in args.items()}


def variant(profile: Profile, **changes: Any) -> Profile:
    """The profile with some serve flags set (None: removed); the same name, so the same container."""
    args = {k: v for k, v in norm(profile.model.args).items() if k not in changes}
    args.update({k: v for k, v in changes.items() if v is not None})
    model = profile.model.model_copy(update={"args": args})
    return Profile(profile.name, profile.path, model, profile.lines, profile.files)


def batch_invariant(profile: Profile) -> bool:
    """vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1): the one configuration held to exact equality."""
    value = str(profile.model.env.get("VLLM_BATCH_INVARIANT", "0")).strip()
    return value.lstrip("-").isdigit() and int(value) != 0  # vLLM's own reading: int(value) != 0


def prefix_caching_on(profile: Profile) -> bool:
    return norm(profile.model.args).get("enable-prefix-caching", True) is not False


def equivalence(run: ConformRun) -> None:
    """Streaming and concurrency in this server, then the server variants (skipped, named, when attached or
    across nodes)."""
    exact = batch_invariant(run.profile)
    run.timed(
        "equivalence:streaming",
        lambda: checks.streaming(run.client, run.settings, run.reference, exact=exact),
    )
    run.timed(
        "equivalence:concurrency",
        lambda: checks.concurrency(run.client, run.settings, run.reference, exact=exact),
    )
    _variant_rows(run)


def _variant_rows(run: ConformRun) -> None:
    names = [f"equivalence:{n}" for n in EQUIVALENCE_ROWS[2:]]
    profile, report = run.profile, run.report
    why = ""
    if run.options.attach:
        why = "--attach serves one configuration; fix: run conform without --attach to start the others"
    elif len(run.engines) > 1:
        why = (
            f"--nodes: conform checks the one configuration cluster.up serves across {len(run.engines)} nodes; "
            "fix: run the server variants with a one-node profile"
        )
    if why:
        for name in names:
            report.add(Check(name, "skipped", why))
        return
    on = prefix_caching_on(profile)
    no_prefix = variant(profile, **{"enable-prefix-caching": not on})
    refused = _known_bad(no_prefix, str(report.extra.get("vllm") or ""))
    outputs = refused or _run_variant(run, no_prefix, f"prefix caching {'off' if on else 'on'}")
    sides = ("prefix caching " + ("on" if on else "off"), "off" if on else "on")
    _compare_variant(run, names[0], run.reference, outputs, sides)
    args = norm(profile.model.args)
    batched = max(int(args.get("max-model-len", 8192)), int(args.get("max-num-batched-tokens", 0) or 0))
    no_chunk = variant(
        profile,
        **{
            "enable-prefix-caching": False,
            "enable-chunked-prefill": False,
            "max-num-batched-tokens": batched,
        },
    )
    chunk_ref = outputs if on else run.reference
    outputs2 = _run_variant(run, no_chunk, "chunked prefill off")
    _compare_variant(
        run,
        names[1],
        chunk_ref,
        outputs2,
        ("chunked prefill on", "off"),
        note="both sides with prefix caching off: vLLM requires chunked prefill for hybrid models' prefix-cache mode",
    )
    if not args.get("speculative-config"):
        report.add(Check(names[2], "skipped", "the profile does not use speculative decoding"))
        return
    no_spec = variant(profile, **{"speculative-config": None})
    outputs3 = _run_variant(run, no_spec, "speculative decoding off")
    _compare_variant(run, names[2], run.reference, outputs3, ("speculative on", "off"))


def _known_bad(profile: Profile, vllm: str) -> str:
    """A variant that a known-bad entry refuses, re-checked against this vLLM (its upstream report still open),
    is not started: the reason naming the report, else ''. vLLM itself starts it: only the report says it is
    wrong, and an entry not re-checked for this vLLM does not stop the variant from running."""
    try:
        found = [m for m in refusals(profile, vllm) if m.entry.rechecked_for(vllm)] if vllm else []
    except (ValueError, RunError):  # an unreadable version: the variant runs
        return ""
    return f"not started: {found[0].message()} (serve refuses it; vLLM does not)" if found else ""


def _run_variant(run: ConformRun, profile: Profile, what: str) -> list[Completion] | str:
    engine = run.engines[0]
    try:
        run.servers.start(engine, profile, what)
    except RunError as exc:
        refused = refusal(str(exc))
        if refused:
            return f"vLLM refused {what}: {refused!r}"
        # A crash, an OOM or no health is this configuration's failure: the exit paragraph carries vLLM's last lines.
        return f"FAILED: with {what} the server did not start: {str(exc)[-1500:]}"
    try:
        return checks.greedy(run.client, run.prompts, run.settings, logprobs=TOP_K)
    except RunError as exc:
        kept = keep_logs([engine], [f"sparkforge-serve-{profile.name}-0"])
        run.echo(f"  with {what} a request failed: the server's log is kept in {kept}")
        return f"FAILED: with {what} a request failed: {str(exc)[:400]} (the server's log: {kept})"


def _compare_variant(
    run: ConformRun,
    name: str,
    reference: list[Completion] | str,
    outputs: list[Completion] | str,
    sides: tuple[str, str],
    note: str = "",
) -> None:
    if isinstance(reference, str) and not isinstance(outputs, str):
        why = "its other side did not run (the row before says why)"
        run.report.add(Check(name, "skipped", f"skipped: {why}"))
        run.echo(f"  {name}: skipped: {why}")
        return
    if isinstance(outputs, str):
        reason = outputs
        status = "failed" if reason.startswith("FAILED: ") else "skipped"
        reason = reason.removeprefix("FAILED: ") if status == "failed" else f"skipped: {reason}"
        run.report.add(Check(name, status, reason))
        run.echo(f"  {name}: {status}: {reason}")
        return
    start = time.monotonic()
    row = checks.compare_row(name, reference, outputs, sides, run.client, exact=batch_invariant(run.profile))
    row.duration_s = time.monotonic() - start
    if note:
        row.details["note"] = note
    run.report.add(row)
    run.echo(f"  {name}: {row.status} {row.reason[:300]}")
