#!/usr/bin/env bash
# Pack what the compile probe's units need, from a built probe image, for benchmarks/probe_repro.py on a machine
# without Docker or network (the GPU machine): the patched vLLM sources, the generated Ninja files (the real compile
# commands), CUTLASS's headers, torch's headers, the CUDA wheels' headers and nvcc.profile, Python's headers, ccache
# and its two libraries, and the probe's own objects and report (for a cross-machine comparison). Paths are kept as
# they are in the image so every compile command runs unchanged. About 8 MB (xz).
#
#   benchmarks/probe_repro_pack.sh IMAGE OUT.tar.xz
#   e.g. IMAGE=sparkforge-candidate/ci-probe-amd64:<hash>-amd64-probe (`invoke probe --recipe tests/recipes/ci-probe-amd64.yaml`)
#
# Also writes OUT.tools.txt: sha256 of the image's nvcc toolchain binaries (the device run compares its own).
set -euo pipefail
image=${1:?usage: probe_repro_pack.sh IMAGE OUT.tar.xz} out=${2:?OUT.tar.xz}
site=/opt/venv/lib/python3.11/site-packages
paths=(
  /workspace/vllm/csrc
  /workspace/vllm/build/probe/torch_patched_headers
  /workspace/vllm/build/probe/build.ninja
  /workspace/vllm/build/probe/CMakeFiles/rules.ninja
  /opt/flashinfer-wheel/flashinfer/data/cutlass/include
  /opt/flashinfer-wheel/flashinfer/data/cutlass/tools/util/include
  $site/torch/include
  $site/nvidia/cu13/include
  $site/nvidia/cu13/bin/nvcc.profile
  /usr/include/python3.11
  /opt/sparkforge/probe
  /opt/sparkforge/source.json
  /opt/sparkforge/patches-applied.txt
)
root=$(mktemp -d)
trap 'rm -rf "$root"; [[ -n ${cid:-} ]] && docker rm "$cid" >/dev/null' EXIT
cid=$(docker create "$image")
for p in "${paths[@]}"; do
  mkdir -p "$root$(dirname "$p")"
  docker cp -L "$cid:$p" "$root$(dirname "$p")/"
done
# ccache and the one library it needs that a plain Ubuntu lacks, apart from system folders (/lib may be a link)
mkdir -p "$root/opt/probe-repro/bin" "$root/opt/probe-repro/lib"
docker cp -L "$cid:/usr/bin/ccache" "$root/opt/probe-repro/bin/"
docker cp -L "$cid:/lib/x86_64-linux-gnu/libhiredis.so.0.14" "$root/opt/probe-repro/lib/"
docker run --rm --entrypoint sh "$image" -c \
  'cd /opt/cuda && sha256sum bin/nvcc bin/cudafe++ bin/ptxas bin/fatbinary nvvm/bin/cicc nvvm/libdevice/libdevice.10.bc; nvcc --version | tail -n 2; g++ --version | head -n 1' \
  >"${out%.tar.xz}.tools.txt"
tar -C "$root" -cf - workspace opt usr | xz -6 -T1 >"$out"
ls -l "$out"
