"""Weight bytes per node: the checkpoint's parameters, stored as its quantization says, split by TP and PP.

Counted the way vLLM lays them out on a rank: column/row-parallel projections, experts and the vocabulary are
split across tensor-parallel ranks (a KV head is replicated when there are fewer KV heads than ranks); the MoE
router, the shared-expert gate and the norms are replicated; pipeline stages take an even share of the decoder
layers (vLLM's get_pp_indices), the first stage the embedding and vision tower, the last the LM head. FP8 block
weights are 1 byte plus one float32 scale per 128x128 block; NVFP4 is half a byte plus one FP8 scale per 16.
The MTP draft layer is loaded only when the profile asks for MTP speculative decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkforge.run.memory.checkpoint import DTYPE_BYTES, Architecture


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Split:
    tp: int = 1
    pp: int = 1
    mtp: bool = False  # the MTP draft layer is loaded (speculative decoding with method mtp)


@dataclass
class StageWeights:
    """One pipeline stage's weights on one tensor-parallel rank, by component (bytes)."""

    stage: int
    layers: tuple[int, int]  # [first, last) decoder layers
    parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def matrix_bytes(arch: Architecture, module: str, rows: int, cols: int) -> int:
    """One (rows x cols) linear weight of `module` as stored: the model dtype, FP8 blocks or NVFP4 groups."""
    q = arch.quant
    if q.keeps(module):
        return rows * cols * DTYPE_BYTES.get(arch.dtype, 2)
    if q.method == "fp8":
        return rows * cols + cdiv(rows, q.block[0]) * cdiv(cols, q.block[1]) * 4
    return (
        rows * cols // 2 + rows * cdiv(cols, q.group) + 8
    )  # nvfp4: packed E2M1, FP8 group scales, 2 globals


def layer_parts(arch: Architecture, kind: str, tp: int) -> dict[str, int]:
    """One decoder layer's bytes on one TP rank: its token mixer ('full_attention'/'linear_attention') and MLP."""
    h, dt = arch.hidden, DTYPE_BYTES.get(arch.dtype, 2)
    parts: dict[str, int] = {"norms": 2 * h * dt}
    if kind == "full_attention":
        q_out = arch.heads * arch.head_dim * (2 if arch.attn_output_gate else 1) // tp
        kv_out = max(1, arch.kv_heads // tp) * arch.head_dim
        parts["attention"] = (
            matrix_bytes(arch, "self_attn", q_out + 2 * kv_out, h)
            + matrix_bytes(arch, "self_attn", h, arch.heads * arch.head_dim // tp)
            + 2 * arch.head_dim * dt
        )
    else:
        kd = arch.linear_key_heads * arch.linear_key_dim // tp
        vd = arch.linear_value_heads * arch.linear_value_dim // tp
        nv = arch.linear_value_heads // tp
        parts["gated_delta_net"] = (
            matrix_bytes(arch, "linear_attn", 2 * kd + 2 * vd, h)  # in_proj_qkvz
            + matrix_bytes(arch, "linear_attn", 2 * nv, h)  # in_proj_ba
            + matrix_bytes(arch, "linear_attn", h, vd)  # out_proj
            + (2 * kd + vd) * arch.conv_kernel * dt  # conv1d
            + 2 * nv * 4  # dt_bias, A_log (float32)
            + arch.linear_value_dim * dt  # gated RMSNorm
        )
    if arch.experts:
        inter = arch.moe_intermediate // tp
        parts["experts"] = arch.experts * (
            matrix_bytes(arch, "mlp.experts", 2 * inter, h) + matrix_bytes(arch, "mlp.experts", h, inter)
        )
        parts["router"] = matrix_bytes(arch, "mlp.gate", arch.experts, h)
        if arch.shared_intermediate:
            shared = arch.shared_intermediate // tp
            parts["shared_expert"] = matrix_bytes(arch, "mlp.shared_expert", 2 * shared, h) + matrix_bytes(
                arch, "mlp.shared_expert", h, shared
            )
            parts["router"] += matrix_bytes(arch, "mlp.shared_expert_gate", 1, h)
    else:
        inter = arch.intermediate // tp
        parts["mlp"] = matrix_bytes(arch, "mlp", 2 * inter, h) + matrix_bytes(arch, "mlp", h, inter)
    return parts


def pp_ranges(layers: int, pp: int, partition: tuple[int, ...] | None = None) -> list[tuple[int, int]]:
    """vLLM's partition of decoder layers over pipeline stages (get_pp_indices, vllm/distributed/utils.py): the
    given VLLM_PP_LAYER_PARTITION, else equal shares with the remainder added one each to the stages before the
    last, from the second-to-last backwards (5 layers over 3 stages: 2,2,1; 4 over 3: 1,2,1)."""
    if partition:
        sizes = list(partition)
    else:
        sizes = [layers // pp] * pp
        for i in range(2, layers % pp + 2):
            sizes[-i] += 1
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [(s, s + n) for s, n in zip(starts, sizes, strict=True)]


def _add(total: dict[str, int], parts: dict[str, int]) -> None:
    for key, value in parts.items():
        total[key] = total.get(key, 0) + value


def stage_weights(arch: Architecture, split: Split) -> list[StageWeights]:
    """Bytes per pipeline stage on one of its tensor-parallel ranks (every rank of a stage holds the same)."""
    dt, tp = DTYPE_BYTES.get(arch.dtype, 2), split.tp
    vocab_rows = cdiv(cdiv(arch.vocab, 64) * 64, tp)  # VocabParallelEmbedding pads the vocabulary to 64
    stages = []
    for index, (first, last) in enumerate(pp_ranges(arch.layers, split.pp)):
        stage = StageWeights(index, (first, last))
        for i in range(first, last):
            _add(stage.parts, layer_parts(arch, arch.layer_types[i], tp))
        if index == 0:
            stage.parts["embedding"] = vocab_rows * arch.hidden * dt
            stage.parts["vision"] = arch.vision_params * dt // tp
        if index == split.pp - 1:
            if not arch.tie_embeddings or split.pp > 1:
                stage.parts["lm_head"] = matrix_bytes(arch, "lm_head", vocab_rows, arch.hidden)
            stage.parts["norms"] = stage.parts.get("norms", 0) + arch.hidden * dt
            if split.mtp and arch.mtp_layers:
                mtp: dict[str, int] = {}
                for _ in range(arch.mtp_layers):
                    _add(mtp, layer_parts(arch, "full_attention", tp))
                stage.parts["mtp_draft"] = sum(mtp.values()) + 2 * arch.hidden * arch.hidden * dt // tp
        stages.append(stage)
    return stages
