#!/usr/bin/env bash
# The image suite's FP8 checks against vLLM's own FP8 kernels, and the planted faults, on a GPU host.
#
#   tests/gpu/fp8_ops/run.sh sources TARBALL OUT [ARCH] [PREBUILT]
#       build vLLM's FP8 ops from fetch_sources.py's tarball for ARCH (default 90a; 121a on a DGX Spark) with
#       every core, then run sparkforge/verify/inimage/checks_fp8.py against them, clean and with each planted fault.
#       PREBUILT (a build_ops.py OUT/python folder built elsewhere) is used only if the build here fails.
#   tests/gpu/fp8_ops/run.sh installed OUT
#       the same checks against the vLLM installed in this Python (inside an image: no build).
#
# OUT gets build.log, fp8_build.json, elf.txt (the cubins in the built library), fp8_checks.json, fp8_faults.json.
# PYTHON picks the interpreter that has torch (default python3); FP8_WORK the build folder (kept: reruns are
# incremental).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
mode=${1:?usage: run.sh sources TARBALL OUT [ARCH] [PREBUILT] | run.sh installed OUT}
shift

case $mode in
installed)
  out=${1:?OUT}
  mkdir -p "$out"
  exec "$py" "$here/run_suite.py" --installed --out "$out"
  ;;
sources)
  tarball=${1:?TARBALL} out=${2:?OUT} arch=${3:-90a} prebuilt=${4:-}
  work=${FP8_WORK:-build/fp8dev/work}
  mkdir -p "$work" "$out"
  tar -xzf "$tarball" -C "$work"
  src=$(ls -d "$work"/vllm-*/ | head -n 1)
  ops="$work/ops/python" label="built here from vLLM sources by build_ops.py"
  if ! "$py" "$here/build_ops.py" --vllm-src "$src" --cutlass "$work/cutlass" --out "$work/ops" \
    --arch "$arch" --jobs "$(nproc)" >"$out/build.log" 2>&1; then
    tail -n 40 "$out/build.log"
    [[ -n $prebuilt ]] || exit 1
    echo "run.sh: the build failed here; checking the prebuilt ops in $prebuilt instead"
    ops=$prebuilt label="built from vLLM sources by build_ops.py on another machine (the build here failed)"
  fi
  tail -n 12 "$out/build.log"
  [[ -f $work/ops/build.json ]] && cp "$work/ops/build.json" "$out/fp8_build.json"
  if command -v cuobjdump >/dev/null; then
    cuobjdump --list-elf "$ops/vllm/_C_fp8.so" >"$out/elf.txt" 2>&1 || true
    echo "cubins: $(awk '{print $NF}' "$out/elf.txt" | grep -o 'sm_[0-9a-z]*' | sort | uniq -c | tr '\n' ' ')"
  fi
  exec "$py" "$here/run_suite.py" --ops "$ops" --label "$label" --build-json "$work/ops/build.json" --out "$out"
  ;;
*)
  echo "run.sh: unknown mode $mode" >&2
  exit 2
  ;;
esac
