"""vLLM's Rust extensions: the image must match the recipe's `build.rust` decision (a check for verify).

vLLM >= 0.31.0 builds two optional Rust artifacts through setuptools-rust and silently drops them when no cargo
exists: `vllm/vllm-rs` (the Rust frontend, used only with VLLM_USE_RUST_FRONTEND=1 or VLLM_USE_RUST_BENCH=1)
and `vllm/_rust_tool_parser*.so` (needed by vllm/tool_parsers/rust_tool_parser.py, i.e. the MiniMax-M3 tool
parser). A source recipe states `build.rust`; this check makes any difference from that statement loud.
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkforge import engine
from sparkforge.boundary import parse_json
from sparkforge.recipe.loader import Recipe
from sparkforge.report import Check

RUST_ARTIFACTS = ("vllm-rs", "_rust_tool_parser")
_LIST_SCRIPT = (
    "import importlib.util, json, os; spec = importlib.util.find_spec('vllm'); "
    "root = os.path.dirname(spec.origin) if spec and spec.origin else ''; "
    "print(json.dumps(sorted(n for n in (os.listdir(root) if root else []) "
    "if n == 'vllm-rs' or n.startswith('_rust_'))))"
)


def judge_rust(recipe: Recipe, present: Sequence[str]) -> Check:
    """Compare the Rust artifacts found in the vllm package with the recipe's build.rust."""
    check = Check(
        "rust-extensions", "passed", details={"build.rust": recipe.model.build.rust, "found": list(present)}
    )
    wanted = recipe.model.build.rust
    if wanted is None:
        check.status = "skipped"
        check.reason = "wheel recipe: the Rust artifacts are whatever the official wheel carries"
        return check
    found = {a for a in RUST_ARTIFACTS if any(p == a or p.startswith(a + ".") for p in present)}
    if wanted and found != set(RUST_ARTIFACTS):
        missing = sorted(set(RUST_ARTIFACTS) - found)
        check.status = "failed"
        check.reason = (
            f"build.rust is true but the image lacks {', '.join(missing)} (setuptools-rust drops them silently "
            "without cargo); fix: a builder image with cargo >= 1.95, or set build.rust: false"
        )
    elif not wanted and found:
        check.status = "failed"
        check.reason = (
            f"build.rust is false but the image has {', '.join(sorted(found))}; fix: set build.rust: true (and "
            "record it), or build without cargo"
        )
    else:
        check.reason = (
            f"{'with' if wanted else 'without'} vLLM's Rust extensions ({', '.join(RUST_ARTIFACTS)}), "
            "as build.rust states"
        )
    return check


def check_rust_extensions(recipe: Recipe, image: str) -> Check:
    """verify's check: list the Rust artifacts in the image's vllm package and judge them."""
    if recipe.model.build.rust is None:
        return judge_rust(recipe, [])
    run = engine.run_container(image, ["-c", _LIST_SCRIPT], entrypoint=["python3"], timeout_s=300)
    if run.exit_code != 0:
        return Check(
            "rust-extensions", "failed", f"could not list the vllm package in {image}: {run.stderr[-500:]}"
        )
    last = (run.stdout.strip().splitlines() or [""])[-1]
    return judge_rust(recipe, parse_json(last, f"the vllm package listing of {image}"))
