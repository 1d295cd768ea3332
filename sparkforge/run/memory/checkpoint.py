"""A checkpoint's config.json -> the dimensions the memory plan needs (typed; unknown architectures refused).

The config is the one of the profile's MODEL, never looked up by the profile's file name: `--model-dir`'s
config.json, else `profiles/checkpoints/<org>/<name>/<revision>.json` keyed by the model id and its pinned revision
(recipe/checkpoints.py: the one rule, what `invoke kernels` reads too); it passes the input boundary. A copied or renamed profile gets the same plan. Field names and defaults are the ones vLLM
reads: `text_config` of a multimodal checkpoint, `layer_types`, `linear_*` for gated-delta-net layers,
`mamba_ssm_dtype` (vLLM's Qwen3_5ForConditionalGenerationConfig makes it the GDN state's dtype),
`quantization_config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkforge.boundary import read_json
from sparkforge.errors import RunError

# Bytes per element of the dtype names config.json and vLLM's flags use.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "int8": 1}  # fmt: skip
# The model classes whose layers the plan knows how to count (Qwen3.5 hybrid MoE and dense).
KNOWN_ARCHITECTURES = (
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5ForCausalLM",
)


@dataclass(frozen=True)
class Quantization:
    """How the checkpoint's linear weights are stored: method, bytes per weight, scale layout, what is left out."""

    method: str  # "none", "fp8" (block), "nvfp4"
    block: tuple[int, int] = (128, 128)  # fp8 block scales (one float32 per block)
    group: int = 16  # nvfp4: one fp8 scale per 16 weights
    excluded: tuple[str, ...] = ()  # module name parts kept in the model dtype

    def keeps(self, module: str) -> bool:
        """True when `module` ('lm_head', 'visual', 'linear_attn', 'mlp.gate', ...) stays unquantized: the exclusion
        lists name them as 'model.visual', '*linear_attn*', '*mlp.gate' (globs reduced to the module name)."""
        if self.method == "none":
            return True
        return any(part.strip("*").removeprefix("model.") == module for part in self.excluded)


@dataclass(frozen=True)
class Architecture:
    """The text model's dimensions (and the vision tower's size) as vLLM reads them."""

    name: str
    source: str
    dtype: str
    hidden: int
    layers: int
    layer_types: tuple[str, ...]
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_position: int
    tie_embeddings: bool
    # gated-delta-net (linear attention)
    linear_key_heads: int
    linear_value_heads: int
    linear_key_dim: int
    linear_value_dim: int
    conv_kernel: int
    ssm_dtype: str
    # MoE (experts 0: dense MLP of intermediate_size)
    experts: int
    experts_per_token: int
    moe_intermediate: int
    shared_intermediate: int
    intermediate: int
    attn_output_gate: bool
    mtp_layers: int
    vision_params: int
    quant: Quantization
    vision_hidden: int = 0
    vision_intermediate: int = 0

    @property
    def linear_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == "linear_attention")


