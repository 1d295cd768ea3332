"""`conform`: every check against a served profile, one report. It starts the profile (one server per
configuration the equivalence rows need, one after the other) or attaches to a running one (`--attach URL`).

Inputs are all checked before anything is started or stopped: the check names, the profile's conform settings,
the golden file, the attach URL answering. Server configurations: the profile as is (every check), then prefix
caching toggled, then chunked prefill off (vLLM requires chunked prefill for the hybrid models' prefix-cache
mode, so that one runs with prefix caching off too and is compared with the previous), then speculative
decoding off where the profile uses it. A configuration vLLM refuses to start is a `skipped` row with vLLM's
own words; the others still run. What conform started, it stops. With `--nodes A,B` conform brings the profile
up across the nodes as `cluster.up` does (doctor, plan, workers then the head) and asks from inside the head
container (its link address may be out of this machine's reach); the variants need one node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkforge.console import Echo
from sparkforge.errors import RunError
from sparkforge.preflight.knownbad import refusals
from sparkforge.recipe.conformspec import CHECKS, ConformSettings
from sparkforge.recipe.profile import Profile
from sparkforge.report import Check, Report
from sparkforge.run.conform import golden as goldens
from sparkforge.run.conform import served_checks as rows
from sparkforge.run.conform.apisurface import api
from sparkforge.run.conform.client import Completion, OpenAIClient, check_url
from sparkforge.run.conform.kernels import served_kernels
from sparkforge.run.conform.logprobs import TOP_K
from sparkforge.run.conform.reference import ReferenceRun, reference_row
from sparkforge.run.conform.servers import Servers
from sparkforge.run.facts import DoctorOptions
from sparkforge.run.launch import LaunchOptions
from sparkforge.run.nodes import NodeEngine
from sparkforge.run.postmortem import keep_logs

EQUIVALENCE_ROWS = ("streaming", "concurrency", "prefix-caching", "chunked-prefill", "speculative")


@dataclass(frozen=True)
class ConformOptions:
    checks: tuple[str, ...] = ()  # empty: the profile's (default: all)
    attach: str | None = None
    record: bool = False
    golden: Path | None = None  # default: golden/<profile>.json
    explicit_golden: bool = False
    launch: LaunchOptions | None = None
    health_timeout_s: float = 1800
    image_ref: str | None = None
    doctor: DoctorOptions | None = None  # several nodes: cluster.up's doctor before the launch
    gpu: str | None = None  # the recipe's GPU (sm_121): `invoke kernels`' prediction beside what vLLM logged


def parse_checks(text: str) -> tuple[str, ...]:
    """A comma-separated list of check names; an unknown one is an error before anything starts."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise RunError(
            f"--checks: unknown check {', '.join(repr(n) for n in unknown)}; nothing was started or stopped; "
            f"fix: choose from {', '.join(CHECKS)}"
        )
    return names


def settings_of(profile: Profile) -> ConformSettings:
    return profile.model.conform or ConformSettings()


def _norm(args: dict[str, Any]) -> dict[str, Any]:
    return {k.replace("_", "-"): v for k, v in args.items()}


def variant(profile: Profile, **changes: Any) -> Profile:
    """The profile with some serve flags set (None: removed); the same name, so the same container."""
    args = {k: v for k, v in _norm(profile.model.args).items() if k not in changes}
    args.update({k: v for k, v in changes.items() if v is not None})
    model = profile.model.model_copy(update={"args": args})
    return Profile(profile.name, profile.path, model, profile.lines)


def batch_invariant(profile: Profile) -> bool:
    """vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1): the one configuration held to exact equality."""
    value = str(profile.model.env.get("VLLM_BATCH_INVARIANT", "0")).strip()
    return value.lstrip("-").isdigit() and int(value) != 0  # vLLM's own reading: int(value) != 0


def prefix_caching_on(profile: Profile) -> bool:
    return _norm(profile.model.args).get("enable-prefix-caching", True) is not False


