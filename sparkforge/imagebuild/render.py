"""Plan -> build context on disk: Dockerfile from the Jinja2 template, patches, image tests, lock, build.sh."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jinja2

from sparkforge.boundary import walk_tree, write_output
from sparkforge.errors import RenderError
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, Recipe, patch_file

TEMPLATES_DIR = REPO_ROOT / "dockerfiles"
# What every image carries in /opt/sparkforge/image-tests: verify's in-image suite (sparkforge/verify/inimage, the
# same files verify mounts to judge an image) and the run-time helpers the doctor runs in images (tests/image).
IMAGE_TESTS_DIRS = (REPO_ROOT / "sparkforge" / "verify" / "inimage", REPO_ROOT / "tests" / "image")
TEMPLATE = "vllm.Dockerfile.j2"
DEFAULT_BUILD_ROOT = REPO_ROOT / "build"

# Characters that would end a Dockerfile line, start an expansion or escape a quote.
_UNSAFE = re.compile(r"[\n\r\x00`$\\]")


def _guard(value: object) -> str:
    text = str(value)
    if _UNSAFE.search(text):
        raise RenderError(
            f"refusing to render {text!r}: it contains a newline, $, backtick or backslash, which could inject "
            "Dockerfile instructions or shell commands; fix the recipe value"
        )
    return text


def shell_quote(value: object) -> str:
    """Quote a value for a RUN line (POSIX shell)."""
    return shlex.quote(_guard(value))


def double_quote(value: object) -> str:
    """Quote a value for ARG/ENV/LABEL (Dockerfile double-quoted string)."""
    return '"' + _guard(value).replace('"', '\\"') + '"'


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["sh"] = shell_quote
    env.filters["dq"] = double_quote
    return env


def template_environment() -> jinja2.Environment:
    """The one Jinja2 environment every Dockerfile template renders in (StrictUndefined, `sh` and `dq` guards)."""
    return _environment()


def render_dockerfile(recipe: Recipe, bases: plan.Bases | None = None) -> str:
    """The Dockerfile text for a recipe (on its pinned base images unless `bases` overrides them)."""
    values = dataclasses.asdict(plan.template_values(recipe, bases))
    try:
        return _environment().get_template(TEMPLATE).render(**values)
    except jinja2.UndefinedError as exc:
        raise RenderError(
            f"{TEMPLATES_DIR / TEMPLATE}: {exc.message}; fix the template or the plan"
        ) from None


@dataclass(frozen=True)
class Context:
    """A rendered, self-contained build context."""

    recipe: Recipe
    path: Path

    @property
    def dockerfile(self) -> Path:
        return self.path / "Dockerfile"


def _build_script(recipe: Recipe, bases: plan.Bases) -> str:
    """build.sh: the same argv `invoke build` runs (buildkit.build_command), for buildx and for built-in BuildKit,
    with the same SOURCE_DATE_EPOCH (epoch.py: the newest `created` of the pinned base images, or the caller's)."""
    from sparkforge.engine import Engine
    from sparkforge.imagebuild.buildkit import SOURCE_DATE_EPOCH, BuildRequest, build_command
    from sparkforge.imagebuild.epoch import epoch_bases

    platform = recipe.model.platforms[0]
    request = BuildRequest(
        context=Path("."),
        platform=platform,
        target="runtime",
        tags=(plan.candidate_tag(recipe, platform),),
        build_args={
            "SPARKFORGE_CREATED": _CREATED,
            "SPARKFORGE_REVISION": _REVISION,
            SOURCE_DATE_EPOCH: _EPOCH,
        },
    )
    tarball = f"../.{recipe.name}-runtime.image.tar"  # beside the context, never inside it

    def line(engine: Engine) -> str:
        command = build_command(engine, request)
        argv = (
            shlex.join(command.argv[:-1])
            .replace(f"SPARKFORGE_CREATED={_CREATED}", '"SPARKFORGE_CREATED=$created"')
            .replace(f"{SOURCE_DATE_EPOCH}={_EPOCH}", f'"{SOURCE_DATE_EPOCH}=${SOURCE_DATE_EPOCH}"')
            .replace(f"SPARKFORGE_REVISION={_REVISION}", '"SPARKFORGE_REVISION=$revision"')
            .replace(str(request.image_tar), tarball)
        )
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(command.env.items()))
        return f'{env + " " if env else ""}{argv} "$@" {shlex.quote(command.argv[-1])}'

    refs = " ".join(shlex.quote(ref) for ref in epoch_bases(recipe, bases))
    lines = [
        "#!/usr/bin/env bash",
        f"# The replayable build of recipe {recipe.name} ({recipe.hash[:12]}) from this directory: the argv",
        "# `invoke build` runs (sparkforge.imagebuild.buildkit.build_command). Extra options (e.g. --secret",
        "# id=ca,src=/etc/ssl/certs/ca-certificates.crt) go after it. SOURCE_DATE_EPOCH (set it to replay one",
        "# image's `dev.sparkforge.source-date-epoch` label) defaults to the newest `created` of the pinned bases.",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        f'if [[ -z "${{{SOURCE_DATE_EPOCH}:-}}" ]]; then',
        f"  {SOURCE_DATE_EPOCH}=0",
        f"  for ref in {refs}; do",
        '    docker image inspect "$ref" >/dev/null 2>&1 || docker pull "$ref"',
        '    seconds=$(date -u -d "$(docker image inspect --format \'{{.Created}}\' "$ref")" +%s)',
        f"    if ((seconds > {SOURCE_DATE_EPOCH})); then {SOURCE_DATE_EPOCH}=$seconds; fi",
        "  done",
        "fi",
        f'created=$(date -u -d "@${SOURCE_DATE_EPOCH}" +%Y-%m-%dT%H:%M:%SZ)',
        "revision=${SPARKFORGE_REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}",
        "if docker buildx version >/dev/null 2>&1; then",
        "  # BuildKit 0.13 rewrites every layer's file times to the epoch; the docker driver's own exporter cannot",
        "  # (it unpacks), so there the image is written as a tarball and loaded.",
        "  driver=$(docker buildx inspect 2>/dev/null | awk '/^Driver:/ {d = $2} END {print d}')",
        '  if [[ "$driver" == docker ]]; then',
        "    " + line(Engine("docker", "buildx", "", "docker")),
        f"    docker load --input {tarball} && rm -f {tarball}",
        "  else",
        "    " + line(Engine("docker", "buildx", "", "docker-container")),
        "  fi",
        "else",
        "  # The engine's built-in BuildKit: the config's times follow the epoch, layer file times do not.",
        "  " + line(Engine("docker", "buildkit", "")),
        "fi",
    ]
    return "\n".join(lines) + "\n"