def _int(config: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 40:
        raise RunError(
            f"{where}: '{key}' is {value!r}, not a whole number; fix: the checkpoint's config.json value"
        )
    return value


def _vision_params(vision: dict[str, Any] | None, where: str) -> int:
    """Parameters of a Qwen3-VL style vision tower (blocks, patch and position embeddings, patch merger)."""
    if not vision:
        return 0
    h = _int(vision, "hidden_size", where)
    inter = _int(vision, "intermediate_size", where)
    depth = _int(vision, "depth", where)
    patch = _int(vision, "patch_size", where, 16)
    merge = _int(vision, "spatial_merge_size", where, 2)
    block = 4 * h * h + 4 * h + 2 * h * inter + inter + h + 4 * h  # qkv+proj (+bias), mlp fc1/fc2, two norms
    embed = (
        _int(vision, "in_channels", where, 3)
        * _int(vision, "temporal_patch_size", where, 2)
        * patch
        * patch
        * h
    )
    pos = _int(vision, "num_position_embeddings", where, 0) * h
    merged = h * merge * merge
    merger = 2 * h + merged * merged + merged + merged * _int(vision, "out_hidden_size", where, h)
    return depth * block + embed + h + pos + merger


def _quantization(config: dict[str, Any], where: str) -> Quantization:
    quant = config.get("quantization_config")
    if not quant:
        return Quantization("none")
    if not isinstance(quant, dict):
        raise RunError(f"{where}: 'quantization_config' is not an object; fix: the checkpoint's config.json")
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        block = quant.get("weight_block_size") or [128, 128]
        excluded = tuple(str(m) for m in quant.get("modules_to_not_convert") or ())
        return Quantization("fp8", block=(int(block[0]), int(block[1])), excluded=excluded)
    if method == "modelopt" and str(quant.get("quant_algo", "")).upper() == "NVFP4":
        excluded = tuple(str(m) for m in quant.get("exclude_modules") or ())
        return Quantization("nvfp4", group=int(quant.get("group_size", 16)), excluded=excluded)
    raise RunError(
        f"{where}: quantization {method or '?'} ({quant.get('quant_algo', '')}) is not one the memory plan counts "
        "(fp8 block, ModelOpt NVFP4, none); fix: serve with --force, or add it to sparkforge/run/memory/checkpoint.py"
    )


def parse_architecture(config: dict[str, Any], source: str) -> Architecture:
    """The dimensions of a Qwen3.5 checkpoint's config.json; anything else is refused with the fix."""
    from sparkforge.errors import InputError
    from sparkforge.run.memory.configtypes import check_checkpoint

    try:
        check_checkpoint(config, source)  # every value typed and bounded before the arithmetic below
    except InputError as exc:
        raise RunError(str(exc)) from None
    archs = config.get("architectures") or []
    name = str(archs[0]) if isinstance(archs, list) and archs else "?"
    if name not in KNOWN_ARCHITECTURES:
        raise RunError(
            f"{source}: model class {name} is not one the memory plan counts ({', '.join(KNOWN_ARCHITECTURES)}); "
            "fix: --force to start without a plan"
        )
    text = config.get("text_config") or config
    if not isinstance(text, dict):
        raise RunError(f"{source}: 'text_config' is not an object; fix: the checkpoint's config.json")
    layers = _int(text, "num_hidden_layers", source)
    interval = _int(text, "full_attention_interval", source, 4)
    types = text.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)
    ]
    if len(types) != layers or any(t not in ("full_attention", "linear_attention") for t in types):
        raise RunError(
            f"{source}: 'layer_types' does not list {layers} full_attention/linear_attention layers"
        )
    hidden = _int(text, "hidden_size", source)
    heads = _int(text, "num_attention_heads", source)
    vision = config.get("vision_config") if isinstance(config.get("vision_config"), dict) else None
    dtype = str(text.get("dtype") or text.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return Architecture(
        name=name,
        source=source,
        dtype=dtype,
        hidden=hidden,
        layers=layers,
        layer_types=tuple(types),
        heads=heads,
        kv_heads=_int(text, "num_key_value_heads", source, heads),
        head_dim=_int(text, "head_dim", source, hidden // max(heads, 1)),
        vocab=_int(text, "vocab_size", source),
        max_position=_int(text, "max_position_embeddings", source, 4096),
        tie_embeddings=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        linear_key_heads=_int(text, "linear_num_key_heads", source, 16),
        linear_value_heads=_int(text, "linear_num_value_heads", source, 32),
        linear_key_dim=_int(text, "linear_key_head_dim", source, 128),
        linear_value_dim=_int(text, "linear_value_head_dim", source, 128),
        conv_kernel=_int(text, "linear_conv_kernel_dim", source, 4),
        ssm_dtype=str(text.get("mamba_ssm_dtype") or dtype),
        experts=_int(text, "num_experts", source, 0),
        experts_per_token=_int(text, "num_experts_per_tok", source, 0),
        moe_intermediate=_int(text, "moe_intermediate_size", source, 0),
        shared_intermediate=_int(text, "shared_expert_intermediate_size", source, 0),
        intermediate=_int(text, "intermediate_size", source, 0),
        attn_output_gate=bool(text.get("attn_output_gate", True)),
        mtp_layers=_int(text, "mtp_num_hidden_layers", source, 0),
        vision_params=_vision_params(vision, source),
        quant=_quantization(config, source),
        vision_hidden=_int(vision, "hidden_size", source, 0) if vision else 0,
        vision_intermediate=_int(vision, "intermediate_size", source, 0) if vision else 0,
    )


def load_architecture(path: Path) -> Architecture:
    """Read a checkpoint config through the input boundary; a missing file names where to put it."""
    if not path.is_file():
        raise RunError(
            f"no checkpoint config at {path}: the memory plan needs the config.json of the profile's model; fix: "
            "save it under profiles/checkpoints/<org>/<name>/<revision>.json, pass --model-dir holding it, or --force"
        )
    return parse_architecture(
        read_json(path, "checkpoint config", fix="the checkpoint's config.json"), str(path)
    )


def reachable_config(model: str, revision: str | None, name: str) -> tuple[Path, str] | None:
    """A checkpoint config.json of `model` reachable without the network, and where it came from: the one the
    repository ships for the model at that revision (profiles/checkpoints/<org>/<name>/<revision>.json, keyed by
    the model, never a profile's name; `name` is the profile's, for the message), else the local HF cache."""
    from sparkforge.preflight.catalog import cached_configs
    from sparkforge.recipe.checkpoints import shipped_config
    from sparkforge.recipe.profile import PROFILES_DIR

    shipped = shipped_config(model, revision, PROFILES_DIR)
    if shipped is not None and shipped.is_file():
        return shipped, f"the checkpoint config shipped for {model} (profile {name})"
    cached = cached_configs(model, revision)
    if cached:
        return cached[0], f"the HF cache ({cached[0].parent.name[:12]})"
    return None
