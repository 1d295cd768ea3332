"""Check 2: the recipe's torch / transformers / flashinfer pins satisfy what vLLM declares at its pin.

A source tree declares requirements in pyproject.toml ([project] dependencies when static, and
[build-system] requires: a git build compiles against the recipe's torch), requirements/common.txt,
requirements/cuda.txt and the CUDA build requirements, with `-r` includes resolved; a wheel declares them
as Requires-Dist in its METADATA. Markers are evaluated for each of the recipe's platforms.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from email.parser import HeaderParser
from posixpath import dirname, join, normpath

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from sparkforge import oci
from sparkforge.recipe.loader import RecipeModel
from sparkforge.report import Check

# transformers releases that first know a model type (config class in transformers.models.auto).
MODEL_TYPE_MIN_TRANSFORMERS = {"qwen3_5": "5.2.0", "qwen3_5_moe": "5.2.0"}
SOURCE_REQUIREMENT_FILES = (
    "requirements/common.txt",
    "requirements/cuda.txt",
    "requirements/build.txt",
    "requirements/build/cuda.txt",
)


@dataclass(frozen=True)
class Declared:
    """One requirement vLLM declares, and where (file:line or METADATA)."""

    requirement: Requirement
    origin: str


def _requirement_lines(text: str) -> Iterable[tuple[int, str]]:
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if line and not line.startswith("#"):
            yield number, line


def read_requirement_file(
    read_text: Callable[[str], str | None], rel: str, seen: frozenset[str] = frozenset()
) -> list[Declared]:
    """Requirements of one pip requirements file, following `-r` includes; options are skipped."""
    text = read_text(rel)
    if text is None or rel in seen:
        return []
    out: list[Declared] = []
    for number, line in _requirement_lines(text):
        if line.startswith(("-r ", "--requirement ", "-r", "--requirement=")):
            target = line.split(None, 1)[1] if " " in line else line.split("=", 1)[-1].removeprefix("-r")
            out += read_requirement_file(
                read_text, normpath(join(dirname(rel), target.strip())), seen | {rel}
            )
            continue
        if line.startswith("-"):
            continue  # --extra-index-url, -c, -e ...: not requirements of a package
        try:
            out.append(Declared(Requirement(line), f"{rel}:{number}"))
        except InvalidRequirement:
            continue
    return out


def source_requirements(read_text: Callable[[str], str | None]) -> list[Declared]:
    """What a vLLM source tree declares for a CUDA build and install."""
    out: list[Declared] = []
    pyproject = read_text("pyproject.toml")
    if pyproject:
        data = tomllib.loads(pyproject)
        for section, items in (
            ("[project] dependencies", data.get("project", {}).get("dependencies", [])),
            ("[build-system] requires", data.get("build-system", {}).get("requires", [])),
        ):
            for item in items:
                try:
                    out.append(Declared(Requirement(item), f"pyproject.toml {section}"))
                except InvalidRequirement:
                    continue
    seen: set[str] = set()
    for rel in SOURCE_REQUIREMENT_FILES:
        for declared in read_requirement_file(read_text, rel):
            key = f"{declared.requirement}@{declared.origin}"
            if key not in seen:
                seen.add(key)
                out.append(declared)
    return out


def wheel_requirements(metadata: str) -> list[Declared]:
    """Requires-Dist of a wheel's METADATA."""
    message = HeaderParser().parsestr(metadata)
    out = []
    for item in message.get_all("Requires-Dist") or []:
        try:
            out.append(Declared(Requirement(item), "METADATA Requires-Dist"))
        except InvalidRequirement:
            continue
    return out


def marker_environment(platform: str, python: str) -> dict[str, str]:
    """PEP 508 marker values for a Linux container of `platform` running CPython `python`."""
    env = dict(default_environment())
    env.update(
        {
            "platform_machine": oci.PLATFORMS[platform].machine if platform in oci.PLATFORMS else platform,
            "sys_platform": "linux",
            "platform_system": "Linux",
            "os_name": "posix",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "python_version": python,
            "python_full_version": f"{python}.0",
            "extra": "",
        }
    )
    return env


def _applies(declared: Declared, env: dict[str, str]) -> bool:
    marker = declared.requirement.marker
    return marker is None or marker.evaluate(env)


def check_requirements(check: Check, declared: list[Declared], model: RecipeModel, *, subject: str) -> None:
    """Fill `check`: each pinned component within vLLM's declared ranges; transformers new enough."""
    envs = {p: marker_environment(p, model.python) for p in model.platforms}
    problems: list[str] = []
    components: dict[str, object] = {}
    for key, component in model.components.items():
        if key == "vllm":
            continue
        package = canonicalize_name(component.package or key)
        pinned = Version(component.version)
        constraints = []
        for platform, env in envs.items():
            for item in declared:
                if canonicalize_name(item.requirement.name) != package or not _applies(item, env):
                    continue
                spec = item.requirement.specifier
                ok = spec.contains(pinned, prereleases=True) if str(spec) else True
                constraints.append(
                    {"spec": str(spec) or "(any)", "from": item.origin, "platform": platform, "ok": ok}
                )
        bad = [c for c in constraints if not c["ok"]]
        components[key] = {"package": package, "pinned": component.version, "declared": constraints}
        if bad:
            specs = sorted({f"{c['spec']} ({c['from']})" for c in bad})
            problems.append(
                f"{package} {component.version} is outside {'; '.join(specs)}; "
                f"fix: set components.{key}.version to {_suggest(bad)}"
            )
    model_types = _model_type_problems(model)
    check.details = {"components": components, "model_types": model_types["details"]}
    problems += model_types["problems"]
    if not declared:
        check.details["note"] = "no declared requirements found"
    if problems:
        check.status = "failed"
        check.reason = f"{subject}: " + " | ".join(problems)
    else:
        pins = ", ".join(f"{c.package or k} {c.version}" for k, c in model.components.items() if k != "vllm")
        check.reason = f"{pins} satisfy {subject}'s requirements"


def _suggest(bad: list[dict[str, object]]) -> str:
    specs = {str(c["spec"]) for c in bad}
    exact = sorted(s.removeprefix("==").strip() for s in specs if s.startswith("==") and "*" not in s)
    if len(exact) == 1:
        return exact[0]
    return "a version in " + ", ".join(sorted(specs))


def _model_type_problems(model: RecipeModel) -> dict[str, list]:
    pinned = Version(model.components.transformers.version)
    details, problems = [], []
    for model_type in model.models.model_types:
        needed = MODEL_TYPE_MIN_TRANSFORMERS.get(model_type)
        if needed is None:
            details.append({"model_type": model_type, "needs": None, "ok": None})
            continue
        ok = pinned >= Version(needed)
        details.append({"model_type": model_type, "needs": f">={needed}", "ok": ok})
        if not ok:
            problems.append(
                f"transformers {pinned} does not know model type {model_type} (needs >= {needed}); "
                f"fix: set components.transformers.version to >= {needed} within vLLM's range"
            )
    return {"details": details, "problems": problems}
