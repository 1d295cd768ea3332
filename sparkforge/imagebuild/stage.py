"""One stage built: render -> BuildKit build to a candidate tag -> verify (runtime) -> final tags; no gates."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sparkforge import engine
from sparkforge.commands import Command, Runner
from sparkforge.console import say
from sparkforge.engine import Engine
from sparkforge.errors import CommandError, EngineError, SparkforgeError, VerifyError
from sparkforge.imagebuild import epoch
from sparkforge.imagebuild.buildkit import BuildRequest, build_command, load_command
from sparkforge.imagebuild.render import Context, render_context
from sparkforge.recipe import plan
from sparkforge.recipe.budget import over_budget
from sparkforge.recipe.loader import REPO_ROOT, Recipe
from sparkforge.registry.pushed import read_build_metadata
from sparkforge.report import Report
from sparkforge.verify import verified
from sparkforge.verify.suite import GpuMode, resolve_gpus

CA_ENV = "SPARKFORGE_CA_BUNDLE"
SECRET_IDS = ("ca", "hf_token")


@dataclass(frozen=True)
class BuildOptions:
    platform: str | None = None
    target: str = "runtime"
    base_image: str | None = None  # REF for both stages, or builder=REF,runtime=REF
    ca_bundle: Path | None = None
    secrets: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    builder: str | None = None
    no_cache: bool = False
    verify: bool = True
    gpus: GpuMode = "auto"
    push_by_digest: bool = False
    dry: bool = False
    network: str | None = None
    sources: dict[str, str] = field(default_factory=dict)  # component -> tarball URL
    log_root: Path = plan.LOG_ROOT
    metadata_file: Path | None = None
    report_path: Path | None = None
    cache_from: tuple[str, ...] = ()  # BuildKit cache sources, e.g. type=registry,ref=...
    cache_to: tuple[str, ...] = ()
    preflight: bool = True
    probe: bool = True  # source recipes: the compile probe before the full compile (sparkforge/probe)


@dataclass
class BuildResult:
    recipe: Recipe
    context: Context
    candidate: str
    tags: tuple[str, ...]
    log_dir: Path
    verify: Report | None = None
    command_line: str = ""


def parse_base_image(value: str | None) -> dict[str, str]:
    """--base-image REF (both stages) or builder=REF,runtime=REF -> {"builder": REF, "runtime": REF}."""
    if not value:
        return {}
    if "=" not in value:
        return {"builder": value, "runtime": value}
    out = {}
    for part in value.split(","):
        stage, _, ref = part.partition("=")
        if stage not in ("builder", "runtime") or not ref:
            raise SparkforgeError(
                f"--base-image {value!r}: use REF, or builder=REF,runtime=REF (stages: builder, runtime)"
            )
        out[stage] = ref
    return out


def secret_args(options: BuildOptions) -> tuple[str, ...]:
    """BuildKit --secret values; the CA bundle from --ca-bundle or $SPARKFORGE_CA_BUNDLE."""
    out: list[str] = []
    ca = options.ca_bundle or (Path(os.environ[CA_ENV]) if os.environ.get(CA_ENV) else None)
    if ca is not None:
        if not ca.is_file():
            raise SparkforgeError(
                f"--ca-bundle {ca}: no such file; fix: pass a PEM bundle, e.g. /etc/ssl/certs/ca-certificates.crt"
            )
        out.append(f"id=ca,src={ca.resolve()}")
    for secret in options.secrets:
        fields = dict(part.partition("=")[::2] for part in secret.split(","))
        if "id" not in fields or not ({"src", "env"} & fields.keys()):
            raise SparkforgeError(
                f"--secret {secret!r}: use id=NAME,src=PATH or id=NAME,env=VAR (e.g. id=hf_token,env=HF_TOKEN)"
            )
        if "src" in fields and not Path(fields["src"]).is_file():
            raise SparkforgeError(f"--secret {secret!r}: {fields['src']} does not exist")
        out.append(secret)
    return tuple(out)


def _revision() -> str:
    result = Runner(stream=False).capture(
        Command.of("git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"), "revision", check=False
    )
    return result.output.strip() if result.returncode == 0 else "unknown"


def _failure(log: Path | None, output: str) -> str:
    """One paragraph from BuildKit's plain log: failing stage and step, likely cause and fix, log and replay."""
    from sparkforge.commands import engine_stopped_message, stopped_engine_in

    text = (log.read_text(errors="replace") if log is not None and log.is_file() else output)[-40000:]
    steps = re.findall(r"(?:ERROR: |> )\[([a-z0-9_-]+) +(\d+/\d+)\] ([^\n]{0,100})", text)
    if steps:
        stage, number, instruction = steps[-1]
        where = f" in stage '{stage}', step {number} ({instruction.strip().rstrip(':')})"
    else:
        where = ""
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


