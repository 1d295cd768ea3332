"""One build as data: the options parsed once, what this host says (`survey`), and the pure `plan_build` that
decides every argv, path and tag of the build before anything runs (pipeline.execute runs the plan; `invoke
build --dry` prints it). Nothing here calls a program except `survey`, through the session's runner."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sparkforge.commands import Command
from sparkforge.errors import EngineError, SparkforgeError, VerifyError
from sparkforge.imagebuild import epoch
from sparkforge.imagebuild.buildkit import BuildRequest, build_command, load_command
from sparkforge.imagebuild.render import DEFAULT_BUILD_ROOT
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, Recipe
from sparkforge.verify.suite import GpuMode, resolve_gpus

if TYPE_CHECKING:
    from sparkforge.context import Session
    from sparkforge.engine import Engine

STAGES = ("builder", "runtime")  # the stages --base-image names


@dataclass(frozen=True)
class BuildOptions:
    """What to build and how, parsed once (cli/build.py); the session carries the rest (--dry, the CA bundle)."""

    platform: str | None = None
    target: str = "runtime"
    bases: Mapping[str, str] = field(default_factory=dict)  # --base-image, parsed: {"builder": REF, ...}
    secrets: tuple[str, ...] = ()  # extra BuildKit secrets, "id=NAME,src=PATH" or "id=NAME,env=VAR"
    tags: tuple[str, ...] = ()
    builder: str | None = None
    no_cache: bool = False
    verify: bool = True
    gpus: GpuMode = "auto"
    push_by_digest: bool = False
    network: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict)  # component -> tarball URL
    log_root: Path = plan.LOG_ROOT
    metadata_file: Path | None = None
    report_path: Path | None = None
    cache_from: tuple[str, ...] = ()  # BuildKit cache sources, e.g. type=registry,ref=...
    cache_to: tuple[str, ...] = ()
    preflight: bool = True
    probe: bool = True  # source recipes: the compile probe before the full compile (sparkforge/probe)


@dataclass(frozen=True)
class BuildHost:
    """What this host and session say about a build, read once by `survey` (or given by a test)."""

    engine: Engine  # with the buildx driver of the builder in use
    epoch: epoch.Epoch  # SOURCE_DATE_EPOCH, from the pinned bases
    revision: str  # the checkout's commit, recorded in the image
    gpu_runtime: bool = False  # whether verify can use a GPU (--gpus and the engine's NVIDIA runtime)
    ca_bundle: Path | None = None  # the session's CA bundle, passed as the BuildKit secret 'ca'
    dry: bool = False
    progress: Literal["plain", "auto"] = (
        "plain"  # BuildKit's --progress: plain in CI and logs, auto on a terminal
    )
    sbom: str = "true"  # $SPARKFORGE_SBOM: air-gapped builders cannot pull BuildKit's scanner image
    now: dt.datetime = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)  # the log folder's stamp and the tags' date


@dataclass(frozen=True)
class BuildPlan:
    """Every decision of one build: the stage's argv (build, load, push), its folders, and the tags it may move."""

    recipe: Recipe
    options: BuildOptions
    platform: str
    bases: plan.Bases
    engine: Engine
    log_dir: Path
    candidate: str
    request: BuildRequest
    push: BuildRequest | None  # the cached re-run that pushes by digest, only after verify passed
    tags: tuple[str, ...]  # the tags moved when the image is GPU-verified
    # the tags moved when it is not: the immutable ones (or the explicit --tag values that are not moving)
    unverified_tags: tuple[str, ...]
    refused: tuple[str, ...]  # explicit --tag values that name a moving tag: refused unless GPU-verified
    moving: tuple[str, ...]  # the recipe's moving tags (said when they are not moved)
    epoch_source: str
    dry: bool
    probe: BuildPlan | None = None  # source recipes: the compile probe's stage, run before this one

    @property
    def verify(self) -> bool:
        return self.options.verify and self.options.target == "runtime"

    @property
    def report_path(self) -> Path:
        return self.options.report_path or self.log_dir / "verify.json"

    @property
    def command(self) -> Command:
        return build_command(self.engine, self.request)

    @property
    def load(self) -> Command | None:
        """`docker load` of the tarball a reproducible build on buildx's docker driver writes (None otherwise)."""
        return load_command(self.engine, self.request)

    @property
    def push_command(self) -> Command | None:
        return build_command(self.engine, self.push) if self.push is not None else None

    def with_build_args(self, args: Mapping[str, str]) -> BuildPlan:
        """The same plan with more build args (what the compile probe measured), in the build and the push."""
        more = {**self.request.build_args, **args}
        push = dataclasses.replace(self.push, build_args=more) if self.push is not None else None
        return dataclasses.replace(
            self, request=dataclasses.replace(self.request, build_args=more), push=push, probe=None
        )

    def lines(self) -> list[str]:
        """The plan as `invoke build --dry` prints it: what runs, in order, and what it decides."""
        out = [
            f"# build {self.recipe.name} (hash {self.recipe.hash[:12]}) for {self.platform}, target "
            f"{self.options.target}",
            f"# bases: builder {self.bases.builder}, runtime {self.bases.runtime}",
            f"# epoch: {self.request.build_args.get('SOURCE_DATE_EPOCH')} ({self.epoch_source})",
            f"# engine: {self.engine.docker} ({self.engine.mode}, driver {self.engine.driver or '-'})",
            f"# context: {self.request.context} (rendered first); logs: {self.log_dir}",
        ]
        if self.options.preflight:
            out.append("# preflight: the upstream checks first (a failure builds nothing)")
        if self.probe is not None:
            out += ["# compile probe first:", *(f"#   {line}" for line in self.probe.lines())]
            out.append(
                "# then the build, with --build-arg SPARKFORGE_UNIT_PEAK_GB=<the probe's measured unit peak>"
            )
        out.append(self.command.shell_line())
        if self.load is not None:
            out.append(self.load.shell_line())
        if self.options.target != "runtime" and not (self.push is not None and not self.options.verify):
            out.append(f"# stage {self.options.target}: not verified or tagged ({self.candidate})")
            return out
        out.append(
            f"# then: verify {self.candidate}, and only if it passes:" if self.verify else "# no verify"
        )
        if self.push_command is not None:
            out.append(self.push_command.shell_line())
        else:
            out.append(f"# tag: {' '.join(self.tags) or '(none)'}")
            if self.unverified_tags != self.tags:
                out.append(f"# if not GPU-verified, only: {' '.join(self.unverified_tags) or '(none)'}")
        return out

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON data (`invoke build --dry --json`)."""
        return {
            "recipe": self.recipe.name,
            "recipe_hash": self.recipe.hash,
            "platform": self.platform,
            "target": self.options.target,
            "bases": {"builder": self.bases.builder, "runtime": self.bases.runtime},
            "context": str(self.request.context),
            "log_dir": str(self.log_dir),
            "candidate": self.candidate,
            "preflight": self.options.preflight,
            "probe": self.probe.to_dict() if self.probe is not None else None,
            "build": list(self.command.argv),
            "load": list(self.load.argv) if self.load is not None else None,
            "verify": self.verify,
            "push": list(self.push_command.argv) if self.push_command is not None else None,
            "tags": list(self.tags),
            "unverified_tags": list(self.unverified_tags),
            "refused": list(self.refused),
        }


def parse_base_image(value: str | None) -> dict[str, str]:
    """--base-image REF (both stages) or builder=REF,runtime=REF -> {"builder": REF, "runtime": REF}."""
    if not value:
        return {}
    if "=" not in value:
        return dict.fromkeys(STAGES, value)
    out = {}
    for part in value.split(","):
        stage, _, ref = part.partition("=")
        if stage not in STAGES or not ref:
            raise SparkforgeError(
                f"--base-image {value!r}: use REF, or builder=REF,runtime=REF (stages: builder, runtime)"
            )
        out[stage] = ref
    return out


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


def source_built(recipe: Recipe) -> list[str]:
    """The recipe's components built from source (those --source may point at)."""
    return [n for n, c in recipe.model.components.items() if c.source == "git"]


