"""Build orchestration: preflight -> render -> BuildKit build to a candidate tag -> verify -> final tags."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sparkforge import engine, plan
from sparkforge.commands import Runner
from sparkforge.engine import BuildRequest, Engine
from sparkforge.errors import CommandError, EngineError, PreflightError, SparkforgeError, VerifyError
from sparkforge.recipe import REPO_ROOT, Recipe
from sparkforge.render import Context, render_context
from sparkforge.report import Report

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
    gpus: str = "auto"
    push_by_digest: bool = False
    dry: bool = False
    network: str | None = None
    sources: dict[str, str] = field(default_factory=dict)  # component -> tarball URL
    log_root: Path = REPO_ROOT / "logs"
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
    """--base-image REF (both stages) or builder=REF,runtime=REF -> build args."""
    if not value:
        return {}
    if "=" not in value:
        return {"BUILDER_IMAGE": value, "RUNTIME_IMAGE": value}
    out = {}
    for part in value.split(","):
        stage, _, ref = part.partition("=")
        if stage not in ("builder", "runtime") or not ref:
            raise SparkforgeError(
                f"--base-image {value!r}: use REF, or builder=REF,runtime=REF (stages: builder, runtime)"
            )
        out[f"{stage.upper()}_IMAGE"] = ref
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
    proc = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def _failure(log: Path | None, output: str) -> str:
    """Name the failing stage and the likely cause from BuildKit's plain log."""
    text = output[-20000:]
    stage = re.findall(r"\[([a-z0-9_-]+) +\d+/\d+\]", " ".join(re.findall(r"(?:ERROR|> )\[[^\]]+\]", text)))
    where = f" in stage '{stage[-1]}'" if stage else ""
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
    return f"build failed{where}; nothing was tagged.{hint} Log: {log}"


def parse_sources(items: Sequence[str]) -> dict[str, str]:
    """--source component=URL values -> {component: URL}."""
    sources = {}
    for item in items:
        name, _, url = item.partition("=")
        if not url or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise SparkforgeError(
                f"--source {item!r}: use component=URL, e.g. vllm=http://127.0.0.1:8000/vllm.tar.gz"
            )
        sources[name] = url
    return sources


def run_preflight_gate(recipe: Recipe, options: BuildOptions, echo: Callable[[str], None]) -> None:
    """Preflight before any build step; a failure stops the build before anything is built."""
    from sparkforge.preflight import run_preflight
    from sparkforge.report import print_report

    report = run_preflight(recipe, source=options.sources.get("vllm"))
    print_report(report, echo)
    if report.status != "passed":
        failed = ", ".join(c.name for c in report.failed)
        raise PreflightError(
            f"preflight failed ({failed}); nothing was built. Fix the recipe (see the table above), "
            "or build anyway with --no-preflight"
        )


def build(recipe: Recipe, options: BuildOptions, *, echo: Callable[[str], None] = print) -> BuildResult:
    """Preflight, build, verify, and only then tag; a failure at any step moves no tag and keeps the logs."""
    if options.preflight:
        run_preflight_gate(recipe, options, echo)
    from sparkforge.probe.gate import probe_gate, wants_probe

    probe_args = probe_gate(recipe, options, echo) if wants_probe(recipe, options) else {}
    platform = options.platform or recipe.model.platforms[0]
    context = render_context(recipe)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    log_dir = options.log_root / recipe.name / f"{stamp}-{platform.replace('/', '-')}"
    runner = Runner(dry=options.dry, log_dir=log_dir, echo=echo)
    try:
        eng = engine.detect_engine()
    except EngineError:
        if not options.dry:
            raise
        eng = Engine("docker", "buildx", "unknown")  # --dry shows the buildx form when no engine runs
    candidate = plan.candidate_tag(recipe, platform)
    if options.target != "runtime":
        candidate = f"{candidate}-{options.target}"
    build_args = {
        **parse_base_image(options.base_image),
        "SPARKFORGE_CREATED": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "SPARKFORGE_REVISION": _revision(),
        **probe_args,
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
    )
    command = engine.build_command(eng, request)
    # Pushing re-runs the same build (fully cached) with a push-by-digest output, only after verify passed.
    push_command = (
        engine.build_command(
            eng,
            dataclasses.replace(
                request,
                tags=(),
                no_cache=False,
                cache_to=(),
                push_by_digest=push_repo,
                metadata_file=options.metadata_file,
                attestations=True,
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
        raise EngineError(_failure(logs[-1] if logs else None, str(exc)) + "\n" + str(exc)[-1500:]) from None
    if options.target != "runtime":
        echo(
            f"sparkforge: stage {options.target} built as {candidate} (stages other than runtime are not verified or tagged)"
        )
        return result
    if options.verify:
        from sparkforge.report import print_report
        from sparkforge.verify import verify_image

        report = verify_image(recipe, candidate, gpus=options.gpus)  # type: ignore[arg-type]
        report_path = options.report_path or log_dir / "verify.json"
        report.write_json(report_path)
        result.verify = report
        print_report(report, echo)
        if report.status == "passed":
            from sparkforge.verify import record_verified

            record_verified(candidate, report)
        if report.status != "passed":
            raise VerifyError(
                f"verify failed for {candidate} ({', '.join(c.name for c in report.failed)}); no final tag was "
                f"applied. Report: {report_path}; logs: {log_dir}"
            )
    else:
        echo("sparkforge: WARNING: --no-verify: tagging an UNVERIFIED image")
    if push_command is not None:
        runner.run(push_command, "push-by-digest")
        echo(f"sparkforge: pushed {recipe.name} for {platform} by digest (metadata: {options.metadata_file})")
        return result
    if not options.tags and not gpu_verified(result.verify):
        # Moving tags (latest, {vllm}) promise a GPU-verified image; a CPU-only verify does not give that.
        final = scheme.immutable
        echo(
            f"sparkforge: moving tags ({', '.join(scheme.moving) or 'none'}) not moved: the FP8 checks did not run "
            "on a GPU. On the Spark: invoke verify --gpus all, then move them (invoke publish --promote)."
        )
    for tag in final:
        engine.tag_image(candidate, tag)
    result.tags = tuple(final)
    echo(f"sparkforge: {candidate} -> {', '.join(final)}")
    return result


def gpu_verified(report: Report | None) -> bool:
    """True when verify ran the FP8 checks on a GPU and none failed."""
    if report is None or report.status != "passed":
        return False
    fp8 = [c for c in report.checks if c.name.startswith("fp8.")]
    return any(c.status == "passed" for c in fp8)
