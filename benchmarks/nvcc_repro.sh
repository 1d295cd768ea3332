#!/usr/bin/env bash
# Are nvcc's objects byte-identical when the same unit is compiled twice with the same flags?
# Usage: benchmarks/nvcc_repro.sh VLLM_SOURCE_DIR OUT_DIR [UNIT...]   (vLLM 0.31.0's sdist, unpacked; nvcc 13.0)
# Units (paths under VLLM_SOURCE_DIR; default: vLLM's fp32_router_gemm.cu, a real unit that needs no torch
# headers) compiled with vLLM-style flags for GB10 (sm_120f + sm_121a cubins, compute_120 PTX), twice each into
# separate directories, for each of $THREADS (nvcc --threads, as the build's NVCC_THREADS; default "1"), then
# compared byte for byte (identical, and how many bytes differ).
set -euo pipefail
src=$1 out=$2
nvcc=${NVCC:-/usr/local/cuda-13.0/bin/nvcc}
flags=(-O3 -std=c++17 -DNDEBUG --expt-relaxed-constexpr --expt-extended-lambda -Xcompiler -fPIC
  -gencode arch=compute_120f,code=sm_120f -gencode arch=compute_121a,code=sm_121a
  -gencode arch=compute_120,code=compute_120 -I "$src/csrc" -I "$src/csrc/libtorch_stable")
shift 2
units=("${@:-csrc/libtorch_stable/fp32_router_gemm.cu}")
read -r -a thread_counts <<<"${THREADS:-1}"
mkdir -p "$out"
for run in 1 2; do
  for threads in "${thread_counts[@]}"; do
    mkdir -p "$out/run$run-t$threads"
    for unit in "${units[@]}"; do
      start=$(date +%s.%N)
      [[ -f "$out/run$run-t$threads/$(basename "$unit" .cu).o" ]] && continue  # resumable
      "$nvcc" "${flags[@]}" --threads "$threads" -c "$src/$unit" -o "$out/run$run-t$threads/$(basename "$unit" .cu).o"
      echo "compiled $unit run $run threads $threads in $(echo "$(date +%s.%N) - $start" | bc) s" >&2
    done
  done
done
for threads in "${thread_counts[@]}"; do
  for unit in "${units[@]}"; do
    name=$(basename "$unit" .cu).o
    a="$out/run1-t$threads/$name" b="$out/run2-t$threads/$name"
    if cmp -s "$a" "$b"; then same=true; else same=false; fi
    differing=$(cmp -l "$a" "$b" 2>/dev/null | wc -l || true)
    echo "{\"unit\": \"$unit\", \"threads\": $threads, \"bytes\": $(stat -c %s "$a"), \"sha256_run1\": \"$(sha256sum "$a" | cut -c1-64)\", \"sha256_run2\": \"$(sha256sum "$b" | cut -c1-64)\", \"identical\": $same, \"differing_bytes\": $differing}"
  done
done
