"""What vLLM's FP8 ops require of their operands, checked before a check calls them.

A check that hands an op the wrong layout or scale shape would fail as if the kernel were broken (or pass on a
silently taken fallback). These rules, read from vLLM 0.31.0's `cutlass_scaled_mm` entry point, its SM90/SM120
dispatchers and `scaled_fp8_quant`, turn such a call into "the check is wrong". Standard library only: operands
are described by `TensorSpec` (shape, strides, dtype), made from a torch tensor with `TensorSpec.of`.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

FP8 = "float8_e4m3fn"
OUT_DTYPES = ("bfloat16", "float16")
QUANT_INPUT_DTYPES = ("float32", "float16", "bfloat16")
BLOCK = 128  # vLLM's blockwise FP8: activations scaled per 1x128, weights per 128x128
# 16 bytes of FP8 = 16 elements: CUTLASS's TMA alignment, and vLLM's rule for taking CUTLASS at all
ALIGN = 16
WRONG = "the check is wrong (not the kernel)"


@dataclass(frozen=True)
class TensorSpec:
    """What an op sees of a tensor: its shape, strides (in elements) and dtype name (e.g. 'float8_e4m3fn')."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, tensor: Any) -> TensorSpec:
        return cls(
            tuple(int(s) for s in tensor.shape),
            tuple(int(s) for s in tensor.stride()),
            str(tensor.dtype).removeprefix("torch."),
        )

    @property
    def numel(self) -> int:
        return prod(self.shape)

    def row_major(self) -> bool:
        """Packed in C order (dims of extent 1 may have any stride, as torch allows)."""
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def column_major(self) -> bool:
        """A packed 2-D tensor whose first dimension is contiguous (strides (1, rows))."""
        if len(self.shape) != 2:
            return False
        rows, cols = self.shape
        return (rows == 1 or self.stride[0] == 1) and (cols == 1 or self.stride[1] == rows)


def scaled_mm_problems(
    a: TensorSpec,
    b: TensorSpec,
    scale_a: TensorSpec,
    scale_b: TensorSpec,
    out_dtype: str,
    blockwise: bool,
) -> list[str]:
    """Every way a `cutlass_scaled_mm(a, b, scale_a, scale_b, out_dtype)` call breaks the op's contract.

    `blockwise` is what the check means to test: vLLM picks the path from the scales' sizes, so a check whose
    scales would send it down the other path is wrong too.
    """
    if len(a.shape) != 2 or len(b.shape) != 2:
        return [f"a and b must be 2-D, got a {a.shape} and b {b.shape}"]
    (m, k), (k_b, n) = a.shape, b.shape
    problems = []
    if k != k_b:
        problems.append(f"a is {m}x{k} but b is {k_b}x{n}: the inner dimensions differ")
    for name, spec in (("a", a), ("b", b)):
        if spec.dtype != FP8:
            problems.append(f"{name} must be {FP8}, got {spec.dtype}")
    if out_dtype not in OUT_DTYPES:
        problems.append(f"the output dtype must be one of {OUT_DTYPES}, got {out_dtype}")
    if a.stride[1] != 1:
        problems.append(f"a must be row-major (stride(1) == 1), got strides {a.stride}")
    if b.stride[0] != 1:
        problems.append(
            f"b must be column-major (stride(0) == 1, e.g. w.t() of an N x K weight), got strides {b.stride}"
        )
    if k % ALIGN or n % ALIGN:
        problems.append(
            f"k={k} and n={n} must be multiples of {ALIGN}: otherwise vLLM's wrapper silently takes "
            "triton_scaled_mm and the check would not test CUTLASS"
        )
    if a.stride[0] % ALIGN or b.stride[1] % ALIGN:
        problems.append(
            f"a's row stride ({a.stride[0]}) and b's column stride ({b.stride[1]}) must be multiples of {ALIGN} "
            "elements (16-byte alignment)"
        )
    for name, spec in (("scale_a", scale_a), ("scale_b", scale_b)):
        if spec.dtype != "float32":
            problems.append(f"{name} must be float32, got {spec.dtype}")
    per_tensor_or_token = scale_a.numel in (1, m) and scale_b.numel in (1, n)
    if blockwise:
        problems += _blockwise_problems(m, n, k, scale_a, scale_b, per_tensor_or_token)
    else:
        if not per_tensor_or_token:
            problems.append(
                f"scale_a must hold 1 or M={m} values and scale_b 1 or N={n}, got {scale_a.shape} and "
                f"{scale_b.shape}: vLLM would take the blockwise path"
            )
        for name, spec in (("scale_a", scale_a), ("scale_b", scale_b)):
            if not spec.row_major():
                problems.append(
                    f"{name} must be contiguous (vLLM's dispatcher requires it), got strides {spec.stride}"
                )
    return problems


def _blockwise_problems(
    m: int, n: int, k: int, scale_a: TensorSpec, scale_b: TensorSpec, per_tensor_or_token: bool
) -> list[str]:
    problems = []
    if per_tensor_or_token:
        problems.append(
            f"scales of {scale_a.numel} and {scale_b.numel} values send vLLM down the per-tensor/per-token "
            "path, not the blockwise one"
        )
    if k % BLOCK or n % BLOCK:
        problems.append(f"blockwise scaling needs k={k} and n={n} to be multiples of {BLOCK}")
    sides = (
        ("scale_a", scale_a, f"(M, K/{BLOCK})", (m, k // BLOCK), "M"),
        ("scale_b", scale_b, f"(K/{BLOCK}, N/{BLOCK})", (k // BLOCK, n // BLOCK), "K"),
    )
    for name, spec, shape, want, major in sides:
        if spec.shape != want:
            problems.append(f"{name} must be {shape} = {want}, got {spec.shape}")
        elif not spec.column_major():
            problems.append(
                f"{name} must be {major}-major (column-major, strides (1, {want[0]})): the kernels read it by "
                f"pointer and ignore strides; got strides {spec.stride}"
            )
    return problems


def quant_problems(x: TensorSpec) -> list[str]:
    """Every way a `scaled_fp8_quant(x)` call breaks the op's contract (2-D input, last dimension contiguous)."""
    problems = []
    if len(x.shape) != 2:
        problems.append(f"the input must be 2-D [tokens, hidden], got {x.shape}")
    elif x.stride[1] != 1:
        problems.append(f"the input's last dimension must be contiguous, got strides {x.stride}")
    if x.dtype not in QUANT_INPUT_DTYPES:
        problems.append(f"the input must be one of {QUANT_INPUT_DTYPES}, got {x.dtype}")
    return problems


def describe(case: str, problems: list[str]) -> str:
    """The one-line reason a check fails with when its own call is wrong."""
    return f"{WRONG}: {case}: " + "; ".join(problems)
