"""The build path's tasks: preflight, build, verify, audit, lock (and lock.update), lint, test. Each parses its
options once, takes the one Session of its call (cli/families.py) and calls the library."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from invoke import Collection, Context

from sparkforge.cli import LazyHelp, finish_report, task, user_errors
from sparkforge.cli.families import DRY, JSON, JSON_REPORT, NETWORK, RECIPE_HELP, Family, Outputs, opt
from sparkforge.context import Session


@dataclass(frozen=True)
class StageFlags:
    """The options a stage build shares with the compile probe (cli/probe.py) as given; `options` checks and
    parses them once (the one parse of --base-image)."""

    platform: str = opt("", "linux/arm64 or linux/amd64 (default: the recipe's first platform)")
    base_image: str = opt(
        "", "override the base images: REF, or builder=REF,runtime=REF (mirrors, offline bases)"
    )
    source: list[str] | None = opt(
        None,
        "component=URL: fetch a component's source tarball from URL (e.g. vllm=http://127.0.0.1:8000/vllm.tar.gz)",
    )
    network: str = opt("", "network mode for RUN steps (e.g. host, to reach a local source server)")
    no_cache: bool = opt(False, "do not use the build cache")

    def options(self, loaded):  # -> imagebuild.stage.BuildOptions
        """The stage's typed build options, every value checked before the engine is asked anything."""
        from sparkforge.imagebuild.stage import BuildOptions, parse_base_image, parse_sources, source_built
        from sparkforge.oci import check_platform

        if self.platform:
            check_platform("--platform", self.platform)
        return BuildOptions(
            platform=self.platform or None,
            bases=parse_base_image(self.base_image),
            no_cache=self.no_cache,
            network=self.network or None,
            sources=parse_sources(self.source or [], source_built(loaded)),
        )


STAGE = Family.of(StageFlags, "stage")


def preflight_checks():
    """Preflight's checks registry, imported when asked (help or a preflight run), not by every command."""
    from sparkforge.preflight.checks import CHECKS

    return CHECKS


@task(
    families=(NETWORK, JSON_REPORT),
    iterable=["profile"],
    help={
        "recipe": RECIPE_HELP,
        "profile": "also check this serve profile's flags and parsers against the pinned vLLM (repeatable)",
        "source": "vLLM source: local checkout/dir, sdist path, or 'pypi'/'github' (default: pypi, then github)",
        "github_base": "GitHub (or mirror) base URL for source archives",
        "checks": LazyHelp(
            lambda: preflight_checks().help_text(
                "comma-separated rows to run (default: all; others skipped):"
            )
        ),
    },
)
@user_errors
def preflight(
    c: Context,
    session: Session,
    outputs: Outputs,
    recipe: str,
    source: str = "",
    github_base: str = "https://github.com",
    profile: list[str] | None = None,
    checks: str = "",
) -> None:
    """Upstream checks before building: model classes, requirements, patches, CMake arch plan, images."""
    from sparkforge.preflight.checks import PreflightOptions, run_preflight
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.recipe.profile import load_profile

    options = PreflightOptions(
        source=source or None,
        github_base=github_base,
        checks=preflight_checks().parse(checks) if checks else (),
        profiles=tuple(load_profile(p) for p in profile or []),
    )
    outputs.finish(session, run_preflight(session, load_recipe(recipe), options))