def run_conform(
    engines: Sequence[NodeEngine], profile: Profile, options: ConformOptions, *, echo: Echo
) -> Report:
    """Every selected check; the report says which ran, which failed (with the first divergence) and why skips."""
    engine = engines[0]
    settings = settings_of(profile)
    selected = options.checks or tuple(settings.checks)
    served = profile.model.served_model_name or profile.model.model
    model_dir = options.launch.model_dir if options.launch else None
    revision = goldens.model_revision(model_dir, served)
    golden_path = options.golden or Path("golden") / f"{profile.name}.json"
    golden = None
    if "golden" in selected and not options.record and (options.explicit_golden or golden_path.exists()):
        golden = goldens.read_golden(golden_path, served, revision)
    report = Report(command="conform", subject=profile.name)
    servers = Servers(options.launch, options.doctor, options.health_timeout_s)
    if options.attach:
        client = OpenAIClient(check_url(options.attach), served)
        try:
            client.models(timeout=10)
        except RunError as exc:
            raise RunError(f"--attach {options.attach}: {exc}; nothing was started or stopped") from None
    else:
        if options.launch is None:
            raise RunError("conform needs --attach URL or a launch (recipe, image, model)")
        _check_nodes(profile, engines)
        if engine.state(f"sparkforge-serve-{profile.name}-0").status == "running":
            raise RunError(
                f"profile {profile.name} is already running on {engine.node.label}; nothing was started or stopped; "
                f"fix: check it where it runs with --attach http://127.0.0.1:{options.launch.port}, or stop it first "
                f"('invoke serve.down --profile {profile.name}')"
            )
        client = OpenAIClient(f"http://127.0.0.1:{options.launch.port}", served)
    try:
        if len(engines) > 1:
            client = servers.start_cluster(engines, profile, echo)
        elif not options.attach:
            servers.start(engine, profile, echo, "as profiled")
        reference = _base_rows(
            report, client, profile, settings, selected, options, golden, revision, golden_path, engine, echo
        )
        prompt_ids = (
            [client.tokenize(p) for p in rows.prompt_set(settings)] if "reference" in selected else []
        )
        if servers.started and len(engines) == 1:
            image = options.launch.image if options.launch else options.image_ref
            report.extra["kernels"] = served_kernels(engine, profile, image, options.gpu, model_dir)
        if "equivalence" in selected:
            _variant_rows(report, client, engines, profile, settings, options, servers, echo, reference)
    finally:
        servers.keep_failed_logs(engines, profile, report, echo)
        servers.stop(engines, profile)
    if "reference" in selected:
        _reference_row(report, engine, profile, settings, options, reference, prompt_ids, echo)
    report.extra.update(
        {
            "profile": profile.name,
            "model": served,
            "vllm": report.extra.get("vllm"),
            "servers": servers.started,
            "settings": settings.model_dump(),
        }
    )
    return report


def _check_nodes(profile: Profile, engines: Sequence[NodeEngine]) -> None:
    if profile.model.nodes != len(engines):
        given = "one node" if len(engines) == 1 else f"{len(engines)} nodes (--nodes)"
        raise RunError(
            f"profile {profile.name} runs on {profile.model.nodes} node(s), conform was given {given}; nothing was "
            f"started or stopped; fix: pass --nodes with {profile.model.nodes} engines (A,B,...) for it, or a "
            "one-node profile without --nodes"
        )


def _timed(report: Report, echo: Echo, name: str, make: Callable[[], Check]) -> Check:
    start = time.monotonic()
    try:
        check = make()
    except RunError as exc:  # the server failed a request: that is this row's finding, the others still run
        check = Check(name, "failed", f"a request failed: {str(exc)[:500]}")
    check.duration_s = time.monotonic() - start
    report.add(check)
    echo(f"  {check.name}: {check.status} ({check.duration_s:.1f} s) {check.reason[:300]}")
    return check


