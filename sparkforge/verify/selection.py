"""vLLM's own kernel selection for the recipe's GPU, run inside an image (sparkforge/verify/inimage/vllm_selection.py).

The image's vLLM decides; this module only prepares the request (capability, the checkpoint's config.json, the
profile's arguments), runs the script in a throwaway container of the image, reads its one marker line and
caches the answer by everything it depends on (image ID, script bytes, request), so a second report is instant.

A wheel has no environment to run in: its selection runs in an image holding the same vLLM (`runner`), and
only after the wheel's Python files are shown to be byte-identical to that image's (RECORD sha256).
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkforge import engine
from sparkforge.boundary import parse_json, read_bytes, read_json, read_text, write_output
from sparkforge.context import cache_path, write_atomic
from sparkforge.errors import InputError, SparkforgeError
from sparkforge.verify.suite import SUITE_DIR, SUITE_MOUNT

SCRIPT = SUITE_DIR / "vllm_selection.py"
MAX_CONFIG_BYTES = 4 << 20  # a checkpoint's config.json, or the selection script
_SELECTION_FIX = "check that the image holds vLLM in /opt/venv and runs the checkout's vllm_selection.py"
MARKER = "SPARKFORGE-SELECTION:"
CAPABILITY = re.compile(r"sm_(\d{2,3})[af]?")
PYTHON = "/opt/venv/bin/python3"
REQUEST_MOUNT = "/opt/sparkforge/selection"


class SelectionError(SparkforgeError):
    """vLLM's selection could not be run or refused the input."""


def capability(gpu: str) -> str:
    """`gpu` checked to be sm_XY[a|f] (one-paragraph error otherwise)."""
    if not CAPABILITY.fullmatch(gpu):
        raise SelectionError(
            f"GPU {gpu!r} is not a CUDA capability of the form sm_XY[a|f] (e.g. sm_121, sm_120f, sm_90a), so vLLM's "
            "selection cannot be asked about it; fix: pass --gpu sm_121 or set the recipe's gpu"
        )
    return gpu


def read_model_config(path: Path) -> dict[str, Any]:
    """A checkpoint's config.json as a dict (one-paragraph error when it is not a JSON object)."""
    where = f"model config {path}"
    try:
        text = read_text(path, "model config", MAX_CONFIG_BYTES)
    except InputError as exc:
        raise SelectionError(
            f"{where}: cannot read it ({_reason(exc, where)}); fix: pass the checkpoint's config.json"
        ) from None
    try:
        data = parse_json(text, where)
    except InputError as exc:
        raise SelectionError(
            f"{where}: not JSON ({_reason(exc, where)}); vLLM reads a checkpoint's config.json as JSON; fix: pass "
            "the checkpoint's config.json (the file next to its safetensors), not a YAML or model card"
        ) from None
    if not isinstance(data, dict) or "architectures" not in data:
        raise SelectionError(
            f"model config {path}: a JSON {type(data).__name__} without 'architectures', not a checkpoint's "
            "config.json; fix: pass the config.json of the checkpoint the profile serves"
        )
    return data


def _reason(exc: InputError, where: str) -> str:
    """The boundary's refusal without its place and fix (the caller says both)."""
    return str(exc).removeprefix(f"{where}: ").rpartition("; fix:")[0]


