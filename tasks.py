"""sparkforge's command line (Invoke). Each task parses options, calls the library and prints the result."""

from __future__ import annotations

import sys
from pathlib import Path

from invoke import Collection, Context

from sparkforge.cli import LazyHelp, echo, finish_report, session, task, user_errors
from sparkforge.cli import bench as cli_bench
from sparkforge.cli import cluster as cli_cluster
from sparkforge.cli import community as cli_community
from sparkforge.cli import conform as cli_conform
from sparkforge.cli import diff as cli_diff
from sparkforge.cli import docs as cli_docs
from sparkforge.cli import memory as cli_memory
from sparkforge.cli import probe as cli_probe
from sparkforge.cli import publish as cli_publish
from sparkforge.cli import rebuild as cli_rebuild
from sparkforge.cli import run as cli_run
from sparkforge.cli import sbom as cli_sbom
from sparkforge.cli import sign as cli_sign
from sparkforge.cli import size as cli_size
from sparkforge.cli import trust as cli_trust

RECIPE_HELP = "recipe name in recipes/ or path to a recipe file"


def preflight_checks():
    """Preflight's checks registry, imported when asked (help or a preflight run), not by every command."""
    from sparkforge.preflight.checks import CHECKS

    return CHECKS


@task(
    help={
        "catalog": "instead: a folder (or https:// file) of community recipes, each checked for import",
        "recipe": "with --catalog: the sparkforge recipe whose pinned vLLM they are checked against",
        "offline": "with --catalog: cache only, no hub look-ups",
        "json": "with --catalog: write the rows as JSON here",
    }
)
@user_errors
def recipes(c: Context, catalog: str = "", recipe: str = "", offline: bool = False, json: str = "") -> None:
    """List the recipes with their one-line descriptions (or, with --catalog, a community catalog)."""
    from sparkforge.recipe.loader import list_recipe_names, load_recipe

    if catalog:
        return cli_community.catalog(catalog, recipe, offline, json)
    for name in list_recipe_names():
        echo(f"{name:28} {load_recipe(name).model.description}")


@task(help={"recipe": RECIPE_HELP})
@user_errors
def show(c: Context, recipe: str) -> None:
    """Print the resolved recipe (after extends) as YAML, with its hash."""
    import yaml

    from sparkforge.recipe.loader import load_recipe

    loaded = load_recipe(recipe)
    echo(f"# {loaded.name} ({loaded.path}); extends: {' -> '.join(p.name for p in loaded.chain)}")
    echo(f"# recipe hash: {loaded.hash}")
    echo(yaml.safe_dump(loaded.resolved(), sort_keys=False).rstrip())


@task(help={"recipe": RECIPE_HELP, "out": "directory to write <recipe>/ into (default: build/)"})
@user_errors
def render(c: Context, recipe: str, out: str = "") -> None:
    """Write the build context build/<recipe>/ (Dockerfile, patches, image tests, lock, build.sh)."""
    from sparkforge.imagebuild.render import render_context
    from sparkforge.recipe.loader import load_recipe

    context = render_context(load_recipe(recipe), Path(out) if out else None)
    echo(f"rendered {context.path}")