def _base_rows(
    report, client, profile, settings, selected, options, golden, revision, golden_path, engine, echo
) -> list[Completion]:
    prompts = rows.prompt_set(settings)
    start = time.monotonic()
    # A warm-up pass first: the reference pass is then a prefix-cache hit like every later one (like with like).
    rows.greedy(client, prompts, settings)
    reference = rows.greedy(client, prompts, settings, logprobs=TOP_K)
    report.extra["reference_s"] = round(time.monotonic() - start, 1)
    report.extra["vllm"] = client.version()
    exact = batch_invariant(profile)
    if "determinism" in selected:
        _timed(report, echo, "determinism", lambda: rows.determinism(client, settings, reference))
    if "equivalence" in selected:
        _timed(report, echo, "equivalence:streaming",
               lambda: rows.streaming(client, settings, reference, exact=exact))  # fmt: skip
        _timed(report, echo, "equivalence:concurrency",
               lambda: rows.concurrency(client, settings, reference, exact=exact))  # fmt: skip
    if "prefix-cache" in selected:
        _timed(report, echo, "prefix-cache", lambda: _prefix_row(client, profile, settings))
    if "long-decode" in selected:
        _timed(report, echo, "long-decode", lambda: rows.long_decode(client, settings))
    if "api" in selected:
        _timed(report, echo, "api", lambda: api(client, profile, settings, reference))
    if "golden" in selected:
        image = options.launch.image if options.launch else options.image_ref
        provenance = {
            "profile": profile.name,
            "model": revision,
            "image": {"ref": image, "id": engine.image_id(image) if image else None},
            "vllm": report.extra["vllm"],
            "tokenizer_ids": goldens.tokenizer_fingerprint(client),
        }
        if options.record:
            _timed(
                report, echo, "golden", lambda: goldens.record(golden_path, prompts, reference, provenance)
            )
        elif golden is not None:
            _timed(
                report,
                echo,
                "golden",
                lambda: goldens.compare(golden, prompts, reference, provenance, client),
            )
        else:
            report.add(
                Check("golden", "skipped", f"no golden at {golden_path}; fix: record one with --record")
            )
    return reference


def _prefix_row(client: OpenAIClient, profile: Profile, settings: ConformSettings) -> Check:
    row = rows.prefix_cache(client, settings)
    if row.status == "failed" and not prefix_caching_on(profile):
        row.reason += " (the profile itself sets enable-prefix-caching: false)"
    return row


def _variant_rows(
    report, client, engines, profile, settings, options, servers, echo, reference: list[Completion]
) -> None:
    names = [f"equivalence:{n}" for n in EQUIVALENCE_ROWS[2:]]
    engine = engines[0]
    why = ""
    if options.attach:
        why = "--attach serves one configuration; fix: run conform without --attach to start the others"
    elif len(engines) > 1:
        why = (f"--nodes: conform checks the one configuration cluster.up serves across {len(engines)} nodes; "
               "fix: run the server variants with a one-node profile")  # fmt: skip
    if why:
        for name in names:
            report.add(Check(name, "skipped", why))
        return
    prompts = rows.prompt_set(settings)
    exact = batch_invariant(profile)
    on = prefix_caching_on(profile)
    no_prefix = variant(profile, **{"enable-prefix-caching": not on})
    refused = _known_bad(no_prefix, str(report.extra.get("vllm") or ""))
    outputs = refused or _run_variant(
        engine,
        no_prefix,
        options,
        servers,
        echo,
        prompts,
        settings,
        client,
        f"prefix caching {'off' if on else 'on'}",
    )
    _compare_variant(
        report,
        echo,
        names[0],
        reference,
        outputs,
        ("prefix caching " + ("on" if on else "off"), "off" if on else "on"),
        client,
        exact=exact,
    )
    args = _norm(profile.model.args)
    batched = max(int(args.get("max-model-len", 8192)), int(args.get("max-num-batched-tokens", 0) or 0))
    no_chunk = variant(
        profile,
        **{
            "enable-prefix-caching": False,
            "enable-chunked-prefill": False,
            "max-num-batched-tokens": batched,
        },
    )
    chunk_ref = outputs if on else reference
    outputs2 = _run_variant(
        engine, no_chunk, options, servers, echo, prompts, settings, client, "chunked prefill off"
    )
    _compare_variant(report, echo, names[1], chunk_ref, outputs2, ("chunked prefill on", "off"), client, exact=exact,
                     note="both sides with prefix caching off: vLLM requires chunked prefill for hybrid models' prefix-cache mode")  # fmt: skip
    if not args.get("speculative-config"):
        report.add(Check(names[2], "skipped", "the profile does not use speculative decoding"))
        return
    no_spec = variant(profile, **{"speculative-config": None})
    outputs3 = _run_variant(
        engine, no_spec, options, servers, echo, prompts, settings, client, "speculative decoding off"
    )
    _compare_variant(
        report, echo, names[2], reference, outputs3, ("speculative on", "off"), client, exact=exact
    )