@dataclass(frozen=True)
class BuildFlags(StageFlags):
    """build's own flags beyond the stage's, as given; `options` checks and parses them once."""

    target: str = opt(
        "runtime",
        "stop at this stage (toolchain, source, build-env, probe, build, base, runtime); only runtime is "
        "verified and tagged",
    )
    secret: list[str] | None = opt(None, "extra BuildKit secret, e.g. id=hf_token,env=HF_TOKEN (repeatable)")
    tag: list[str] | None = opt(None, "final tag(s) instead of the recipe's scheme (repeatable)")
    builder: str = opt("", "buildx builder to use (remote or multi-node BuildKit)")
    no_verify: bool = opt(False, "tag without verifying (loudly warned)")
    no_preflight: bool = opt(False, "skip the upstream preflight checks")
    no_probe: bool = opt(False, "source recipes: skip the compile probe that runs before the full compile")
    push_by_digest: bool = opt(False, "push to the recipe's repository by digest (buildx; CI)")
    metadata_file: str = opt("", "write BuildKit's metadata (digest) here")
    gpus: str = opt("auto", "verify's GPU use: all, none or auto")
    cache_from: list[str] | None = opt(
        None, "BuildKit cache source, e.g. type=registry,ref=ghcr.io/o/cache:R-arm64 (repeatable; buildx)"
    )
    cache_to: list[str] | None = opt(
        None, "BuildKit cache export, e.g. type=registry,ref=...,mode=max (repeatable; buildx)"
    )

    def options(self, loaded):  # -> imagebuild.stage.BuildOptions
        """The typed build options, every value checked before the engine is asked anything."""
        from dataclasses import replace

        from sparkforge.recipe.plan import check_reference
        from sparkforge.verify.suite import gpu_mode

        for ref in self.tag or ():
            check_reference("--tag", ref)  # before the hour-long build, not at tagging time
        return replace(
            super().options(loaded),
            target=self.target,
            secrets=tuple(self.secret or ()),
            tags=tuple(self.tag or ()),
            builder=self.builder or None,
            verify=not self.no_verify,
            gpus=gpu_mode(self.gpus),
            push_by_digest=self.push_by_digest,
            preflight=not self.no_preflight,
            probe=not self.no_probe,
            metadata_file=Path(self.metadata_file) if self.metadata_file else None,
            cache_from=tuple(c for c in self.cache_from or () if c),  # empty: none (a release tag's build)
            cache_to=tuple(c for c in self.cache_to or () if c),
        )


BUILDING = Family.of(BuildFlags, "building")


@task(
    families=(NETWORK, DRY, BUILDING, JSON),
    iterable=["secret", "tag", "source", "cache_from", "cache_to"],
    help={"recipe": RECIPE_HELP, "json": "with --dry: also write the plan as JSON here"},
)
@user_errors
def build(c: Context, session: Session, building: BuildFlags, outputs: Outputs, recipe: str) -> None:
    """Preflight, BuildKit build to a candidate tag, verify, then the final tags (--dry: print the plan)."""
    import json as json_lib

    from sparkforge.boundary import write_output
    from sparkforge.imagebuild.pipeline import execute, plan
    from sparkforge.recipe.loader import load_recipe

    loaded = load_recipe(recipe)  # the one load of this build
    options = building.options(loaded)
    made = plan(session, loaded, options)
    if outputs.json and made.dry:
        write_output(outputs.json, json_lib.dumps(made.to_dict(), indent=2) + "\n", "--json")
        session.out(f"plan: {outputs.json}")
    execute(session, made)


@task(
    help={
        "recipe": RECIPE_HELP,
        "image": "image to verify (default: the recipe's candidate tag for its first platform)",
        "gpus": "all (a skipped vLLM FP8 check fails), none or auto (GPU checks skip with a reason without a GPU)",
        "report": "write the JSON report here",
        "junit": "write JUnit XML here",
        "no_kernels": "skip the kernel-coverage audit of the image",
        "model_dir": "a small local model to serve once as a smoke test (needs a GPU)",
    }
)
@user_errors
def verify(
    c: Context,
    session: Session,
    recipe: str,
    image: str = "",
    gpus: str = "auto",
    report: str = "",
    junit: str = "",
    no_kernels: bool = False,
    model_dir: str = "",
) -> None:
    """Verify an image against its recipe: labels, lock, kernels, then the in-image suite."""
    from sparkforge.boundary import check_output
    from sparkforge.oci import check_reference
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry.pulled import resolve
    from sparkforge.registry.releases import carried_with_kernels
    from sparkforge.verify.suite import VerifyOptions, gpu_mode, verify_recorded

    if image:
        check_reference("--image", image)  # the boundary: before any engine call
    check_output(report, "--report")
    check_output(junit, "--junit")
    loaded = load_recipe(recipe)
    found = resolve(loaded, image, subject=True)  # the local build, else the digest pull verified
    session.echo(f"sparkforge: image {found.image}: {found.why}")
    model = Path(model_dir) if model_dir else None
    # The result is kept per image ID; a failure revokes an earlier pass of the same image.
    options = VerifyOptions(gpu_mode(gpus), not no_kernels, model, carried=carried_with_kernels)
    finish_report(verify_recorded(loaded, found.image, options), report, junit)


