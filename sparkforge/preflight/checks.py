"""`run_preflight`: prove a recipe can build and serve before anything compiles (README: `invoke preflight`)."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sparkforge.commands import Runner
from sparkforge.errors import PreflightError
from sparkforge.preflight.archplan import ArchInputs, judge_plan, plan_arches, require_cmake
from sparkforge.preflight.fetch import Fetcher, make_fetcher
from sparkforge.preflight.images import check_images
from sparkforge.preflight.knownbad import known_bad_check
from sparkforge.preflight.patches import check_patches
from sparkforge.preflight.registry import check_models
from sparkforge.preflight.requirements import check_requirements, source_requirements, wheel_requirements
from sparkforge.preflight.serveflags import check_serve_profiles, recipe_surface
from sparkforge.preflight.sources import GITHUB, REGISTRY_PY, UpstreamTree, resolve_upstream
from sparkforge.recipe.loader import REPO_ROOT, Recipe
from sparkforge.report import Check, Report

if TYPE_CHECKING:
    from sparkforge.recipe.profile import Profile

CHECKS = ("source", "models", "requirements", "patches", "arch-plan", "images")


def run_preflight(
    recipe: Recipe,
    *,
    source: str | None = None,
    github_base: str = GITHUB,
    offline: bool = False,
    runner: Runner | None = None,
    fetcher: Fetcher | None = None,
    profiles: Sequence[Profile] = (),
) -> Report:
    """Check the recipe against upstream facts at its pins; every check lands in the report, none raises.

    `source`: None (GitHub archive of the commit, falling back to PyPI's sdist of the release; PyPI's
    wheel for source: wheel), 'github', 'pypi', an archive URL, or a local checkout/directory/archive/wheel.
    """
    runner = runner or Runner(stream=False)
    fetcher = fetcher or make_fetcher(offline=offline)
    model = recipe.model
    report = Report(command="preflight", subject=f"recipe {recipe.name}", recipe=recipe.name)
    tree: UpstreamTree | None = None
    with report.timed("source") as check:
        try:
            tree = resolve_upstream(
                recipe, source=source, github_base=github_base, fetcher=fetcher, runner=runner
            )
        except PreflightError as exc:
            check.status, check.reason = "failed", str(exc)
        else:
            check.details = tree.describe()
            check.reason = f"vLLM {model.components.vllm.version} from {tree.origin}"
    if tree is None:
        for name in CHECKS[1:]:
            report.add(Check(name, "skipped", "no vLLM source to check (see the source check)"))
        return report
    subject = f"vLLM {model.components.vllm.version} ({(model.components.vllm.commit or '')[:9]})"
    with report.timed("models") as check:
        check_models(
            check,
            tree.read_text(REGISTRY_PY),
            REGISTRY_PY,
            list(model.models.architectures),
            subject=subject,
            module_exists=tree.exists,
        )
    with report.timed("requirements") as check:
        if tree.kind == "wheel":
            metadata = tree.wheel_metadata()
            if metadata is None:
                check.status, check.reason = (
                    "failed",
                    f"{tree.origin} has no METADATA; fix: use a valid wheel",
                )
            else:
                check_requirements(check, wheel_requirements(metadata), model, subject=subject)
        else:
            check_requirements(check, source_requirements(tree.read_text), model, subject=subject)
    with tempfile.TemporaryDirectory(prefix="sparkforge-preflight-") as tmp:
        scratch = Path(tmp) / "src"
        scratch.mkdir()
        with report.timed("patches") as check:
            if tree.kind == "wheel":
                check.status, check.reason = "skipped", "a wheel is installed as built: nothing to patch"
            else:
                check_patches(
                    check,
                    tree.root,
                    recipe.patch_paths(),
                    scratch,
                    runner,
                    subject=subject,
                    repo_root=REPO_ROOT,
                )
        with report.timed("arch-plan") as check:
            _arch_plan(check, recipe, tree, scratch, fetcher, runner)
    with report.timed("images") as check:
        check_images(check, model, fetcher)
    if profiles:  # serve profiles: every flag and parser name against this vLLM (docs/run.md)
        check_serve_profiles(report, recipe, profiles, lambda: recipe_surface(recipe, fetcher, tree))
        for (
            profile
        ) in profiles:  # silent wrong output reported upstream (sparkforge/preflight/known_bad.yaml)
            report.add(known_bad_check(profile, recipe.model.components.vllm.version))
    return report


def _arch_plan(
    check: Check, recipe: Recipe, tree: UpstreamTree, scratch: Path, fetcher: Fetcher, runner: Runner
) -> None:
    if tree.kind == "wheel":
        check.status = "skipped"
        check.reason = (
            "a wheel's kernels are fixed at its build: kernel coverage of wheels is the audit's job"
        )
        return
    if not (tree.root / "CMakeLists.txt").is_file():
        check.status, check.reason = (
            "failed",
            f"{tree.origin} has no CMakeLists.txt; fix: pass a full source tree",
        )
        return
    problem = require_cmake(runner)
    if problem:
        check.status, check.reason = "failed", problem
        return

    def read_text(rel: str) -> str | None:
        patched = scratch / rel
        return patched.read_text() if patched.is_file() else tree.read_text(rel)

    inputs = ArchInputs.of(recipe, fetcher)
    judge_plan(check, plan_arches(read_text, inputs, runner), inputs)
