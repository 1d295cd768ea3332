"""Reading a bench result file safely: through the input boundary (a regular file of bounded size, strict JSON:
no NaN/Infinity, no key twice; its number and label rules for figures, levels and texts), in the current shape
(schema 2). Anything else is a one-paragraph RunError naming the file, what is wrong and the fix."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sparkforge.boundary import check_label, check_number, read_json
from sparkforge.errors import InputError, RunError

SCHEMA = 2
MAX_BYTES = 64 * 1024 * 1024
FIX = (
    "fix: pass a file written by 'invoke bench --json' (or one from the result store, 'invoke bench.history')"
)


def _bad(path: Path, where: str, why: str) -> RunError:
    return RunError(f"{path}: {where}: {why}; {FIX}")


def _figure(path: Path, where: str, value: Any) -> float:
    return float(check_number(f"{path}: {where}", value, low=0, high=math.inf, text=False))


def _check_level(path: Path, check: Any) -> None:
    if not isinstance(check, dict) or not isinstance(check.get("name"), str):
        raise _bad(path, "checks", "a check is not an object with a name")
    name = check["name"]
    if check.get("status") not in ("passed", "failed", "skipped"):
        raise _bad(path, name, f"status {check.get('status')!r} is not passed, failed or skipped")
    details = check.get("details")
    if not isinstance(details, dict):
        raise _bad(path, name, "no details")
    for key, low in (("concurrency", 1), ("depth", 0)):
        check_number(
            f"{path}: {name}: {key}", details.get(key), low=low, high=math.inf, integer=True, text=False
        )
    repeats = details.get("repeats")
    if not isinstance(repeats, list) or (check["status"] == "passed" and not repeats):
        raise _bad(path, name, "no repeats (a passed level holds one figure set per repeat)")
    for i, repeat in enumerate(repeats):
        if not isinstance(repeat, dict) or (check["status"] == "passed" and not repeat):
            raise _bad(path, f"{name} repeat {i}", "not an object of figures")
        for metric, value in repeat.items():
            _figure(path, f"{name} repeat {i} {metric}", value)


MAX_TEXT = 300  # an image reference, a model name, a vLLM version: a label in a chart and a table
MAX_LEVELS = 256  # tens in a real suite (spark-arena-v2: 4 x 7); a chart of thousands takes minutes


def _label_text(path: Path, where: str, value: Any, *, optional: bool = False) -> None:
    """Text that becomes a chart label or a table cell; no '$' (matplotlib reads '$...$' as mathtext, which can
    fail or run long on a crafted label)."""
    check_label(f"{path}: {where}", value, max_len=MAX_TEXT, forbid="$", optional=optional)


def _check_identity(path: Path, doc: dict[str, Any]) -> None:
    ident = doc["identity"]
    image, hardware = ident.get("image"), ident.get("hardware")
    if not isinstance(image, dict) or not (hardware is None or isinstance(hardware, dict)):
        raise _bad(path, "identity", "'image' must be an object (ref, id) and 'hardware' an object")
    for key in ("ref", "id"):
        _label_text(path, f"identity.image.{key}", image.get(key), optional=key == "ref")
    for key in ("vllm", "date"):
        _label_text(path, f"identity.{key}", ident.get(key))
    for key in ("recipe", "recipe_hash"):
        _label_text(path, f"identity.{key}", ident.get(key), optional=True)
    gpus = (hardware or {}).get("gpus") or []
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise _bad(path, "identity.hardware.gpus", "not a list of objects")
    _label_text(path, "model", doc["model"])
    _label_text(path, "suite.name", doc["suite"]["name"])


def load_result(path: Path, option: str = "bench result") -> dict[str, Any]:
    """A bench result (schema 2), validated; a RunError naming the file (as `option`) and the fault otherwise."""
    try:  # the boundary's one strict JSON reader: a regular file, no NaN/Infinity/1e309, no key twice
        doc = read_json(path, option, max_bytes=MAX_BYTES, expect=None, fix=FIX.removeprefix("fix: "))
    except InputError as exc:  # bench's callers (the store, compare) handle RunError
        raise RunError(str(exc)) from None
    if not isinstance(doc, dict) or doc.get("command") != "bench" or not isinstance(doc.get("checks"), list):
        raise RunError(f"{path}: not a bench result (no 'command': 'bench' with a list of checks); {FIX}")
    if doc.get("schema") != SCHEMA:
        raise RunError(
            f"{path}: a bench result of schema {doc.get('schema')!r}, this sparkforge reads schema {SCHEMA} "
            "(older results have no repeats or identity); fix: re-run 'invoke bench' with this version"
        )
    suite = doc.get("suite")
    if (
        not isinstance(suite, dict)
        or not isinstance(suite.get("name"), str)
        or not isinstance(suite.get("params"), dict)
    ):
        raise _bad(path, "suite", "missing its name and params")
    if not isinstance(doc.get("identity"), dict) or not isinstance(doc.get("model"), str):
        raise _bad(path, "identity", "missing (the image, hardware and serve command the figures belong to)")
    if not doc["checks"] or len(doc["checks"]) > MAX_LEVELS:
        raise _bad(path, "checks", f"no levels measured, or more than {MAX_LEVELS}")
    try:  # the boundary's number and label rules; bench's own fix in the message
        _check_identity(path, doc)
        for check in doc["checks"]:
            _check_level(path, check)
    except InputError as exc:
        raise RunError(f"{str(exc).rpartition('; fix:')[0]}; {FIX}") from None
    return doc


def levels(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{level name: check} of a loaded result."""
    return {c["name"]: c for c in doc["checks"]}
