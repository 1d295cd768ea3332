"""KV cache arithmetic as vLLM 0.33.0 does it for a hybrid (attention + gated-delta-net) model, per TP rank.

- Full attention, per token per layer: FullAttentionSpec.page_size_bytes / block_size
  = 2 (K and V) * num_kv_heads per rank * head_size * dtype size (vllm/v1/kv_cache_interface.py).
- Gated-delta-net, per sequence per layer: MambaStateShapeCalculator.gated_delta_net_state_shape
  (vllm/model_executor/layers/mamba/mamba_utils.py): conv state (conv_kernel - 1 + num_spec) x
  (2 * key_dim + value_dim) / tp in the model dtype, temporal state (value_heads / tp) x value_dim x key_dim in
  `mamba_ssm_dtype` (float32 for the Qwen3.5 checkpoints).
- Block size: Platform._align_hybrid_block_size (vllm/platforms/interface.py) makes one attention page at least
  one state page, in steps of the attention kernel's block (16; with prefix caching, 'align' mode, also the
  FlashInfer GDN checkpoint grid of 64); the state page is padded to the attention page.
- Groups: kv_cache_planning._get_kv_cache_groups_uniform_page_size: layers of one kind in groups of the smaller
  kind's count; a block spans one page per layer of a group, so num_blocks = KV bytes // (group_size * page).
- Per request at max-model-len (get_max_concurrency_for_kv_cache_config): cdiv(max_len, block_size) blocks for
  each attention group, 1 + num_spec per state group ('align' mode: 2 + num_spec + 1 FlashInfer checkpoint).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparkforge.run.memory.checkpoint import DTYPE_BYTES, Architecture
from sparkforge.run.memory.weightbytes import cdiv

ATTENTION_KERNEL_BLOCK = (
    16  # FlashAttention/FlashInfer: block sizes MultipleOf(16); vLLM's default block is 16
)
GDN_CHECKPOINT_ALIGNMENT = 64  # vllm/v1/attention/backends/gdn_attn.py FLASHINFER_GDN_CHECKPOINT_ALIGNMENT


@dataclass(frozen=True)
class CacheSettings:
    """What the profile's flags decide about the cache (vLLM's defaults where the profile is silent)."""

    kv_dtype: str = "auto"  # --kv-cache-dtype
    prefix_caching: bool = True  # vLLM's default for generation models
    num_spec: int = 0  # speculative tokens (MTP)
    gdn_checkpoints: bool = True  # FlashInfer GDN prefill exports checkpoints (GB10); False on other backends
    kernel_block: int = (
        ATTENTION_KERNEL_BLOCK  # the attention backend's smallest block (vLLM's CPU platform: 128)
    )


@dataclass(frozen=True)
class KvSpec:
    """The per-rank cache layout of one pipeline stage."""

    attention_layers: int
    state_layers: int
    attn_bytes_per_token: int  # one layer
    state_bytes: int  # one layer, one sequence, before padding
    block_size: int
    page_bytes: int  # attention page = padded state page
    group_size: int
    attention_groups: int
    state_groups: int
    state_blocks_per_request: int

    @property
    def bytes_per_block(self) -> int:
        return self.group_size * self.page_bytes

    def blocks_per_request(self, max_len: int) -> int:
        return (
            self.attention_groups * cdiv(max_len, self.block_size)
            + self.state_groups * self.state_blocks_per_request
        )

    def request_bytes(self, max_len: int) -> int:
        """What one sequence of `max_len` tokens takes of the pool (vLLM's per-request accounting)."""
        return self.blocks_per_request(max_len) * self.bytes_per_block

    def max_concurrency(self, kv_bytes: int, max_len: int) -> float:
        """vLLM's 'Maximum concurrency for N tokens per request: X' from the KV cache bytes."""
        return (kv_bytes // self.bytes_per_block) / self.blocks_per_request(max_len)

    def longest(self, kv_bytes: int) -> int:
        """The longest single sequence the pool holds (whole blocks), 0 when not even the states fit."""
        blocks = kv_bytes // self.bytes_per_block - self.state_groups * self.state_blocks_per_request
        return max(0, blocks // self.attention_groups * self.block_size) if self.attention_groups else 0


def attn_bytes_per_token(arch: Architecture, tp: int, kv_dtype: str) -> int:
    size = (
        DTYPE_BYTES.get(arch.dtype, 2) if kv_dtype == "auto" else DTYPE_BYTES.get(kv_dtype.split("_")[0], 1)
    )
    return 2 * max(1, arch.kv_heads // tp) * arch.head_dim * size


def state_bytes(arch: Architecture, tp: int, num_spec: int) -> int:
    conv_dim = (
        arch.linear_key_dim * arch.linear_key_heads * 2 + arch.linear_value_dim * arch.linear_value_heads
    )
    conv = (conv_dim // tp) * (arch.conv_kernel - 1 + num_spec) * DTYPE_BYTES.get(arch.dtype, 2)
    temporal = (arch.linear_value_heads // tp) * arch.linear_value_dim * arch.linear_key_dim
    return conv + temporal * DTYPE_BYTES.get(arch.ssm_dtype, 4)


def kv_spec(
    arch: Architecture, tp: int, layers: tuple[int, int], settings: CacheSettings, mtp_layers: int = 0
) -> KvSpec:
    """The cache layout of the decoder layers [first, last) on one TP rank (plus MTP draft attention layers)."""
    kinds = arch.layer_types[layers[0] : layers[1]]
    full = sum(1 for k in kinds if k == "full_attention") + mtp_layers
    linear = sum(1 for k in kinds if k == "linear_attention")
    per_token = attn_bytes_per_token(arch, tp, settings.kv_dtype)
    state = state_bytes(arch, tp, settings.num_spec) if linear else 0
    align = settings.prefix_caching and linear > 0
    alignment = settings.kernel_block
    if align and settings.gdn_checkpoints:
        alignment = math.lcm(alignment, GDN_CHECKPOINT_ALIGNMENT)
    block = max(ATTENTION_KERNEL_BLOCK, settings.kernel_block)
    if state:
        block = max(block, alignment * cdiv(state, alignment * per_token))
    page = block * per_token
    buckets = [n for n in (full, linear) if n]
    group = min(buckets) if buckets else 1
    if buckets and max(buckets) < 1.5 * min(buckets):
        group = max(buckets)
    state_blocks = (
        (2 + settings.num_spec + (1 if settings.gdn_checkpoints else 0)) if align else 1 + settings.num_spec
    )
    return KvSpec(
        attention_layers=full,
        state_layers=linear,
        attn_bytes_per_token=per_token,
        state_bytes=state,
        block_size=block,
        page_bytes=page,
        group_size=group,
        attention_groups=cdiv(full, group) if full else 0,
        state_groups=cdiv(linear, group) if linear else 0,
        state_blocks_per_request=state_blocks if linear else 0,
    )