def wheel_python_digests(wheel: Path) -> dict[str, str]:
    """`vllm/...py` -> sha256 (RECORD's urlsafe base64) of a wheel, from its RECORD."""
    with zipfile.ZipFile(wheel) as archive:
        record = next((n for n in archive.namelist() if n.endswith(".dist-info/RECORD")), None)
        if record is None:
            raise SelectionError(f"{wheel}: no .dist-info/RECORD; fix: pass a wheel built by pip/setuptools")
        lines = archive.read(record).decode().splitlines()
    out = {}
    for line in lines:
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[0].startswith("vllm/") and parts[0].endswith(".py"):
            out[parts[0]] = parts[1].removeprefix("sha256=")
    return out


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def run_selection(
    image: str,
    gpu: str,
    config: Mapping[str, Any],
    args: Mapping[str, Any],
    *,
    digests: bool = False,
    use_cache: bool = True,
) -> dict[str, Any]:
    """vLLM's selection in `image` for `gpu` and the checkpoint `config` (cached by image ID and request);
    `digests`: also the sha256 of the image's vLLM Python files (to compare a wheel with)."""
    request = {"capability": capability(gpu), "config": dict(config), "args": dict(args), "digests": digests}
    image_id = str(engine.inspect_image(image)["Id"])
    script = read_bytes(SCRIPT, "", MAX_CONFIG_BYTES, named=False)
    cached = cache_path(
        "kernels", "selection", _key(image_id, hashlib.sha256(script).hexdigest(), request) + ".json"
    )
    if use_cache and cached.is_file():
        try:
            return read_json(cached, "", named=False, within=[cached.parent])  # type: ignore[no-any-return]
        except InputError:
            pass  # a damaged cache entry: asked again and rewritten
    with tempfile.TemporaryDirectory(prefix="sparkforge-selection-") as tmp:
        write_output(Path(tmp) / "request.json", json.dumps(request), "selection request")
        result = engine.run_container(
            image,
            [f"{SUITE_MOUNT}/vllm_selection.py", f"{REQUEST_MOUNT}/request.json"],
            entrypoint=[PYTHON],
            environment={
                "HF_HUB_OFFLINE": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
                "VLLM_LOGGING_LEVEL": "ERROR",
            },
            timeout_s=600,
            volumes={str(SUITE_DIR.resolve()): SUITE_MOUNT, tmp: REQUEST_MOUNT},
        )
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith(MARKER)]
    if len(lines) != 1:
        raise SelectionError(
            f"vLLM's selection in {image} exited {result.exit_code} with {len(lines)} answers (one expected); last "
            f"output: {(result.stderr or result.stdout)[-600:]}; fix: check that the image holds vLLM in /opt/venv"
        )
    try:
        answer = parse_json(lines[0][len(MARKER) :], f"vLLM's selection in {image}", fix=_SELECTION_FIX)
    except InputError as exc:
        raise SelectionError(str(exc)) from None
    if not isinstance(answer, dict):
        raise SelectionError(f"vLLM's selection in {image} answered no JSON object; fix: {_SELECTION_FIX}")
    _refuse(answer, image, config, args)
    write_atomic(cached, json.dumps(answer, sort_keys=True).encode())
    return answer


def _refuse(
    answer: Mapping[str, Any], image: str, config: Mapping[str, Any], args: Mapping[str, Any]
) -> None:
    if answer.get("error") == "config":
        quant = args.get("quantization") or (config.get("quantization_config") or {}).get("quant_method")
        what = (
            f"quantization {quant!r}"
            if quant and "quantization" in str(answer.get("message"))
            else "model config"
        )
        raise SelectionError(
            f"the {what} of the checkpoint is refused by the vLLM {answer.get('vllm')} in {image}: "
            f"{' '.join(str(answer.get('message')).split())[:400]}; fix: use a checkpoint this vLLM knows, or an image "
            "whose vLLM knows it"
        )
    if answer.get("error"):
        raise SelectionError(
            f"vLLM's selection failed in {image}: {' '.join(str(answer.get('message')).split())[:400]}; fix: report "
            "it with the 'invoke kernels --json' output"
        )


def wheel_matches_runner(
    wheel: Path, runner_digests: Mapping[str, str], ours: Mapping[str, str] | None = None
) -> list[str]:
    """The wheel's vLLM Python files whose bytes differ from (or are missing in) the runner image's
    (`ours`: the wheel's own digests when already read)."""
    ours = wheel_python_digests(wheel) if ours is None else ours
    return sorted(path for path, digest in ours.items() if runner_digests.get(path) != digest)
