"""`run_preflight`: prove a recipe can build and serve before anything compiles (README: `invoke preflight`)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from sparkforge.errors import PreflightError
from sparkforge.extensions import Entry, Registry
from sparkforge.report import Check, Report

if TYPE_CHECKING:  # the rows import their modules when they run: `invoke --help` reads CHECKS, nothing else
    from sparkforge.context import Session
    from sparkforge.preflight.fetch import Fetcher
    from sparkforge.preflight.sources import UpstreamTree
    from sparkforge.recipe.loader import Recipe
    from sparkforge.recipe.profile import Profile


@dataclass
class Upstream:
    """What the rows of one preflight share: the recipe, the vLLM tree the `source` row found, and the tools."""

    recipe: Recipe
    source: str | None
    github_base: str
    fetcher: Fetcher
    session: Session
    scratch: Path  # the patched copy of the files the arch plan reads
    tree: UpstreamTree | None = None

    @property
    def subject(self) -> str:
        vllm = self.recipe.model.components.vllm
        return f"vLLM {vllm.version} ({(vllm.commit or '')[:9]})"


def check_source(check: Check, up: Upstream) -> None:
    from sparkforge.preflight.sources import resolve_upstream

    try:
        up.tree = resolve_upstream(
            up.session, up.recipe, source=up.source, github_base=up.github_base, fetcher=up.fetcher
        )
    except PreflightError as exc:
        check.status, check.reason = "failed", str(exc)
    else:
        check.details = up.tree.describe()
        check.reason = f"vLLM {up.recipe.model.components.vllm.version} from {up.tree.origin}"


def check_model_classes(check: Check, up: Upstream) -> None:
    from sparkforge.preflight.registry import check_models
    from sparkforge.preflight.sources import REGISTRY_PY

    tree = _tree(up)
    check_models(
        check,
        tree.source_text(REGISTRY_PY),
        REGISTRY_PY,
        list(up.recipe.model.models.architectures),
        subject=up.subject,
        module_exists=tree.exists,
    )


def check_declared_requirements(check: Check, up: Upstream) -> None:
    from sparkforge.preflight.requirements import check_requirements, source_requirements, wheel_requirements

    tree, model = _tree(up), up.recipe.model
    if tree.kind != "wheel":
        check_requirements(check, source_requirements(tree.source_text), model, subject=up.subject)
        return
    metadata = tree.wheel_metadata()
    if metadata is None:
        check.status, check.reason = "failed", f"{tree.origin} has no METADATA; fix: use a valid wheel"
    else:
        check_requirements(check, wheel_requirements(metadata), model, subject=up.subject)


def check_patch_series(check: Check, up: Upstream) -> None:
    from sparkforge.preflight.patches import check_patches
    from sparkforge.recipe.loader import REPO_ROOT

    tree = _tree(up)
    if tree.kind == "wheel":
        check.status, check.reason = "skipped", "a wheel is installed as built: nothing to patch"
        return
    paths = up.recipe.patch_paths()
    check_patches(up.session, check, tree.root, paths, up.scratch, subject=up.subject, repo_root=REPO_ROOT)


def check_base_images(check: Check, up: Upstream) -> None:
    from sparkforge.preflight.images import check_images

    check_images(check, up.recipe.model, up.fetcher)


def check_arch_plan(check: Check, up: Upstream) -> None:
    from sparkforge.preflight.archplan import ArchInputs, judge_plan, plan_arches, require_cmake

    recipe, tree, scratch, fetcher = up.recipe, _tree(up), up.scratch, up.fetcher
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
    problem = require_cmake(up.session)
    if problem:
        check.status, check.reason = "failed", problem
        return
    inputs = ArchInputs.of(recipe, fetcher)
    judge_plan(check, plan_arches(up.session, partial(tree.patched_text, scratch), inputs), inputs)


def _tree(up: Upstream) -> UpstreamTree:
    if up.tree is None:  # the `source` row runs first and the rest are skipped without it
        raise PreflightError("no vLLM source to check; fix: see the source check")
    return up.tree


PreflightCheck = Callable[[Check, Upstream], None]
# The preflight's rows, in the order they run (`source` first: every other row reads the tree it finds).
CHECKS: Registry[PreflightCheck] = Registry(
    "preflight",
    "--checks",
    [
        Entry(
            "source",
            "finds the pinned vLLM source (GitHub archive, PyPI sdist or wheel, or --source)",
            check_source,
        ),
        Entry(
            "models",
            "vLLM's model registry at the pin has every class in models.architectures",
            check_model_classes,
            key="models.architectures",
        ),
        Entry(
            "requirements",
            "vLLM's declared requirements agree with the recipe's pins",
            check_declared_requirements,
            key="components",
        ),
        Entry(
            "patches",
            "the patch series applies in order (git apply --check)",
            check_patch_series,
            key="components.*.patches",
        ),
        Entry(
            "arch-plan",
            "vLLM's own CMake selects kernels for the recipe's GPU (cmake -P)",
            check_arch_plan,
            key="build.torch_cuda_arch_list",
        ),
        Entry("images", "the base images exist at their pinned digests", check_base_images, key="images"),
    ],
    PreflightError,
    columns=("check", "what it checks", "recipe key"),
)


@dataclass(frozen=True)
class PreflightOptions:
    """What one preflight checks, as the user chose it.

    `source`: None (GitHub archive of the commit, falling back to PyPI's sdist of the release; PyPI's wheel for
    source: wheel), 'github', 'pypi', an archive URL, or a local checkout/directory/archive/wheel.
    `checks`: the rows to run (CHECKS.parse of `--checks`; none: every row; `source` always, the others read its
    tree); the rows not named are reported skipped. `profiles`: serve profiles whose flags are checked too.
    """

    source: str | None = None
    github_base: str | None = None  # None: https://github.com
    checks: tuple[str, ...] = ()
    profiles: tuple[Profile, ...] = ()


def run_preflight(session: Session, recipe: Recipe, options: PreflightOptions | None = None) -> Report:
    """Check the recipe against upstream facts at its pins; every check lands in the report, none raises."""
    from sparkforge.preflight.configvalues import check_value_kinds, tree_values
    from sparkforge.preflight.fetch import make_fetcher
    from sparkforge.preflight.knownbad import known_bad_check
    from sparkforge.preflight.pypi import WheelTarget
    from sparkforge.preflight.serveflags import check_serve_profiles, recipe_surface
    from sparkforge.preflight.sources import GITHUB

    options = options or PreflightOptions()
    checks, profiles = options.checks, options.profiles
    selected = {"source", *(checks or CHECKS.names())}  # every other row reads the tree `source` finds
    report = Report(command="preflight", subject=f"recipe {recipe.name}", recipe=recipe.name)
    with tempfile.TemporaryDirectory(prefix="sparkforge-preflight-") as tmp:
        up = Upstream(
            recipe,
            options.source,
            options.github_base or GITHUB,
            make_fetcher(offline=session.offline, ca_bundle=session.ca_bundle),
            session,
            Path(tmp) / "src",
        )
        up.scratch.mkdir()
        for entry in CHECKS:
            if entry.name not in selected:
                report.add(Check(entry.name, "skipped", f"not selected (--checks {','.join(checks)})"))
            elif entry.name != "source" and up.tree is None:
                report.add(Check(entry.name, "skipped", "no vLLM source to check (see the source check)"))
            else:
                with report.timed(entry.name) as check:
                    entry.run(check, up)
    if profiles and up.tree is not None:  # serve profiles: every flag and parser name against this vLLM
        tree = up.tree
        check_serve_profiles(report, recipe, profiles, lambda: recipe_surface(recipe, up.fetcher, tree))
        # the value allow-list's kinds (config classes, envs.py) against this vLLM's own
        component = recipe.model.components.vllm
        target = WheelTarget.of(recipe.model.platforms[0], recipe.model.python)
        with report.timed("serve-values") as check:
            check_value_kinds(
                check,
                lambda: tree_values(tree, up.fetcher, component.package or "vllm", target),
                f"vLLM {component.version}",
            )
        # silent wrong output reported upstream (sparkforge/preflight/known_bad.yaml)
        for profile in profiles:
            report.add(known_bad_check(profile, recipe.model.components.vllm.version))
    return report