_CREATED = "@CREATED@"
_EPOCH = "@EPOCH@"
_REVISION = "@REVISION@"


def _copy_tree(source: Path, dest: Path) -> None:
    # The project's own scripts: regular files only (a link in them is never followed into the context).
    dest.mkdir(parents=True, exist_ok=True)
    for item in walk_tree(source, "in-image scripts"):
        if "__pycache__" in item.parts or item.suffix == ".pyc":
            continue
        target = dest / item.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(item, target)
        shutil.copymode(item, target)


def _write_context(recipe: Recipe, root: Path, bases: plan.Bases | None) -> None:
    root.mkdir(parents=True)
    write_output(root / "Dockerfile", render_dockerfile(recipe, bases), "build context")
    _copy_tree(TEMPLATES_DIR / "files", root / "files")
    patches_dir = root / "patches"
    patches_dir.mkdir()
    series = []
    for _, component in recipe.model.components.items():
        for patch in component.patches:
            shutil.copyfile(patch_file(patch), patches_dir / Path(patch).name)  # a regular file in patches/
            series.append(Path(patch).name)
    write_output(patches_dir / "series", "".join(f"{name}\n" for name in series), "build context")
    for folder in IMAGE_TESTS_DIRS:
        _copy_tree(folder, root / "image-tests")
    write_output(root / "constraints.txt", plan.constraints(recipe), "build context")
    lock = json.dumps(plan.lock(recipe, bases), indent=2, sort_keys=True) + "\n"
    write_output(root / "lock.json", lock, "build context")
    script = _build_script(recipe, bases or plan.bases(recipe))
    write_output(root / "build.sh", script, "build context", mode=0o755)


def render_context(recipe: Recipe, out_root: Path | None = None, bases: plan.Bases | None = None) -> Context:
    """Write build/<recipe>/ afresh; the same recipe and repository give the same bytes.

    `bases` (a --base-image override) is written into the Dockerfile, the labels and lock.json, so the image
    records the base it was really built on.

    The context is written beside the target and swapped in by rename, so a build reading the previous
    context never sees a half-written one.
    """
    parent = out_root or DEFAULT_BUILD_ROOT
    root = parent / recipe.name
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{recipe.name}.", dir=parent))
    try:
        _write_context(recipe, staging / "context", bases)
        if root.exists():
            old = staging / "old"
            root.rename(old)
        (staging / "context").rename(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Context(recipe=recipe, path=root)