def check_secrets(ca_bundle: Path | None, secrets: Sequence[str]) -> Path | None:
    """The session's CA bundle (resolved) once it and every --secret were found well-formed and present."""
    if ca_bundle is not None and not ca_bundle.is_file():
        raise SparkforgeError(
            f"--ca-bundle {ca_bundle}: no such file; fix: pass a PEM bundle, e.g. /etc/ssl/certs/ca-certificates.crt"
        )
    for secret in secrets:
        fields = dict(part.partition("=")[::2] for part in secret.split(","))
        if "id" not in fields or not ({"src", "env"} & fields.keys()):
            raise SparkforgeError(
                f"--secret {secret!r}: use id=NAME,src=PATH or id=NAME,env=VAR (e.g. id=hf_token,env=HF_TOKEN)"
            )
        if "src" in fields and not Path(fields["src"]).is_file():
            raise SparkforgeError(f"--secret {secret!r}: {fields['src']} does not exist")
    return ca_bundle.resolve() if ca_bundle is not None else None


def check_options(recipe: Recipe, options: BuildOptions, gpu_runtime: bool) -> str:
    """The build's platform, once every option was found usable (pure: survey calls it before it reads the
    engine or pulls a base, plan_build for a host given by hand)."""
    platform = plan.recipe_platform(recipe, options.platform)
    parse_sources([f"{k}={v}" for k, v in options.sources.items()], source_built(recipe))
    moving = moving_requests(recipe, options.tags)
    if moving and (not options.verify or not gpu_runtime or options.target != "runtime"):
        raise VerifyError(
            f"--tag {', '.join(moving)}: a moving tag names only a GPU-verified image, and this build cannot "
            "make one (--no-verify, --gpus none, no NVIDIA runtime in the engine, or a stage other than "
            "runtime); fix: drop the tag, or build and verify with --gpus all on the target GPU"
        )
    return platform


