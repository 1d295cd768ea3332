"""Which kernels produced the answers: what vLLM logged it selected when conform's server started (the parser of
verify/started.py), set beside `invoke kernels`' prediction for the recipe's GPU (vLLM's own selection run in the
image, cached by image ID and request), with a warning per layer where they differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkforge.errors import SparkforgeError
from sparkforge.recipe.profile import Profile
from sparkforge.run.nodes import NodeEngine
from sparkforge.verify import selection
from sparkforge.verify.started import compare, started_backends

PREDICTED_ARGS = ("dtype", "quantization", "max-model-len")  # what `invoke kernels --profile` asks about


def served_kernels(
    engine: NodeEngine, profile: Profile, image: str | None, gpu: str | None, model_dir: Path | None
) -> dict[str, Any]:
    """{"selected_at_start": layer -> {selected, line}, "predicted": layer -> name, "warnings": [...]}."""
    log = engine.logs(f"sparkforge-serve-{profile.name}-0")
    started = started_backends(log)
    out: dict[str, Any] = {"selected_at_start": started, "predicted": None, "warnings": []}
    config_path = model_dir / "config.json" if model_dir is not None else None
    if not gpu:
        out["prediction"] = "not predicted: a CPU recipe (vLLM's CUDA selection does not apply)"
        return out
    if config_path is None or not config_path.is_file() or not image:
        out["prediction"] = "not predicted: no checkpoint config.json in --model-dir or no image"
        return out
    args = {k: v for k, v in profile.model.args.items() if k in PREDICTED_ARGS}
    try:
        answer = selection.run_selection(image, gpu, selection.read_model_config(config_path), args)
    except SparkforgeError as exc:
        out["prediction"] = f"not predicted: {str(exc)[:400]}"
        return out
    layers = answer.get("layers") or []
    out["predicted"] = {str(layer["layer"]): layer.get("selected") for layer in layers}
    out["prediction"] = f"vLLM {answer.get('vllm')}'s selection for {gpu} in {image} (as 'invoke kernels')"
    out["warnings"] = compare(layers, started)
    return out
