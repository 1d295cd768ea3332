"""A build plan's stage run: render the context, BuildKit build to the candidate tag, verify a runtime stage, then
the tags or the push by digest the plan decided; a failure at any step moves no tag and keeps the logs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sparkforge import engine
from sparkforge.boundary import read_tail
from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.errors import CommandError, EngineError, VerifyError
from sparkforge.imagebuild.render import Context, render_context
from sparkforge.imagebuild.stage import BuildPlan
from sparkforge.recipe.budget import over_budget
from sparkforge.recipe.loader import Recipe
from sparkforge.registry.pushed import read_build_metadata
from sparkforge.report import Report
from sparkforge.verify import verified


@dataclass
class BuildResult:
    recipe: Recipe
    context: Context
    candidate: str
    tags: tuple[str, ...]
    log_dir: Path
    verify: Report | None = None
    command_line: str = ""


def run_stage(session: Session, plan: BuildPlan) -> BuildResult:
    """Run one stage's plan with the session (its commands logged under the plan's log folder); --dry prints it."""
    recipe, options = plan.recipe, plan.options
    context = Context(recipe, plan.request.context)
    result = BuildResult(
        recipe, context, plan.candidate, plan.tags, plan.log_dir, command_line=plan.command.shell_line()
    )
    if plan.dry:
        for line in plan.lines():
            session.out(line)  # --dry's result: the plan (printed with --quiet too)
        return result
    result.context = render_context(recipe, plan.request.context.parent, plan.bases)
    # The one place a build step gets a runner of its own: its numbered logs and replay scripts in the log folder.
    stage = session.with_runner(Runner(log_dir=plan.log_dir, echo=session.echo, stream=not session.quiet))
    runner, echo = stage.runner, session.echo
    echo(
        f"sparkforge: building {recipe.name} for {plan.platform} (target {options.target}); log: {plan.log_dir}"
    )
    try:
        runner.run(plan.command, "build")
    except CommandError as exc:
        logs = sorted(plan.log_dir.glob("*-build.log"))
        # BuildKit's output was streamed once above; the error is one paragraph, not the log again.
        raise EngineError(failure_paragraph(logs[-1] if logs else None, str(exc))) from None
    if plan.load is not None:  # reproducible on buildx's docker driver: a tarball, then `docker load`
        runner.run(plan.load, "load")
        plan.request.image_tar.unlink(missing_ok=True)
    push = plan.push_command
    if options.target != "runtime":
        if push is not None and not options.verify:
            # Only an explicitly unverified stage is pushed (smoke images of the publishing path).
            echo(f"sparkforge: WARNING: --no-verify: pushing stage {options.target} UNVERIFIED")
            runner.run(push, "push-by-digest")
            echo(
                f"sparkforge: pushed {recipe.name} for {plan.platform} by digest (metadata: {options.metadata_file})"
            )
        else:
            echo(
                f"sparkforge: stage {options.target} built as {plan.candidate} (stages other than runtime are not "
                "verified or tagged)"
            )
        return result
    inspected = engine.inspect_image(plan.candidate)
    image_id = str(inspected["Id"])  # everything below acts on this exact image
    # The recipe's image.max_size, before verify and before any tag (--no-verify too): an image over it moves none.
    heavy = over_budget(int(inspected.get("Size") or 0), recipe.model.image, len(recipe.model.runtime.remove))
    if heavy:
        raise VerifyError(f"build of {plan.candidate}: {heavy}; nothing was tagged. Log: {plan.log_dir}")
    if options.verify:
        result.verify = _verify(stage, plan, image_id)
    else:
        echo("sparkforge: WARNING: --no-verify: tagging an UNVERIFIED image")
    if push is not None:
        runner.run(push, "push-by-digest")
        if options.metadata_file is not None and options.verify:
            link_pushed_digest(options.metadata_file, image_id, recipe.model.publish.repository)
        echo(
            f"sparkforge: pushed {recipe.name} for {plan.platform} by digest (metadata: {options.metadata_file})"
        )
        return result
    result.tags = _tag(session, plan, image_id, result.verify)
    return result


def _tag(session: Session, plan: BuildPlan, image_id: str, report: Report | None) -> tuple[str, ...]:
    """Move the plan's tags to the image (only the immutable ones unless it is GPU-verified); the tags moved."""
    final, refused = plan.tags, ()
    if not verified.is_gpu_verified(verified.read_record(image_id), plan.recipe.model.gpu):
        # Moving tags (latest, {vllm}, or a --tag that names one) promise a GPU-verified image.
        final, refused = plan.unverified_tags, plan.refused
        why = (report.extra.get("gpu_verified") or {}).get("reason") if report else "--no-verify"
        session.echo(
            f"sparkforge: moving tags ({', '.join(refused or plan.moving) or 'none'}) not moved: {why}. On the "
            "Spark: invoke verify --gpus all, then move them (invoke publish --promote)."
        )
    for tag in final:
        engine.tag_image(image_id, tag)
    session.echo(f"sparkforge: {plan.candidate} ({image_id[:19]}) -> {', '.join(final) or '(no tag)'}")
    if refused:
        raise VerifyError(
            f"refusing --tag {', '.join(refused)}: a moving tag names only a GPU-verified image, and "
            f"{plan.candidate} is not GPU-verified for {plan.recipe.model.gpu}; the other tags were applied. Fix: "
            "on the target GPU, 'invoke verify --gpus all', then 'invoke publish --promote'"
        )
    return final