def parse_sources(items: Sequence[str], components: Sequence[str] = ("vllm",)) -> dict[str, str]:
    """--source component=URL values -> {component: URL}; only the recipe's source-built components, http(s)."""
    sources = {}
    for item in items:
        name, _, url = item.partition("=")
        if not url or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise SparkforgeError(
                f"--source {item!r}: use component=URL, e.g. vllm=http://127.0.0.1:8000/vllm.tar.gz"
            )
        if name not in components:
            raise SparkforgeError(
                f"--source {item!r}: the recipe builds no component {name!r} from source; fix: use one of "
                f"{', '.join(components) or '(none: this recipe installs wheels only)'}"
            )
        if not re.fullmatch(r"https?://[^\s]+", url):
            raise SparkforgeError(
                f"--source {item!r}: only http:// and https:// URLs are fetched; fix: serve the tarball over "
                "HTTP, e.g. 'python3 -m http.server' and vllm=http://127.0.0.1:8000/vllm.tar.gz"
            )
        sources[name] = url
    return sources


def check_options(recipe: Recipe, options: BuildOptions) -> str:
    """Every option checked before anything runs (an hour of building must not end in a usage error)."""
    platform = plan.recipe_platform(recipe, options.platform)
    gpu_runtime = options.gpus != "none"
    if options.verify and options.target == "runtime" and not options.dry:
        # --gpus all on an engine without the NVIDIA runtime fails here, not after
        gpu_runtime, _ = resolve_gpus(options.gpus)
    source_built = [n for n, c in recipe.model.components.items() if c.source == "git"]
    parse_sources([f"{k}={v}" for k, v in options.sources.items()], source_built)
    parse_base_image(options.base_image)
    moving = moving_requests(recipe, options.tags)
    if moving and (not options.verify or not gpu_runtime or options.target != "runtime"):
        raise VerifyError(
            f"--tag {', '.join(moving)}: a moving tag names only a GPU-verified image, and this build cannot "
            "make one (--no-verify, --gpus none, no NVIDIA runtime in the engine, or a stage other than "
            "runtime); fix: drop the tag, or build and verify with --gpus all on the target GPU"
        )
    return platform