@task(
    families=(JSON_REPORT,),
    iterable=["require"],
    help={
        "target": "a directory, a wheel/zip, a .so/.o file, or an image reference",
        "gpu": "GPU target, e.g. sm_121",
        "require": "library glob that must have kernels for the GPU (repeatable), e.g. 'vllm/_C*.so'",
        "recipe": "take --gpu and --require from this recipe",
    },
)
@user_errors
def audit(
    c: Context,
    session: Session,
    outputs: Outputs,
    target: str,
    gpu: str = "",
    require: list[str] | None = None,
    recipe: str = "",
) -> None:
    """Kernel coverage: which CUDA kernels in TARGET can run on the GPU (native, family, JIT, none)."""
    from invoke.exceptions import Exit

    from sparkforge.audit.coverage import format_audit_table
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.verify.suite import audit_subject

    requires = list(require or [])
    if recipe:
        loaded = load_recipe(recipe)
        gpu = gpu or loaded.model.gpu
        requires = requires or list(loaded.model.audit.require)
    report = audit_subject(target, gpu or "sm_121", requires)
    session.out(format_audit_table(report))
    if outputs.json:
        report.write_json(Path(outputs.json))
    if report.status != "passed":
        raise Exit(f"sparkforge: audit failed: {report.failed[0].reason}", code=1)


@task(
    families=(NETWORK,),
    help={
        "recipe": RECIPE_HELP,
        "check": "fail on any floating or drifted reference (exit 1)",
        "strict": "with --check: also fail on any pin that could not be verified, e.g. unreachable (exit 3)",
        "write": "write resolved SHAs/digests back into the recipe file that states them",
    },
)
@user_errors
def lock(
    c: Context, session: Session, recipe: str, check: bool = False, strict: bool = False, write: bool = False
) -> None:
    """Resolve refs/tags to SHAs and digests (online), or check that nothing floats."""
    from sparkforge.boundary import check_exclusive
    from sparkforge.errors import InputError
    from sparkforge.preflight.lock import lock_recipe
    from sparkforge.recipe.loader import load_recipe

    check_exclusive(check=check, write=write)  # --check reads only; never one of them silently ignored
    if strict and not check:
        raise InputError("--strict applies to --check only; fix: run 'invoke lock --check --strict'")
    session.out(str(lock_recipe(session, load_recipe(recipe), check=check, strict=strict, write=write)))


@task
@user_errors
def lint(c: Context, session: Session) -> None:
    """ruff, deptry, pip-audit of uv.lock, hadolint on every rendered Dockerfile, the workflow linters."""
    from sparkforge.imagebuild.lint import run_lint

    run_lint(session)


@task(
    iterable=["package"],
    help={
        "package": "re-resolve only this package (repeatable; default: every package to its newest allowed)"
    },
)
@user_errors
def lock_update(c: Context, session: Session, package: list[str] | None = None) -> None:
    """Re-resolve the project's own lock (uv.lock, .ci/uv.txt) and show what changed."""
    from sparkforge.imagebuild.projectlock import update_lock

    changes = update_lock(session, package or ())
    session.out("\n".join(changes) if changes else "uv.lock: no version changed")


@task(help={"slow": "also run the slow real-world tests", "k": "pytest -k expression"})
@user_errors
def test(c: Context, session: Session, slow: bool = False, k: str = "") -> None:
    """Run the test suite (the same command as README and CI)."""
    from sparkforge.imagebuild.lint import run_tests

    run_tests(session, slow=slow, k=k)


lock_ns = Collection("lock")  # `invoke lock` pins a recipe; `invoke lock.update` the project's own uv.lock
lock_ns.add_task(lock, "recipe", default=True)
lock_ns.add_task(lock_update, "update")
