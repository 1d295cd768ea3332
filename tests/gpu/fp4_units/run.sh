#!/usr/bin/env bash
# vLLM's SM12x FP4 units (scaled_fp4_quant, the CUTLASS FP4 GEMM for sm_120, the FP4 MoE grouped GEMM) compiled
# for sm_121a and sm_120f with every core, audited for sm_121, and each cubin offered to this machine's GPU.
#
#   tests/gpu/fp4_units/run.sh TARBALL OUT
#
# TARBALL: tests/gpu/fp8_ops/fetch_sources.py's (vLLM 0.31.0 csrc + CUTLASS headers from the flashinfer wheel).
# OUT gets compile.log, fp4_compile.json, fp4_audit.json, elf.txt. PYTHON: the interpreter with torch (headers).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
tarball=${1:?TARBALL} out=${2:?OUT}
work=${FP4_WORK:-build/fp4dev/work}
mkdir -p "$work" "$out"
tar -xzf "$tarball" -C "$work"
src=$(ls -d "$work"/vllm-*/ | head -n 1)
status=0
"$py" "$here/compile_units.py" --vllm-src "$src" --cutlass "$work/cutlass" --out "$work/obj" \
  --arch 121a --arch 120f --jobs "$(nproc)" >"$out/compile.log" 2>&1 || status=$?
cat "$out/compile.log"
cp "$work/obj/fp4_compile.json" "$out/" || true
if command -v cuobjdump >/dev/null; then
  for o in "$work"/obj/*/*.o; do echo "== $o"; cuobjdump --list-elf "$o" 2>&1 || true; done >"$out/elf.txt"
fi
PYTHONPATH=. "$py" "$here/audit_units.py" --objects "$work/obj" --out "$out/fp4_audit.json" || status=$?
exit $status