def _reference_row(report, engine, profile, settings, options, served, prompt_ids, echo) -> None:
    """The served answers against transformers on the same weights, after every server conform started stopped."""
    why = ""
    if options.attach or options.launch is None:
        why = ("--attach: conform did not start the server, so it cannot free its memory for the reference; fix: run "
               "conform without --attach (with --model-dir)")  # fmt: skip
    elif options.launch.model_dir is None:
        why = "the reference reads the weights from --model-dir; fix: pass --model-dir (the checkpoint's folder)"
    elif not prompt_ids:
        why = "the served prompts were not tokenized"
    if why:
        report.add(Check("reference", "skipped", why))
        echo(f"  reference: skipped: {why}")
        return
    echo(
        "conform: the transformers reference (the servers are stopped: one copy of the weights in memory) ..."
    )
    run = ReferenceRun(options.launch.image, options.launch.model_dir, options.launch.gpus)
    row = reference_row(engine, run, profile, served, prompt_ids, settings.max_tokens)
    report.add(row)
    echo(f"  reference: {row.status} ({row.duration_s:.1f} s) {row.reason[:600]}")


def _known_bad(profile: Profile, vllm: str) -> str:
    """A variant that is a known-bad combination (serve refuses it) is not started: the reason, else ''."""
    try:
        found = refusals(profile, vllm) if vllm else []
    except (ValueError, RunError):  # an unreadable version: the variant runs as before
        return ""
    return f"not started: {found[0].message()} (serve refuses it)" if found else ""


def _run_variant(
    engine, profile, options, servers, echo, prompts, settings, client, what
) -> list[Completion] | str:
    try:
        servers.start(engine, profile, echo, what)
    except RunError as exc:
        return f"vLLM refused {what}: {str(exc).splitlines()[0][:400]}"
    try:
        return rows.greedy(client, prompts, settings, logprobs=TOP_K)
    except RunError as exc:
        kept = keep_logs([engine], [f"sparkforge-serve-{profile.name}-0"])
        echo(f"  with {what} a request failed: the server's log is kept in {kept}")
        return f"FAILED: with {what} a request failed: {str(exc)[:400]} (the server's log: {kept})"


def _compare_variant(
    report, echo, name, reference, outputs, sides, client, note: str = "", exact: bool = False
) -> None:
    if isinstance(outputs, str) or isinstance(reference, str):
        reason = outputs if isinstance(outputs, str) else reference
        status = "failed" if reason.startswith("FAILED: ") else "skipped"
        reason = reason.removeprefix("FAILED: ") if status == "failed" else f"skipped: {reason}"
        report.add(Check(name, status, reason))
        echo(f"  {name}: {status}: {reason}")
        return
    start = time.monotonic()
    row = rows.compare_row(name, reference, outputs, sides, client, exact=exact)
    row.duration_s = time.monotonic() - start
    if note:
        row.details["note"] = note
    report.add(row)
    echo(f"  {name}: {row.status} {row.reason[:300]}")
