"""vLLM's own cache arithmetic for a checkpoint's config.json, run INSIDE an image (no GPU, no weights).

Input (argv[1], a JSON file): {"config": <config.json>, "tp": 1, "num_spec": 0}. Output (last line, JSON): what
vLLM computes for one TP rank: the full-attention page of one token (FullAttentionSpec.page_size_bytes with
block_size 1), the gated-delta-net state shapes, dtypes and page (the model class's
get_mamba_state_shape_from_config / get_mamba_state_dtype_from_config, as Platform._align_hybrid_block_size asks
them, into MambaSpec.page_size_bytes), the layer kinds, KV heads per rank, head size and dtype ModelConfig reads.
sparkforge's host-side plan (sparkforge/run/memory/kvcache.py) is compared with it (benchmarks/memory.md).
"""

import json
import sys
import tempfile
from pathlib import Path


def main() -> None:
    request = json.loads(Path(sys.argv[1]).read_text())
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    folder = Path(tempfile.mkdtemp(prefix="sparkforge-model-"))
    (folder / "config.json").write_text(json.dumps(request["config"]))
    model = ModelConfig(model=str(folder), skip_tokenizer_init=True)
    parallel = ParallelConfig(tensor_parallel_size=int(request.get("tp", 1)))
    vllm_config = VllmConfig(model_config=model, parallel_config=parallel)
    # Qwen3.5's hook sets mamba_ssm_cache_dtype from the checkpoint (VllmConfig runs it in some releases only).
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    hook = MODELS_CONFIG_MAP.get(model.architecture)
    if hook is not None:
        hook.verify_and_update_config(vllm_config)
    model_cls, _ = ModelRegistry.resolve_model_cls(model.architecture, model_config=model)
    shapes = model_cls.get_mamba_state_shape_from_config(vllm_config)
    dtypes = model_cls.get_mamba_state_dtype_from_config(vllm_config)
    mamba = MambaSpec(shapes=tuple(shapes), dtypes=tuple(dtypes), block_size=1)
    attention = FullAttentionSpec(
        block_size=1,
        num_kv_heads=model.get_num_kv_heads(parallel),
        head_size=model.get_head_size(),
        dtype=model.dtype,
    )
    kinds = list(getattr(model.hf_text_config, "layer_types", []))
    import vllm

    print(json.dumps({
        "vllm": vllm.__version__,
        "architecture": model.architecture,
        "dtype": str(model.dtype),
        "num_kv_heads_per_rank": model.get_num_kv_heads(parallel),
        "head_size": model.get_head_size(),
        "attention_layers": kinds.count("full_attention"),
        "state_layers": kinds.count("linear_attention"),
        "attn_page_bytes_per_token": attention.page_size_bytes,
        "state_shapes": [list(s) for s in shapes],
        "state_dtypes": [str(d) for d in dtypes],
        "state_page_bytes": mamba.page_size_bytes,
        "mamba_ssm_cache_dtype": str(vllm_config.cache_config.mamba_ssm_cache_dtype),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