def build_stage(
    recipe: Recipe,
    options: BuildOptions,
    *,
    echo: Callable[[str], None] = say,
    build_args: Mapping[str, str] | None = None,
) -> BuildResult:
    """Render, build the stage to a candidate tag, verify a runtime stage, and only then tag it."""
    platform = check_options(recipe, options)
    bases = plan.bases(recipe, parse_base_image(options.base_image))
    context = render_context(recipe, bases=bases)
    log_dir = plan.log_dir(recipe, platform, options.log_root)
    runner = Runner(dry=options.dry, log_dir=log_dir, echo=echo)
    try:
        eng = engine.buildx_driver(runner, engine.detect_engine(), options.builder)
    except EngineError:
        if not options.dry:
            raise
        eng = Engine("docker", "buildx", "unknown")  # --dry shows the buildx form when no engine runs
    candidate = plan.candidate_tag(recipe, platform)
    if options.target != "runtime":
        candidate = f"{candidate}-{options.target}"
    # Reproducible builds: the build's time is derived from its pinned bases, never the clock (build/epoch.py).
    stamp = epoch.for_build(recipe, bases, dry=options.dry)
    build_args = {
        "SOURCE_DATE_EPOCH": str(stamp.seconds),
        "SPARKFORGE_CREATED": stamp.iso,
        "SPARKFORGE_REVISION": _revision(),
        **(build_args or {}),
    }
    for component, url in options.sources.items():
        build_args[f"{component.upper()}_SOURCE_URL"] = url
    push_repo = recipe.model.publish.repository if options.push_by_digest else None
    request = BuildRequest(
        context=context.path,
        platform=platform,
        target=options.target,
        tags=(candidate,),
        build_args=build_args,
        secrets=secret_args(options),
        no_cache=options.no_cache,
        builder=options.builder,
        network=options.network,
        cache_from=options.cache_from,
        cache_to=options.cache_to,
        progress="plain" if os.environ.get("CI") or not os.isatty(2) else "auto",
        rewrite_timestamps=not (push_repo and eng.driver == "docker"),
    )
    command = build_command(eng, request)
    # Pushing re-runs the same build (fully cached) with a push-by-digest output, only after verify passed.
    push_command = (
        build_command(
            eng,
            dataclasses.replace(
                request,
                tags=(),
                no_cache=False,
                cache_to=(),
                push_by_digest=push_repo,
                metadata_file=options.metadata_file,
                attestations=True,
                staging_tag=f"{recipe.hash[:12]}-{platform.split('/')[-1]}",
                # Air-gapped builders cannot pull BuildKit's SBOM scanner image: "false" or "generator=REF".
                sbom=os.environ.get("SPARKFORGE_SBOM", "true"),
            ),
        )
        if push_repo
        else None
    )
    scheme = plan.final_tags(recipe, dt.datetime.now(dt.UTC).date())
    final = options.tags or (scheme.all if options.target == "runtime" and not push_repo else ())
    result = BuildResult(recipe, context, candidate, tuple(final), log_dir, command_line=command.shell_line())
    if options.dry:
        echo(f"# context: {context.path}")
        runner.run(command, "build")
        echo(f"# then: verify {candidate}, and only if it passes:")
        if push_command is not None:
            runner.run(push_command, "push-by-digest")
        else:
            echo(f"# tag: {' '.join(final) or '(none)'}")
        return result
    echo(f"sparkforge: building {recipe.name} for {platform} (target {options.target}); log: {log_dir}")
    try:
        runner.run(command, "build")
    except CommandError as exc:
        logs = sorted(log_dir.glob("*-build.log"))
        # BuildKit's output was streamed once above; the error is one paragraph, not the log again.
        raise EngineError(_failure(logs[-1] if logs else None, str(exc))) from None
    if (load := load_command(eng, request)) is not None:  # reproducible on buildx's docker driver: a tarball
        runner.run(load, "load")
        request.image_tar.unlink(missing_ok=True)
    if options.target != "runtime" and push_command is not None and not options.verify:
        # Only an explicitly unverified stage is pushed (smoke images of the publishing path).
        echo(f"sparkforge: WARNING: --no-verify: pushing stage {options.target} UNVERIFIED")
        runner.run(push_command, "push-by-digest")
        echo(f"sparkforge: pushed {recipe.name} for {platform} by digest (metadata: {options.metadata_file})")
        return result
    if options.target != "runtime":
        echo(
            f"sparkforge: stage {options.target} built as {candidate} (stages other than runtime are not verified or tagged)"
        )
        return result
    inspected = engine.inspect_image(candidate)
    image_id = str(inspected["Id"])  # everything below acts on this exact image
    # The recipe's image.max_size, before verify and before any tag (--no-verify too): an image over it moves none.
    heavy = over_budget(int(inspected.get("Size") or 0), recipe.model.image, len(recipe.model.runtime.remove))
    if heavy:
        raise VerifyError(f"build of {candidate}: {heavy}; nothing was tagged. Log: {log_dir}")
    if options.verify:
        result.verify = _verify(recipe, image_id, candidate, options, log_dir, echo)
    else:
        echo("sparkforge: WARNING: --no-verify: tagging an UNVERIFIED image")
    if push_command is not None:
        runner.run(push_command, "push-by-digest")
        if options.metadata_file is not None and options.verify:
            link_pushed_digest(options.metadata_file, image_id, recipe.model.publish.repository)
        echo(f"sparkforge: pushed {recipe.name} for {platform} by digest (metadata: {options.metadata_file})")
        return result
    refused: list[str] = []
    if not verified.is_gpu_verified(verified.read_record(image_id), recipe.model.gpu):
        # Moving tags (latest, {vllm}, or a --tag that names one) promise a GPU-verified image.
        refused = moving_requests(recipe, final) if options.tags else []
        final = tuple(t for t in final if t not in refused) if options.tags else scheme.immutable
        why = (
            (result.verify.extra.get("gpu_verified") or {}).get("reason") if result.verify else "--no-verify"
        )
        echo(
            f"sparkforge: moving tags ({', '.join(refused or scheme.moving) or 'none'}) not moved: {why}. On the "
            "Spark: invoke verify --gpus all, then move them (invoke publish --promote)."
        )
    for tag in final:
        engine.tag_image(image_id, tag)
    result.tags = tuple(final)
    echo(f"sparkforge: {candidate} ({image_id[:19]}) -> {', '.join(final) or '(no tag)'}")
    if refused:
        raise VerifyError(
            f"refusing --tag {', '.join(refused)}: a moving tag names only a GPU-verified image, and "
            f"{candidate} is not GPU-verified for {recipe.model.gpu}; the other tags were applied. Fix: on the "
            "target GPU, 'invoke verify --gpus all', then 'invoke publish --promote'"
        )
    return result


def moving_requests(recipe: Recipe, refs: Sequence[str]) -> list[str]:
    """The references among `refs` whose tag is a moving tag of the recipe (a name without a tag is :latest)."""
    from sparkforge.registry.trust import is_moving

    out = []
    for ref in refs:
        last = ref.rsplit("/", 1)[-1]
        tag = last.split(":", 1)[1] if ":" in last else "latest"
        if is_moving(recipe, tag) or tag in plan.final_tags(recipe, dt.datetime.now(dt.UTC).date()).moving:
            out.append(ref)
    return out


def _verify(
    recipe: Recipe,
    image_id: str,
    candidate: str,
    options: BuildOptions,
    log_dir: Path,
    echo: Callable[[str], None],
) -> Report:
    """Verify the built image and keep its record (verify.verify_recorded); raise when it failed."""
    from sparkforge.report import print_report
    from sparkforge.verify.suite import VerifyOptions, verify_recorded

    report = verify_recorded(recipe, image_id, VerifyOptions(options.gpus, log_dir=log_dir))
    report.subject = candidate
    report_path = options.report_path or log_dir / "verify.json"
    report.write_json(report_path)
    print_report(report, echo)
    if report.status != "passed":
        raise VerifyError(
            f"verify failed for {candidate} ({', '.join(c.name for c in report.failed)}); no final tag was "
            f"applied. Report: {report_path}; logs: {log_dir}"
        )
    return report


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
