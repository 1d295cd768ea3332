"""Check 1: the vLLM source registers every model architecture the recipe serves (read with ast, no import)."""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable
from dataclasses import dataclass

from sparkforge.report import Check

# First vLLM release registering an architecture (for the fix line; from the release notes / sdists).
FIRST_VLLM_RELEASE = {
    "Qwen3_5ForConditionalGeneration": "0.17.0",
    "Qwen3_5MoeForConditionalGeneration": "0.17.0",
    "Qwen3_5ForCausalLM": "0.17.0",
    "Qwen3_5MoeForCausalLM": "0.17.0",
    "Qwen3_5MTP": "0.17.0",
    "Qwen3_5MoeMTP": "0.17.0",
}
_REGISTRY_NAME = "_VLLM_MODELS"


@dataclass(frozen=True)
class Registration:
    """Where vLLM's registry points an architecture: module (under vllm/model_executor/models) and class."""

    module: str
    class_name: str


def _dict_literals(tree: ast.Module) -> dict[str, ast.Dict]:
    found: dict[str, ast.Dict] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.value, ast.Dict)
            and isinstance(node.target, ast.Name)
        ):
            found[node.target.id] = node.value
    return found


def _entries(name: str, dicts: dict[str, ast.Dict], seen: frozenset[str]) -> dict[str, Registration]:
    out: dict[str, Registration] = {}
    node = dicts.get(name)
    if node is None or name in seen:
        return out
    for key, value in zip(node.keys, node.values, strict=True):
        if key is None:  # {**_OTHER_MODELS}
            if isinstance(value, ast.Name):
                out.update(_entries(value.id, dicts, seen | {name}))
            continue
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            continue
        if isinstance(value, ast.Tuple) and len(value.elts) >= 2:
            module, cls = value.elts[0], value.elts[1]
            if isinstance(module, ast.Constant) and isinstance(cls, ast.Constant):
                out[key.value] = Registration(str(module.value), str(cls.value))
    return out


def registered_architectures(source: str) -> dict[str, Registration]:
    """Architecture -> registration, as vLLM's `_VLLM_MODELS` (or, failing that, every `_*_MODELS`) says."""
    dicts = _dict_literals(ast.parse(source))
    if _REGISTRY_NAME in dicts:
        return _entries(_REGISTRY_NAME, dicts, frozenset())
    merged: dict[str, Registration] = {}
    for name in dicts:
        if name.startswith("_") and name.endswith("_MODELS"):
            merged.update(_entries(name, dicts, frozenset()))
    return merged


def check_models(
    check: Check,
    registry_text: str | None,
    registry_path: str,
    wanted: list[str],
    *,
    subject: str,
    module_exists: Callable[[str], bool],
) -> None:
    """Fill `check`: every architecture in `wanted` must be registered in `registry_text`."""
    if registry_text is None:
        check.status = "failed"
        check.reason = (
            f"{subject} has no {registry_path}; fix: pin a vLLM release with a model registry (>= 0.17.0 "
            "for Qwen3.5)"
        )
        return
    try:
        registered = registered_architectures(registry_text)
    except SyntaxError as exc:
        check.status = "failed"
        check.reason = (
            f"{subject}: {registry_path} does not parse ({exc.msg}, line {exc.lineno}); fix: check the source"
        )
        return
    found = {a: registered[a] for a in wanted if a in registered}
    missing = [a for a in wanted if a not in registered]
    check.details = {
        "registry": registry_path,
        "registered": len(registered),
        "found": {
            a: {
                "module": f"vllm.model_executor.models.{r.module}",
                "class": r.class_name,
                "module_file": module_exists(f"vllm/model_executor/models/{r.module}.py")
                or module_exists(f"vllm/model_executor/models/{r.module}/__init__.py"),
            }
            for a, r in found.items()
        },
        "missing": missing,
    }
    if missing:
        hints = []
        for arch in missing:
            first = FIRST_VLLM_RELEASE.get(arch)
            near = difflib.get_close_matches(arch, list(registered), n=2, cutoff=0.8)
            hint = f"{arch} (first in vLLM {first})" if first else arch
            hints.append(hint + (f"; registered look-alikes: {', '.join(near)}" if near else ""))
        check.details["look_alikes"] = hints
        check.status = "failed"
        first = sorted({FIRST_VLLM_RELEASE[a] for a in missing if a in FIRST_VLLM_RELEASE})
        fix = f"pin vLLM >= {first[-1]}" if first else "pin a vLLM release that registers them"
        check.reason = (
            f"{subject} does not register {', '.join(missing)} ({len(registered)} architectures in "
            f"{registry_path}); fix: {fix}, or remove them from models.architectures"
        )
        return
    check.reason = f"{subject} registers {', '.join(wanted)}"
