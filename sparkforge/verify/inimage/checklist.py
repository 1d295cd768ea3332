"""The in-image suite's checks, in the order they run and are reported: (name, module, function, one line).

Plain data, no imports: run_checks.py reads it inside the image (the image's Python only), and the host reads
it as sparkforge.verify.imagechecks.IMAGE_CHECKS (the names every report must carry, the docs table). A new check is
its function in a module of this folder and one row here; docs/contributing.md says how.
"""

CHECKS: tuple[tuple[str, str, str, str], ...] = (
    ("registry", "run_checks", "check_registry", "vLLM's ModelRegistry registers every class in the lock's models.architectures"),
    ("versions", "run_checks", "check_versions", "torch, its CUDA, transformers, vLLM (version and commit) and FlashInfer match the lock"),
    ("pip-check", "run_checks", "check_pip", "`pip check` finds no dependency conflict in the image"),
    ("fp8.reference", "checks_fp8", "check_torch_reference", "torch._scaled_mm against the float32 reference (proves the harness; never counts for GPU-verified)"),
    ("fp8.scaled_fp8_quant", "checks_fp8", "check_scaled_fp8_quant", "vLLM's scaled_fp8_quant, per-tensor and dynamic, against the reference"),
    ("fp8.cutlass_scaled_mm", "checks_fp8", "check_cutlass_scaled_mm", "vLLM's cutlass_scaled_mm, per-tensor and per-token x per-channel, incl. m=1 n=16384 k=5120"),
    ("fp8.cutlass_block", "checks_fp8", "check_cutlass_block_fp8", "vLLM's blockwise FP8 GEMM (1x128 / 128x128 scales), incl. m=1 n=16384 k=5120"),
    ("fp8.linear", "checks_fp8", "check_fp8_linear", "an FP8 linear layer end to end against bf16 F.linear"),
    ("jit.toolchain", "checks_jit", "check_toolchain", "nvcc and ptxas (CUDA_HOME) assemble for the recipe's GPU (recipes that JIT-compile)"),
    ("jit.triton", "checks_jit", "check_triton", "Triton compiles a kernel for the recipe's GPU without one"),
    ("jit.flashinfer", "checks_jit", "check_flashinfer", "FlashInfer JIT-compiles a kernel for the recipe's GPU"),
    ("jit.b12x", "checks_jit", "check_b12x", "b12x compiles one CuTe DSL kernel for the recipe's GPU (GPU-less path)"),
    ("fabric.verbs", "checks_fabric", "check_verbs", "NCCL's verbs library and the mlx5 provider load (recipes with runtime.rdma)"),
    ("fabric.nccl", "checks_fabric", "check_nccl", "the libnccl torch loads has the version and sha256 the recipe pins (runtime.nccl)"),
    ("serve", "run_checks", "check_serve", "`vllm serve` of a mounted small model answers one completion (--model-dir)"),
)  # fmt: skip
