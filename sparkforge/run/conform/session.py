"""`conform`: every row against a served profile, one report. It starts the profile or attaches to a running one
(`--attach URL`), asks the prompt set once (the reference pass every comparison starts from), then runs the
selected rows in the order sparkforge/run/conform/rows.py declares them.

Inputs are all checked before anything is started or stopped: the row names, the profile's conform settings,
the golden file, the attach URL answering. What conform started, it stops. With `--nodes A,B` conform brings the
profile up across the nodes as `cluster.up` does (doctor, plan, workers then the head) and asks from inside the
head container (its link address may be out of this machine's reach); the server variants need one node.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sparkforge.console import Stages
from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.recipe.conformspec import ConformSettings
from sparkforge.recipe.profile import Profile
from sparkforge.recipe.serveargs import norm_flag
from sparkforge.report import Report
from sparkforge.run.conform import golden as goldens
from sparkforge.run.conform import served_checks as checks
from sparkforge.run.conform.client import OpenAIClient, check_url
from sparkforge.run.conform.conformrun import ConformOptions, ConformRun
from sparkforge.run.conform.kernels import served_kernels
from sparkforge.run.conform.logprobs import TOP_K
from sparkforge.run.conform.rows import ROWS
from sparkforge.run.conform.servers import Servers
from sparkforge.run.nodes import NodeEngine

__all__ = ["ConformOptions", "parse_checks", "run_conform", "settings_of"]


def parse_checks(text: str) -> tuple[str, ...]:
    """A comma-separated list of row names (sparkforge/run/conform/rows.py); an unknown one is an error before
    anything starts."""
    return ROWS.parse(text)


def settings_of(profile: Profile) -> ConformSettings:
    return profile.model.conform or ConformSettings()


def profile_checks(profile: Profile) -> tuple[str, ...]:
    """The rows the profile's `conform.checks` names, in the registry's order (none named: every default row);
    a name the registry lacks is an error naming the file, line and key, before anything starts."""
    named = settings_of(profile).checks
    if not named:
        return ROWS.defaults()
    unknown = [n for n in named if n not in ROWS]
    if unknown:
        raise RunError(
            f"{profile.path}:{profile.line_of('conform', 'checks')}: conform.checks: unknown conform row "
            f"{', '.join(repr(n) for n in unknown)}; nothing was started; fix: choose from {', '.join(ROWS.names())}"
        )
    return tuple(n for n in ROWS.names() if n in named)


def run_conform(
    session: Session, engines: Sequence[NodeEngine], profile: Profile, options: ConformOptions
) -> Report:
    """Every selected row on `engines` (head first); the report says which ran, which failed (with the first
    divergence) and why skips."""
    engine = engines[0]
    settings = settings_of(profile)
    profiled = profile_checks(profile)  # judged by the registry before anything starts, --checks given or not
    selected = options.checks or profiled
    served = profile.model.served_model_name or profile.model.model
    model_dir = options.launch.model_dir if options.launch else None
    revision = goldens.model_revision(model_dir, served)
    inputs: dict[str, Any] = {"revision": revision}
    if "golden" in selected:
        inputs["golden"] = goldens.golden_input(options, profile.name, served, revision)
    report = Report(command="conform", subject=profile.name)
    servers = Servers(session, options.launch, options.doctor, options.health_timeout_s)
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
        servers.client = client  # reads a drafting server's counters before it stops
    try:
        if len(engines) > 1:
            client = servers.start_cluster(engines, profile)
        elif not options.attach:
            servers.start(engine, profile, "as profiled")
        if servers.started and len(engines) == 1:
            image = options.launch.image if options.launch else options.image_ref
            report.extra["kernels"] = served_kernels(engine, profile, image, options.gpu, model_dir)
        prompts = checks.prompt_set(settings)
        # A warm-up pass first: the reference pass is then a prefix-cache hit like every later one (like with like).
        checks.greedy(client, prompts, settings)
        start = time.monotonic()
        reference = checks.greedy(client, prompts, settings, logprobs=TOP_K)
        report.extra["reference_s"] = round(time.monotonic() - start, 1)
        report.extra["vllm"] = client.version()
        if "reference" in selected:  # tokenized while the server as profiled is up (the variants replace it)
            inputs["prompt_ids"] = [client.tokenize(p) for p in prompts]
            inputs.update(long_reference(client, profile, settings))
        run = ConformRun(
            report, client, engines, profile, settings, options, servers, session, prompts, reference, inputs
        )
        chosen = [row for row in ROWS if row.name in selected]
        with Stages("conform", len(chosen), echo=session.echo) as stages:
            for index, row in enumerate(chosen, 1):
                stages.stage(index, row.name)
                row.run(run)
    except RunError:  # a request outside the rows failed (a crashed engine core): its log is the evidence
        servers.keep_failed_logs(engines, profile, report, aborted=True)
        raise
    finally:
        servers.keep_failed_logs(engines, profile, report)
        servers.stop(engines, profile)
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


def long_reference(client: OpenAIClient, profile: Profile, settings: ConformSettings) -> dict[str, Any]:
    """The reference's long continuation (settings.reference.long_tokens of the long decode's prompt, greedy, with
    top-5 logprobs), capped to what the profile's max-model-len leaves after the prompt; {} when off."""
    wanted = settings.reference.long_tokens
    if not wanted:
        return {}
    prompt = settings.long_decode.prompt
    ids = client.tokenize(prompt)
    room = next(
        (v for k, v in profile.model.args.items() if norm_flag(k) == norm_flag("max-model-len")), None
    )
    fits = not isinstance(room, bool) and str(room).isascii() and str(room).isdigit()
    tokens = min(wanted, int(str(room)) - len(ids)) if fits else wanted
    if tokens < 1:
        return {}
    served = client.complete(prompt, tokens, logprobs=TOP_K, ignore_eos=settings.long_decode.ignore_eos)
    return {"long_prompt_ids": ids, "long_served": served}
