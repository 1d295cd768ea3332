#!/usr/bin/env bash
# Are nvcc's objects byte-identical when the same unit is compiled twice with the same flags?
# Usage: benchmarks/nvcc_repro.sh VLLM_SOURCE_DIR OUT_DIR [UNIT...]   (vLLM 0.31.0's sdist, unpacked; nvcc 13.0)
# Units (paths under VLLM_SOURCE_DIR; default: vLLM's fp32_router_gemm.cu, a real unit that needs no torch
# headers) compiled with vLLM-style flags for GB10 (sm_120f + sm_121a cubins, compute_120 PTX), twice each into
# separate directories, for each of $THREADS (nvcc --threads, as the build's NVCC_THREADS; default "1"), then
# compared byte for byte (identical, and how many bytes differ). Each object is also linked into a shared library
# (`nvcc -shared`) and that library stripped as slim-venv --strip does (`strip --strip-unneeded`); both compared.
# A unit path that is not under VLLM_SOURCE_DIR is taken as it is (e.g. benchmarks/nvcc/representative.cu).
# EXTRA_FLAGS adds flags, e.g. EXTRA_FLAGS=-g for the host debug info of vLLM's default RelWithDebInfo build.
# LINK_FLAGS adds link flags, e.g. LINK_FLAGS="-Xlinker --discard-all" (local symbols, nvcc's temp file name among them).
set -euo pipefail
src=$1 out=$2
nvcc=${NVCC:-/usr/local/cuda-13.0/bin/nvcc}
flags=(-O3 -std=c++17 -DNDEBUG --expt-relaxed-constexpr --expt-extended-lambda -Xcompiler -fPIC
  -gencode arch=compute_120f,code=sm_120f -gencode arch=compute_121a,code=sm_121a
  -gencode arch=compute_120,code=compute_120 -I "$src/csrc" -I "$src/csrc/libtorch_stable")
read -r -a extra <<<"${EXTRA_FLAGS:-}"
read -r -a link <<<"${LINK_FLAGS:-}"
flags+=("${extra[@]}")
shift 2
units=("${@:-csrc/libtorch_stable/fp32_router_gemm.cu}")
read -r -a thread_counts <<<"${THREADS:-1}"
mkdir -p "$out"
for run in 1 2; do
  for threads in "${thread_counts[@]}"; do
    mkdir -p "$out/run$run-t$threads"
    for unit in "${units[@]}"; do
      start=$(date +%s.%N)
      obj="$out/run$run-t$threads/$(basename "$unit" .cu).o"
      [[ -f "$obj" ]] && continue  # resumable
      path="$src/$unit"
      [[ -f "$path" ]] || path=$unit
      "$nvcc" "${flags[@]}" --threads "$threads" -c "$path" -o "$obj"
      "$nvcc" -shared "${link[@]}" -o "${obj%.o}.so" "$obj"
      cp "${obj%.o}.so" "${obj%.o}.stripped.so" && strip --strip-unneeded "${obj%.o}.stripped.so"
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
    so=()
    for kind in so stripped.so; do
      x="${a%.o}.$kind" y="${b%.o}.$kind"
      if cmp -s "$x" "$y"; then so+=(true); else so+=(false); fi
      so+=("$(cmp -l "$x" "$y" 2>/dev/null | wc -l || true)")
    done
    echo "{\"unit\": \"$unit\", \"extra_flags\": \"${EXTRA_FLAGS:-}\", \"link_flags\": \"${LINK_FLAGS:-}\", \"threads\": $threads, \"bytes\": $(stat -c %s "$a"), \"sha256_run1\": \"$(sha256sum "$a" | cut -c1-64)\", \"sha256_run2\": \"$(sha256sum "$b" | cut -c1-64)\", \"identical\": $same, \"differing_bytes\": $differing, \"so_identical\": ${so[0]}, \"so_differing_bytes\": ${so[1]}, \"stripped_so_identical\": ${so[2]}, \"stripped_so_differing_bytes\": ${so[3]}}"
  done
done