def survey(session: Session, recipe: Recipe, options: BuildOptions) -> BuildHost:
    """Read what the plan needs from this host, once: the engine and its buildx driver, the epoch of the pinned
    bases, the checkout's revision, whether verify can use a GPU. Under --dry nothing is pulled or required."""
    dry = session.runner.dry
    gpu_runtime = options.gpus != "none"
    if options.verify and options.target == "runtime" and not dry:
        # --gpus all on an engine without the NVIDIA runtime fails here, not after the build
        gpu_runtime, _ = resolve_gpus(options.gpus)
    check_options(recipe, options, gpu_runtime)  # before a base is pulled for the epoch
    ca_bundle = check_secrets(session.ca_bundle, options.secrets)
    from sparkforge.engine import Engine, buildx_driver

    try:
        found = buildx_driver(session.runner, session.container_engine, options.builder)
    except EngineError:
        if not dry:
            raise
        found = Engine("docker", "buildx", "unknown")  # --dry shows the buildx form when no engine runs
    revision = session.runner.capture(
        Command.of("git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"), "revision", check=False
    )
    return BuildHost(
        engine=found,
        # Reproducible builds: the build's time is derived from its pinned bases, never the clock (epoch.py).
        epoch=epoch.for_build(session, recipe, plan.bases(recipe, options.bases)),
        revision=revision.output.strip() if revision.returncode == 0 else "unknown",
        gpu_runtime=gpu_runtime,
        ca_bundle=ca_bundle,
        dry=dry,
        progress="plain" if os.environ.get("CI") or not os.isatty(2) else "auto",
        sbom=os.environ.get("SPARKFORGE_SBOM", "true"),
        now=dt.datetime.now(dt.UTC),
    )


def moving_requests(recipe: Recipe, refs: Sequence[str]) -> list[str]:
    """The references among `refs` whose tag is a moving tag of the recipe (a name without a tag is :latest)."""
    from sparkforge.registry.trust import is_moving

    out = []
    for ref in refs:
        last = ref.rsplit("/", 1)[-1]
        tag = last.split(":", 1)[1] if ":" in last else "latest"
        if is_moving(recipe, tag):
            out.append(ref)
    return out