@task(
    iterable=["profile"],
    help={
        "recipe": RECIPE_HELP,
        "json": "write the JSON report here",
        "profile": "also check this serve profile's flags and parsers against the pinned vLLM (repeatable)",
        "source": "vLLM source: local checkout/dir, sdist path, or 'pypi'/'github' (default: pypi, then github)",
        "offline": "use only the download cache; skip checks that need a registry",
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
    recipe: str,
    json: str = "",
    source: str = "",
    offline: bool = False,
    github_base: str = "https://github.com",
    profile: list[str] | None = None,
    checks: str = "",
) -> None:
    """Upstream checks before building: model classes, requirements, patches, CMake arch plan, images."""
    from sparkforge.boundary import check_output
    from sparkforge.preflight.checks import PreflightOptions, run_preflight
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.recipe.profile import load_profile

    check_output(json, "--json")  # the boundary: before the network
    options = PreflightOptions(
        source=source or None,
        github_base=github_base,
        checks=preflight_checks().parse(checks) if checks else (),
        profiles=tuple(load_profile(p) for p in profile or []),
    )
    report = run_preflight(session(offline=offline), load_recipe(recipe), options)
    finish_report(report, json)


@task(
    iterable=["secret", "tag", "source", "cache_from", "cache_to"],
    help={
        "recipe": RECIPE_HELP,
        "platform": "linux/arm64 or linux/amd64 (default: the recipe's first platform)",
        "target": "stop at this stage (toolchain, source, build, runtime); only runtime is verified and tagged",
        "base_image": "override the base images: REF, or builder=REF,runtime=REF (mirrors, offline bases)",
        "ca_bundle": "PEM CA bundle passed as the BuildKit secret 'ca' (default: $SPARKFORGE_CA_BUNDLE)",
        "secret": "extra BuildKit secret, e.g. id=hf_token,env=HF_TOKEN (repeatable)",
        "tag": "final tag(s) instead of the recipe's scheme (repeatable)",
        "builder": "buildx builder to use (remote or multi-node BuildKit)",
        "no_cache": "do not use the build cache",
        "no_verify": "tag without verifying (loudly warned)",
        "no_preflight": "skip the upstream preflight checks",
        "no_probe": "source recipes: skip the compile probe that runs before the full compile",
        "push_by_digest": "push to the recipe's repository by digest (buildx; CI)",
        "metadata_file": "write BuildKit's metadata (digest) here",
        "source": "component=URL: fetch a component's source tarball from URL (e.g. vllm=http://127.0.0.1:8000/vllm.tar.gz)",
        "network": "network mode for RUN steps (e.g. host, to reach a local source server)",
        "gpus": "verify's GPU use: all, none or auto",
        "cache_from": "BuildKit cache source, e.g. type=registry,ref=ghcr.io/o/cache:R-arm64 (repeatable; buildx)",
        "cache_to": "BuildKit cache export, e.g. type=registry,ref=...,mode=max (repeatable; buildx)",
        "dry": "print exactly what would run, run nothing",
    },
)
@user_errors
def build(
    c: Context,
    recipe: str,
    platform: str = "",
    target: str = "runtime",
    base_image: str = "",
    ca_bundle: str = "",
    secret: list[str] | None = None,
    tag: list[str] | None = None,
    builder: str = "",
    no_cache: bool = False,
    no_verify: bool = False,
    no_preflight: bool = False,
    no_probe: bool = False,
    push_by_digest: bool = False,
    metadata_file: str = "",
    source: list[str] | None = None,
    network: str = "",
    gpus: str = "auto",
    cache_from: list[str] | None = None,
    cache_to: list[str] | None = None,
    dry: bool = False,
) -> None:
    """Preflight, BuildKit build to a candidate tag, verify, then the final tags."""
    from sparkforge.imagebuild.pipeline import build as run_build
    from sparkforge.imagebuild.stage import BuildOptions, parse_sources
    from sparkforge.oci import check_platform
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.recipe.plan import check_reference
    from sparkforge.verify.suite import gpu_mode

    if platform:
        check_platform("--platform", platform)  # the boundary: before the engine
    loaded = load_recipe(recipe)
    for ref in tag or ():
        check_reference("--tag", ref)  # before the hour-long build, not at tagging time
    options = BuildOptions(
        platform=platform or None,
        target=target,
        base_image=base_image or None,
        ca_bundle=Path(ca_bundle) if ca_bundle else None,
        secrets=tuple(secret or ()),
        tags=tuple(tag or ()),
        builder=builder or None,
        no_cache=no_cache,
        verify=not no_verify,
        gpus=gpu_mode(gpus),
        push_by_digest=push_by_digest,
        dry=dry,
        network=network or None,
        sources=parse_sources(
            source or [], [n for n, c in loaded.model.components.items() if c.source == "git"]
        ),
        preflight=not no_preflight,
        probe=not no_probe,
        metadata_file=Path(metadata_file) if metadata_file else None,
        cache_from=tuple(c for c in cache_from or () if c),  # empty: none (a release tag's build)
        cache_to=tuple(c for c in cache_to or () if c),
    )
    run_build(loaded, options, echo=echo)


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
    echo(f"sparkforge: image {found.image}: {found.why}")
    ref = found.image
    model = Path(model_dir) if model_dir else None
    # The result is kept per image ID; a failure revokes an earlier pass of the same image.
    options = VerifyOptions(gpu_mode(gpus), not no_kernels, model, carried=carried_with_kernels)
    result = verify_recorded(loaded, ref, options)
    finish_report(result, report, junit)


@task(
    iterable=["require"],
    help={
        "target": "a directory, a wheel/zip, a .so/.o file, or an image reference",
        "gpu": "GPU target, e.g. sm_121",
        "require": "library glob that must have kernels for the GPU (repeatable), e.g. 'vllm/_C*.so'",
        "recipe": "take --gpu and --require from this recipe",
        "json": "write the JSON report here",
    },
)
@user_errors
def audit(
    c: Context, target: str, gpu: str = "", require: list[str] | None = None, recipe: str = "", json: str = ""
) -> None:
    """Kernel coverage: which CUDA kernels in TARGET can run on the GPU (native, family, JIT, none)."""
    from sparkforge.audit.coverage import format_audit_table
    from sparkforge.boundary import check_output
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.verify.suite import audit_subject

    check_output(json, "--json")
    requires = list(require or [])
    if recipe:
        loaded = load_recipe(recipe)
        gpu = gpu or loaded.model.gpu
        requires = requires or list(loaded.model.audit.require)
    gpu = gpu or "sm_121"
    report = audit_subject(target, gpu, requires)
    echo(format_audit_table(report))
    if json:
        report.write_json(Path(json))
    if report.status != "passed":
        from invoke.exceptions import Exit

        raise Exit(f"sparkforge: audit failed: {report.failed[0].reason}", code=1)


@task(
    help={
        "recipe": RECIPE_HELP,
        "check": "fail on any floating or drifted reference (exit 1)",
        "strict": "with --check: also fail on any pin that could not be verified, e.g. unreachable (exit 3)",
        "write": "write resolved SHAs/digests back into the recipe file that states them",
    }
)
@user_errors
def lock(c: Context, recipe: str, check: bool = False, strict: bool = False, write: bool = False) -> None:
    """Resolve refs/tags to SHAs and digests (online), or check that nothing floats."""
    from sparkforge.boundary import check_exclusive
    from sparkforge.errors import InputError
    from sparkforge.preflight.lock import lock_recipe
    from sparkforge.recipe.loader import load_recipe

    check_exclusive(check=check, write=write)  # --check reads only; never one of them silently ignored
    if strict and not check:
        raise InputError("--strict applies to --check only; fix: run 'invoke lock --check --strict'")
    result = lock_recipe(load_recipe(recipe), check=check, strict=strict, write=write)
    echo(str(result))


@task
@user_errors
def lint(c: Context) -> None:
    """ruff, deptry, pip-audit of uv.lock, hadolint on every rendered Dockerfile, the workflow linters."""
    from sparkforge.imagebuild.lint import run_lint

    run_lint(echo)


@task(
    iterable=["package"],
    help={
        "package": "re-resolve only this package (repeatable; default: every package to its newest allowed)"
    },
)
@user_errors
def lock_update(c: Context, package: list[str] | None = None) -> None:
    """Re-resolve the project's own lock (uv.lock, .ci/uv.txt) and show what changed."""
    from sparkforge.commands import Runner
    from sparkforge.imagebuild.projectlock import update_lock

    changes = update_lock(Runner(), package or ())
    echo("\n".join(changes) if changes else "uv.lock: no version changed")


@task(help={"slow": "also run the slow real-world tests", "k": "pytest -k expression"})
@user_errors
def test(c: Context, slow: bool = False, k: str = "") -> None:
    """Run the test suite (the same command as README and CI)."""
    from sparkforge.commands import Command, Runner

    argv = [sys.executable, "-m", "pytest", "-q"]
    if slow:
        argv += ["-m", "slow or not slow"]
    if k:
        argv += ["-k", k]
    Runner().run(Command(tuple(argv)), "pytest")


# ---- engine -------------------------------------------------------------------------------------
@task(
    help={
        "qemu": "also register qemu-aarch64 (build and run arm64 images on x86)",
        "buildx": "also install buildx + Docker 26 from Debian trixie (pinned) and start that engine beside this one",
        "dry": "print only",
    }
)
@user_errors
def engine_up(c: Context, qemu: bool = False, buildx: bool = False, dry: bool = False) -> None:
    """Make a working Docker engine: install from the distribution if missing, start it, wait for it."""
    from sparkforge.commands import Runner
    from sparkforge.imagebuild.hostsetup import buildx_up
    from sparkforge.imagebuild.hostsetup import engine_up as up

    runner = Runner(dry=dry)
    for step in [*up(runner, qemu=qemu), *(buildx_up(runner) if buildx else [])]:
        echo(f"{step.name}: {step.done}")


@task(
    iterable=["platform"],
    help={"platform": "linux/amd64 and/or linux/arm64 (default both)", "force": "rebuild"},
)
@user_errors
def engine_bases(c: Context, platform: list[str] | None = None, force: bool = False) -> None:
    """Offline stand-in bases from Debian (debootstrap) for machines that cannot pull the recipe's bases."""
    from sparkforge.commands import Runner
    from sparkforge.imagebuild.hostsetup import build_bases

    for step in build_bases(Runner(stream=False), platform or ["linux/amd64", "linux/arm64"], force=force):
        echo(step.done)


engine_ns = Collection("engine")
engine_ns.add_task(engine_up, "up")
engine_ns.add_task(engine_bases, "bases")

lock_ns = Collection("lock")  # `invoke lock` pins a recipe; `invoke lock.update` the project's own uv.lock
lock_ns.add_task(lock, "recipe", default=True)
lock_ns.add_task(lock_update, "update")

ci_ns = Collection("ci")
ci_ns.add_task(cli_publish.ci_matrix, "matrix")

ns = Collection(recipes, show, render, preflight, build, verify, audit, lint, test)
ns.add_collection(lock_ns)
ns.add_task(cli_probe.probe)
ns.add_task(cli_publish.push)
ns.add_task(cli_publish.publish)
ns.add_task(cli_publish.pull)
ns.add_task(cli_publish.images)
ns.add_collection(cli_sign.ns)  # signing hook: sign, sign.attest, sign.install
ns.add_collection(cli_trust.ns)  # a publisher's TUF root: trust.init, rotate, recover, status
ns.add_task(cli_size.size)
ns.add_task(cli_sbom.sbom)
ns.add_task(cli_diff.diff)
ns.add_task(cli_diff.history)
ns.add_task(cli_diff.kernels)
ns.add_task(cli_rebuild.rebuild)
ns.add_task(cli_community.import_, "import")
ns.add_task(cli_community.export)
ns.add_collection(engine_ns)
ns.add_collection(ci_ns)
ns.add_collection(cli_run.serve_ns)
ns.add_collection(cli_cluster.cluster_ns)
ns.add_collection(cli_bench.ns)
ns.add_task(cli_conform.conform)
ns.add_task(cli_memory.memory)
ns.add_collection(cli_docs.ns)