def _verify(session: Session, plan: BuildPlan, image_id: str) -> Report:
    """Verify the built image and keep its record (verify.verify_recorded); raise when it failed."""
    from sparkforge.report import print_report
    from sparkforge.verify.suite import VerifyOptions, verify_recorded

    report = verify_recorded(plan.recipe, image_id, VerifyOptions(plan.options.gpus, log_dir=plan.log_dir))
    report.subject = plan.candidate
    report.write_json(plan.report_path)
    print_report(report, session.echo)
    if report.status != "passed":
        raise VerifyError(
            f"verify failed for {plan.candidate} ({', '.join(c.name for c in report.failed)}); no final tag was "
            f"applied. Report: {plan.report_path}; logs: {plan.log_dir}"
        )
    return report


def failure_paragraph(log: Path | None, output: str) -> str:
    """One paragraph from BuildKit's plain log: failing stage and step, likely cause and fix, log and replay."""
    from sparkforge.commands import engine_stopped_message, stopped_engine_in

    text = read_tail(log, "build log", 40000) if log is not None and log.is_file() else output[-40000:]
    steps = re.findall(r"(?:ERROR: |> )\[([a-z0-9_-]+) +(\d+/\d+)\] ([^\n]{0,100})", text)
    where = ""
    if steps:
        stage, number, instruction = steps[-1]
        where = f" in stage '{stage}', step {number} ({instruction.strip().rstrip(':')})"
    replay = log.with_suffix(".sh") if log is not None else None
    lost = stopped_engine_in(output)
    if lost:  # the engine went away: name it and the step it was on (the last one BuildKit started)
        started = re.findall(r"^#\d+ \[(?:([a-z0-9_-]+) +)?(\d+/\d+)\] ([^\n]{0,100})", text, re.MULTILINE)
        step = steps[-1] if steps else started[-1] if started else None
        stage_name = f"stage '{step[0]}': " if step and step[0] else ""
        during = f"step {step[1]} ({stage_name}{step[2].strip()})" if step else "the build"
        return (
            f"build failed: {engine_stopped_message(lost, during)}. Nothing was tagged and no record was written. "
            f"Log: {log}; replay: {replay}"
        )
    hint = ""
    if "no space left on device" in text:
        hint = " The disk is full: free space ('docker system prune', 'docker builder prune') and retry."
    elif re.search(
        r"pull access denied|failed to resolve source metadata|not found: manifest unknown|failed to do request",
        text,
    ):
        hint = (
            " A base image could not be pulled (offline, or no access): pass --base-image REF (a mirror, or "
            "'invoke engine.bases' for offline Debian bases), or log in to the registry."
        )
    elif "CERTIFICATE_VERIFY_FAILED" in text:
        hint = " TLS verification failed behind a proxy: pass --ca-bundle PATH (or set SPARKFORGE_CA_BUNDLE)."
    elif re.search(r"No matching distribution found|Could not find a version|ResolutionImpossible", text):
        hint = (
            " pip could not install the pinned set (a missing version or conflicting pins): check the recipe's "
            "pins; 'invoke preflight' names the failing one."
        )
    return f"build failed{where}; nothing was tagged.{hint} Log: {log}; replay: {replay}"


def link_pushed_digest(
    metadata_file: Path, image_id: str, repository: str, directory: Path = verified.VERIFIED_DIR
) -> str:
    """After a push-by-digest rebuild: the pushed image must be the verified one (same config digest)."""
    meta = read_build_metadata(metadata_file)
    digest, config = meta.digest, meta.config_digest
    if config != image_id:
        raise VerifyError(
            f"the push-by-digest rebuild is not the verified image: config {config} != verified image ID "
            f"{image_id}. The rebuild was not reproduced from cache; its digest {digest} is NOT recorded as "
            "verified and 'invoke publish' will refuse it. Fix: rebuild and verify again, then push"
        )
    verified.link_digest(digest, image_id, repository, directory)
    return digest