def wants_probe(recipe: Recipe, options: BuildOptions) -> bool:
    """A build that compiles vLLM: a source recipe built to the build or runtime stage (--dry shows the probe)."""
    return (
        options.probe
        and options.target in ("build", "runtime")
        and recipe.model.components.vllm.source == "git"
    )


def probe_options(options: BuildOptions) -> BuildOptions:
    """The compile probe's stage of a build: the same inputs, target `probe`, nothing verified, tagged or pushed."""
    return BuildOptions(
        platform=options.platform,
        target="probe",
        bases=options.bases,
        builder=options.builder,
        no_cache=options.no_cache,
        verify=False,
        network=options.network,
        sources=options.sources,
        log_root=options.log_root,
        preflight=False,
        probe=False,
    )


def plan_build(recipe: Recipe, options: BuildOptions, host: BuildHost) -> BuildPlan:
    """Every argv, path and tag of one build, decided before anything runs (pure: no engine, no clock, no files;
    the usage errors an hour of building must not end in are raised here)."""
    platform = check_options(recipe, options, host.gpu_runtime)
    scheme = plan.final_tags(recipe, host.now.date())
    bases = plan.bases(recipe, options.bases)
    candidate = plan.candidate_tag(recipe, platform)
    if options.target != "runtime":
        candidate = f"{candidate}-{options.target}"
    build_args = {
        "SOURCE_DATE_EPOCH": str(host.epoch.seconds),
        "SPARKFORGE_CREATED": host.epoch.iso,
        "SPARKFORGE_REVISION": host.revision,
        **{f"{component.upper()}_SOURCE_URL": url for component, url in options.sources.items()},
    }
    push_repo = recipe.model.publish.repository if options.push_by_digest else None
    request = BuildRequest(
        context=DEFAULT_BUILD_ROOT / recipe.name,
        platform=platform,
        target=options.target,
        tags=(candidate,),
        build_args=build_args,
        secrets=(*([f"id=ca,src={host.ca_bundle}"] if host.ca_bundle else []), *options.secrets),
        no_cache=options.no_cache,
        builder=options.builder,
        network=options.network,
        cache_from=options.cache_from,
        cache_to=options.cache_to,
        progress=host.progress,
        rewrite_timestamps=not (push_repo and host.engine.driver == "docker"),
    )
    # Pushing re-runs the same build (fully cached) with a push-by-digest output, only after verify passed.
    push = (
        dataclasses.replace(
            request,
            tags=(),
            no_cache=False,
            cache_to=(),
            push_by_digest=push_repo,
            metadata_file=options.metadata_file,
            attestations=True,
            staging_tag=f"{recipe.hash[:12]}-{platform.split('/')[-1]}",
            sbom=host.sbom,
        )
        if push_repo
        else None
    )
    for checked in (request, push):  # an engine that cannot run a request says so now, not after the build
        if checked is not None:
            build_command(host.engine, checked)
    tags = options.tags or (scheme.all if options.target == "runtime" and not push_repo else ())
    refused = moving_requests(recipe, options.tags)
    return BuildPlan(
        recipe=recipe,
        options=options,
        platform=platform,
        bases=bases,
        engine=host.engine,
        # the probe's own folder: its numbered steps must not overwrite the build's (both are planned at once)
        log_dir=plan.log_dir(
            recipe, platform + ("-probe" if options.target == "probe" else ""), options.log_root, host.now
        ),
        candidate=candidate,
        request=request,
        push=push,
        tags=tuple(tags),
        unverified_tags=tuple(t for t in tags if t not in refused) if options.tags else scheme.immutable,
        refused=tuple(refused),
        moving=scheme.moving,
        epoch_source=host.epoch.source,
        dry=host.dry,
        probe=(plan_build(recipe, probe_options(options), host) if wants_probe(recipe, options) else None),
    )
