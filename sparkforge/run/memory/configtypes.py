"""The checkpoint config.json and the profile's speculative config, typed with bounds before the memory plan does
any arithmetic: a zero divisor (heads, head_dim, an interval), a string where a number belongs, 10^11 layers or
1e300 speculative tokens are refused naming the file, the key, the value and the fix (sparkforge/recipe/typedfile.py).

The bounds are generous (several times today's largest checkpoints) and exist to keep the arithmetic finite and
fast, not to judge the model: a real checkpoint outside them is a reason to widen them here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from sparkforge.recipe.typedfile import STRICT, typed

Layers = Annotated[int, Field(ge=1, le=1024)]
Heads = Annotated[int, Field(ge=1, le=4096)]
Dim = Annotated[int, Field(ge=1, le=1 << 17)]
Width = Annotated[int, Field(ge=0, le=1 << 20)]  # an intermediate size; 0: none (a dense or MoE-only model)
Small = Annotated[int, Field(ge=1, le=1024)]
ClassName = Annotated[str, Field(max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]  # printed: no escapes
BlockSide = Annotated[int, Field(ge=1, le=1 << 14)]
LayerType = Literal["full_attention", "linear_attention"]
ModuleName = Annotated[str, Field(max_length=256, pattern=r"^[A-Za-z0-9_.*\-]+$")]
DType = Literal["bfloat16", "float16", "half", "float32", "float", "fp8", "fp8_e4m3", "fp8_e5m2", "int8"]

CONFIG_FIX = "use the checkpoint's own config.json (the file beside its safetensors), or --force to start without a plan"


class TextConfig(BaseModel):
    """The text model's dimensions, as vLLM reads them (the defaults are vLLM's)."""

    model_config = STRICT

    num_hidden_layers: Layers
    hidden_size: Dim
    num_attention_heads: Heads
    num_key_value_heads: Heads | None = None
    head_dim: Dim | None = None
    vocab_size: Annotated[int, Field(ge=1, le=1 << 23)]
    max_position_embeddings: Annotated[int, Field(ge=1, le=1 << 25)] = 4096
    full_attention_interval: Small = 4
    layer_types: Annotated[list[LayerType], Field(max_length=1024)] | None = None
    dtype: DType | None = None
    torch_dtype: DType | None = None
    mamba_ssm_dtype: DType | None = None
    linear_num_key_heads: Heads = 16
    linear_num_value_heads: Heads = 32
    linear_key_head_dim: Dim = 128
    linear_value_head_dim: Dim = 128
    linear_conv_kernel_dim: Annotated[int, Field(ge=1, le=64)] = 4
    num_experts: Annotated[int, Field(ge=0, le=1 << 14)] = 0
    num_experts_per_tok: Annotated[int, Field(ge=0, le=1 << 14)] = 0
    moe_intermediate_size: Width = 0
    shared_expert_intermediate_size: Width = 0
    intermediate_size: Width = 0
    mtp_num_hidden_layers: Annotated[int, Field(ge=0, le=64)] = 0
    tie_word_embeddings: bool = False
    attn_output_gate: bool = True

    @model_validator(mode="after")
    def consistent(self) -> TextConfig:
        kv = self.num_key_value_heads or self.num_attention_heads
        if kv > self.num_attention_heads or self.num_attention_heads % kv:
            raise ValueError(
                f"num_key_value_heads {kv} must divide num_attention_heads {self.num_attention_heads}"
            )
        if self.head_dim is None and self.hidden_size < self.num_attention_heads:
            raise ValueError("without head_dim, hidden_size must be at least num_attention_heads")
        if self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types lists {len(self.layer_types)} layers, num_hidden_layers says {self.num_hidden_layers}"
            )
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok {self.num_experts_per_tok} must be from 1 to num_experts {self.num_experts}"
            )
        return self


class VisionConfig(BaseModel):
    """The vision tower's size (Qwen3-VL style)."""

    model_config = STRICT

    hidden_size: Dim
    intermediate_size: Width
    depth: Layers
    patch_size: Small = 16
    spatial_merge_size: Annotated[int, Field(ge=1, le=64)] = 2
    in_channels: Annotated[int, Field(ge=1, le=64)] = 3
    temporal_patch_size: Annotated[int, Field(ge=1, le=64)] = 2
    num_position_embeddings: Annotated[int, Field(ge=0, le=1 << 24)] = 0
    out_hidden_size: Dim | None = None


class QuantizationConfig(BaseModel):
    """How the weights are stored: fp8 blocks or ModelOpt NVFP4 groups, and the modules left out."""

    model_config = STRICT

    quant_method: Annotated[str, Field(max_length=64)] = ""
    quant_algo: Annotated[str, Field(max_length=64)] | None = None
    weight_block_size: Annotated[list[BlockSide], Field(min_length=2, max_length=2)] | None = None
    group_size: Annotated[int, Field(ge=1, le=1 << 14)] = 16
    modules_to_not_convert: Annotated[list[ModuleName], Field(max_length=1 << 16)] | None = None
    exclude_modules: Annotated[list[ModuleName], Field(max_length=1 << 16)] | None = None


class CheckpointConfig(BaseModel):
    """A checkpoint's config.json: the fields the memory plan reads, typed and bounded."""

    model_config = STRICT

    architectures: Annotated[list[ClassName], Field(max_length=16)] | None = None
    text_config: TextConfig | None = None
    vision_config: VisionConfig | None = None
    quantization_config: QuantizationConfig | None = None
    dtype: DType | None = None
    tie_word_embeddings: bool | None = None


def check_checkpoint(config: dict[str, Any], where: str) -> CheckpointConfig:
    """`config` (a parsed config.json) typed: its text model (`text_config`, else the top level), vision tower
    and quantization within bounds; InputError naming `where`, the key, the value and the fix."""
    checked = typed(CheckpointConfig, config, where, CONFIG_FIX)
    if checked.text_config is None:  # a text-only checkpoint: the dimensions at the top level
        checked = checked.model_copy(update={"text_config": typed(TextConfig, config, where, CONFIG_FIX)})
    return checked


class SpeculativeConfig(BaseModel):
    """vLLM's --speculative-config, as far as the memory plan reads it."""

    model_config = STRICT

    method: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9_.\-]*$")] = ""
    num_speculative_tokens: Annotated[int, Field(ge=1, le=64)] = 1


SPEC_FIX = 'e.g. \'{"method": "mtp", "num_speculative_tokens": 2}\' (1 to 64 tokens)'


def check_speculative(spec: dict[str, Any], where: str) -> SpeculativeConfig:
    """A parsed --speculative-config typed (num_speculative_tokens a whole number from 1 to 64)."""
    return typed(SpeculativeConfig, spec, where, SPEC_FIX)
