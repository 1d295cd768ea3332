# Rendered by sparkforge from recipe vllm-qwen35 (recipe hash dd49953b0490). Do not edit: change the
# recipe or this template (dockerfiles/vllm.Dockerfile.j2) and run `invoke render --recipe vllm-qwen35`.
# vLLM 0.31.0 compiled from source for GB10 (native sm_121a kernels), torch 2.13.0 cu130
# Stages: toolchain -> source -> build-env -> probe -> build -> runtime. Secrets (CA bundle, HF token) arrive only as BuildKit secret mounts:
# the CA bundle over the system trust store of each downloading RUN, so apt, pip, git and CMake all use it.

# Compile-stage base, pinned by digest in the recipe; `invoke build --base-image` overrides it (mirrors, offline).
ARG BUILDER_IMAGE="nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6"
# Final-stage base, pinned by digest in the recipe; overridable like BUILDER_IMAGE.
ARG RUNTIME_IMAGE="ubuntu:24.04@sha256:80dd3c3b9c6cecb9f1667e9290b3bc61b78c2678c02cbdae5f0fea92cc6734ab"

########################################################################################################
# Stage toolchain: Python venv, build tools, torch 2.13.0 from the recipe's index
########################################################################################################
FROM ${BUILDER_IMAGE} AS toolchain
# vLLM's configure needs a C++20 compiler, Python headers and `patch` (its torch-header hotfix) besides git.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Package installs must never prompt.
ARG DEBIAN_FRONTEND=noninteractive
# The build's time from its pinned bases (reproducible builds): Python then writes hash-checked bytecode.
ARG SOURCE_DATE_EPOCH
COPY files/with-ca files/ensure-python /opt/sparkforge/bin/
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    /opt/sparkforge/bin/ensure-python git ccache g++ patch python3-config=python3-dev && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv PIP_DISABLE_PIP_VERSION_CHECK=1
COPY constraints.txt /opt/sparkforge/constraints.txt
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    /opt/sparkforge/bin/with-ca pip install --index-url https://download.pytorch.org/whl/cu130 torch==2.13.0

########################################################################################################
# Stage source: vLLM 0.31.0 at db9527a46873454610df6dbedf79a36d6bf1a7f6, verified, patch series applied
# (independent of torch: BuildKit runs it beside toolchain, and a patch change keeps the torch layer)
########################################################################################################
FROM ${BUILDER_IMAGE} AS source
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Package installs must never prompt.
ARG DEBIAN_FRONTEND=noninteractive
# The build's time from its pinned bases (reproducible builds): Python then writes hash-checked bytecode.
ARG SOURCE_DATE_EPOCH
COPY files/with-ca files/ensure-python /opt/sparkforge/bin/
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    /opt/sparkforge/bin/ensure-python git
# Empty: git fetch of the pinned commit. Else a tarball URL (release sdist or GitHub archive) whose commit is checked.
ARG VLLM_SOURCE_URL=
WORKDIR /workspace/vllm
COPY files/fetch-source.py /opt/sparkforge/bin/fetch-source.py
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    /opt/sparkforge/bin/with-ca python3 /opt/sparkforge/bin/fetch-source.py \
      --repository https://github.com/vllm-project/vllm --commit db9527a46873454610df6dbedf79a36d6bf1a7f6 \
      --version 0.31.0 --url "${VLLM_SOURCE_URL}" --dest /workspace/vllm \
      --record /opt/sparkforge/source.json
COPY patches/ /opt/sparkforge/patches/
# Each patch is checked before it is applied, in series order; the applied list is kept in the image.
RUN : > /opt/sparkforge/patches-applied.txt \
 && git apply --check /opt/sparkforge/patches/0001-cmake-keep-sm121-on-cuda13.patch \
 && git apply /opt/sparkforge/patches/0001-cmake-keep-sm121-on-cuda13.patch \
 && echo 0001-cmake-keep-sm121-on-cuda13.patch >> /opt/sparkforge/patches-applied.txt \
 && cat /opt/sparkforge/patches-applied.txt

########################################################################################################
# Stage build-env: the patched source in the toolchain with vLLM's build requirements (shared by probe and build)
########################################################################################################
FROM toolchain AS build-env
COPY --from=source /workspace/vllm /workspace/vllm
COPY --from=source /opt/sparkforge/source.json /opt/sparkforge/patches-applied.txt /opt/sparkforge/
WORKDIR /workspace/vllm
# Explicit arch list: a GPU-less build cannot detect it, and torch's autodetect mis-names 12.1.
ENV TORCH_CUDA_ARCH_LIST="12.1a"
ENV VLLM_TARGET_DEVICE=cuda CCACHE_DIR=/root/.cache/ccache SETUPTOOLS_SCM_PRETEND_VERSION="0.31.0"
# ccache keys independent of the build directory, so the build reuses what the probe compiled.
ENV CCACHE_BASEDIR=/workspace/vllm CCACHE_NOHASHDIR=1
# Reproducible libraries (benchmarks/repro.md): Release, not vLLM's default RelWithDebInfo, whose -g debug info
# names nvcc's per-process temp files and so changes each library's GNU build ID; the runtime strips it anyway.
ENV CMAKE_BUILD_TYPE=Release
# Rust extensions (vllm-rs, _rust_tool_parser) per the recipe's build.rust: required (1) or left out (0, no cargo).
ENV VLLM_REQUIRE_RUST_FRONTEND=0
# Upstream's own step: drop torch pins from vLLM's requirements so the installed torch is kept.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    python3 tools/use_existing_torch.py --prefix \
 && /opt/sparkforge/bin/with-ca pip install -c /opt/sparkforge/constraints.txt -r requirements/build/cuda.txt

########################################################################################################
# Stage probe: vLLM's real CMake configure, then the recipe's probe units compiled alone and measured
# (`invoke probe`: minutes to the first compile error instead of an hour)
########################################################################################################
FROM build-env AS probe
COPY files/probe-compile.py /opt/sparkforge/bin/
# Always a real compile (what is measured sizes the build's MAX_JOBS), still stored in ccache for the build.
RUN --mount=type=cache,target=/root/.cache/ccache \
    CCACHE_RECACHE=1 python3 /opt/sparkforge/bin/probe-compile.py --source /workspace/vllm --build /workspace/vllm/build/probe \
      --out /opt/sparkforge/probe --nvcc-threads 2 \
      --unit csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_sm120_fp8.cu \
      --unit csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_blockwise_sm120_fp8.cu \
      --unit csrc/libtorch_stable/quantization/fp4/nvfp4_quant_kernels.cu \
      --unit csrc/libtorch_stable/quantization/fp4/nvfp4_scaled_mm_sm120_kernels.cu \
      --unit csrc/libtorch_stable/quantization/fp4/nvfp4_blockwise_moe_kernel.cu \
      --unit csrc/libtorch_stable/activation_kernels.cu

########################################################################################################
# Stage build: the vLLM wheel for 12.1a against the installed torch (never swapped)
########################################################################################################
FROM build-env AS build
# Peak memory (GB) of one heavy unit as the probe measured it on this host; 0 = not probed (a safe default).
ARG SPARKFORGE_UNIT_PEAK_GB=0
COPY files/cap-jobs.py /opt/sparkforge/bin/
# Local symbols left out of the libraries (the host objects' STT_FILE names nvcc's per-process temp file);
# exported symbols and the build ID stay for backtraces.
ENV CMAKE_ARGS="${CMAKE_ARGS} -DCMAKE_MODULE_LINKER_FLAGS=-Wl,--discard-all -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--discard-all"
# MAX_JOBS/NVCC_THREADS: the recipe's 6 x 2 is the ceiling, capped by the memory this build has.
RUN --mount=type=cache,target=/root/.cache/ccache \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    eval "$(python3 /opt/sparkforge/bin/cap-jobs.py --max-jobs 6 --nvcc-threads 2 --unit-peak-gb "${SPARKFORGE_UNIT_PEAK_GB}")" \
 && /opt/sparkforge/bin/with-ca python3 setup.py bdist_wheel --dist-dir=/wheels --py-limited-api=cp38 \
 && ls -l /wheels

########################################################################################################
# Stage base: the runtime OS layer: Python venv and sparkforge's helpers (also a quick smoke target).
# No CUDA here: torch's and vLLM's CUDA wheels carry every CUDA library once; the driver comes from the host.
########################################################################################################
FROM ${RUNTIME_IMAGE} AS base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Package installs must never prompt.
ARG DEBIAN_FRONTEND=noninteractive
# The build's time from its pinned bases (reproducible builds): Python then writes hash-checked bytecode.
ARG SOURCE_DATE_EPOCH
COPY files/with-ca files/ensure-python /opt/sparkforge/bin/
COPY files/slim-venv.py /opt/sparkforge/bin/
# g++: the host compiler nvcc drives when FlashInfer JIT-compiles a kernel at serve time.
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    /opt/sparkforge/bin/ensure-python g++ && python3 -m venv /opt/venv \
 && ln -s /opt/venv/lib/python3.12/site-packages/nvidia/cu13 /opt/venv/cuda
ENV PATH=/opt/venv/cuda/bin:/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv PIP_DISABLE_PIP_VERSION_CHECK=1
# What the NVIDIA container runtime reads: which GPUs and driver parts to mount, and the driver's CUDA floor.
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility NVIDIA_REQUIRE_CUDA="cuda>=13.0"
# Triton and FlashInfer find nvcc, ptxas and the CUDA headers here (NVIDIA's CUDA wheels, one copy).
ENV CUDA_HOME=/opt/venv/cuda
# Static labels only: a per-build ARG here would reach every later RUN and defeat the cache.
LABEL \
      org.opencontainers.image.title="vllm-qwen35" \
      org.opencontainers.image.description="vLLM 0.31.0 compiled from source for GB10 (native sm_121a kernels), torch 2.13.0 cu130" \
      org.opencontainers.image.source="https://github.com/sparkforge/sparkforge" \
      org.opencontainers.image.version="0.31.0" \
      dev.sparkforge.recipe="vllm-qwen35" \
      dev.sparkforge.recipe-hash="dd49953b049052b28822ef1ec15341eb7f18424a4643608cc1e07708dac3ba80" \
      dev.sparkforge.gpu="sm_121" \
      dev.sparkforge.pin.vllm="0.31.0@db9527a46873454610df6dbedf79a36d6bf1a7f6" \
      dev.sparkforge.pin.torch="2.13.0" \
      dev.sparkforge.pin.transformers="5.17.0" \
      dev.sparkforge.pin.flashinfer="0.7.0.post1" \
      dev.sparkforge.pin.cuda="13.0" \
      dev.sparkforge.base.builder="nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6" \
      dev.sparkforge.base.runtime="ubuntu:24.04@sha256:80dd3c3b9c6cecb9f1667e9290b3bc61b78c2678c02cbdae5f0fea92cc6734ab"
# The stage and the build's time from its pins (what `invoke rebuild --check` rebuilds with).
LABEL dev.sparkforge.stage="base" dev.sparkforge.source-date-epoch="${SOURCE_DATE_EPOCH}"

########################################################################################################
# Stage runtime: the served image: pinned wheels under constraints, lock, labels, the image test suite.
# Each pip step ends with slim-venv in the same step, so what it removes never reaches a layer.
########################################################################################################
FROM base AS runtime
# torch alone first, from its own index: the biggest layer, reused when anything else changes.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    touch /tmp/step-began \
 && /opt/sparkforge/bin/with-ca pip install --index-url https://download.pytorch.org/whl/cu130 torch==2.13.0 \
 && python3 /opt/sparkforge/bin/slim-venv.py --since /tmp/step-began --site /opt/venv/lib/python3.12/site-packages --cuda 13.0 --toolkit /opt/venv/cuda --strip && rm /tmp/step-began
COPY constraints.txt /opt/sparkforge/constraints.txt
COPY --from=build /opt/sparkforge/source.json /opt/sparkforge/patches-applied.txt /opt/sparkforge/
# Everything else under the constraints file: nothing may swap torch, transformers or flashinfer. nvcc comes
# as torch's own cuda-toolkit extra, so it matches the CUDA headers and libraries torch pins (a newer nvcc
# than the headers fails FlashInfer's JIT: "CUDA compiler and CUDA toolkit headers are incompatible").
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    --mount=type=secret,id=hf_token \
    --mount=type=bind,from=build,source=/wheels,target=/opt/sparkforge/wheels \
    touch /tmp/step-began \
 && /opt/sparkforge/bin/with-ca pip install -c /opt/sparkforge/constraints.txt \
      transformers==5.17.0 \
      flashinfer-python==0.7.0.post1 \
      'cuda-toolkit[nvcc]' \
      /opt/sparkforge/wheels/vllm-*.whl \
 && { pip check || echo "sparkforge: pip check reported conflicts above; verify decides"; } \
 && python3 /opt/sparkforge/bin/slim-venv.py --since /tmp/step-began --site /opt/venv/lib/python3.12/site-packages --cuda 13.0 --toolkit /opt/venv/cuda --strip && rm /tmp/step-began
# RDMA userspace, pinned: NCCL dlopens libibverbs.so.1 and needs the mlx5 provider, else it uses TCP sockets.
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    apt-get update \
 && apt-get install -y --no-install-recommends libibverbs1=50.0-2ubuntu0.2 ibverbs-providers=50.0-2ubuntu0.2 librdmacm1t64=50.0-2ubuntu0.2 perftest=24.01.0+0.38-1build2 \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log \
    /var/log/alternatives.log /var/cache/debconf/*-old /var/cache/ldconfig/aux-cache
# Runtime environment from the recipe (each value is validated against a strict pattern).
ENV TRITON_PTXAS_PATH="/opt/venv/cuda/bin/ptxas" TRITON_PTXAS_BLACKWELL_PATH="/opt/venv/cuda/bin/ptxas" RAY_memory_usage_threshold="1.0"
COPY lock.json /opt/sparkforge/lock.json
# Last: changing the suite reruns only this step.
COPY image-tests/ /opt/sparkforge/image-tests/
# Build time and project revision are inputs of the build command, not of the rendered context.
ARG SPARKFORGE_CREATED=unknown
# The sparkforge commit the context was rendered from.
ARG SPARKFORGE_REVISION=unknown
LABEL org.opencontainers.image.created="${SPARKFORGE_CREATED}" \
      org.opencontainers.image.revision="${SPARKFORGE_REVISION}" \
      dev.sparkforge.stage="runtime" \
      org.opencontainers.image.title="vllm-qwen35" \
      org.opencontainers.image.description="vLLM 0.31.0 compiled from source for GB10 (native sm_121a kernels), torch 2.13.0 cu130" \
      org.opencontainers.image.source="https://github.com/sparkforge/sparkforge" \
      org.opencontainers.image.version="0.31.0" \
      dev.sparkforge.recipe="vllm-qwen35" \
      dev.sparkforge.recipe-hash="dd49953b049052b28822ef1ec15341eb7f18424a4643608cc1e07708dac3ba80" \
      dev.sparkforge.gpu="sm_121" \
      dev.sparkforge.pin.vllm="0.31.0@db9527a46873454610df6dbedf79a36d6bf1a7f6" \
      dev.sparkforge.pin.torch="2.13.0" \
      dev.sparkforge.pin.transformers="5.17.0" \
      dev.sparkforge.pin.flashinfer="0.7.0.post1" \
      dev.sparkforge.pin.cuda="13.0" \
      dev.sparkforge.base.builder="nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6" \
      dev.sparkforge.base.runtime="ubuntu:24.04@sha256:80dd3c3b9c6cecb9f1667e9290b3bc61b78c2678c02cbdae5f0fea92cc6734ab"
ENTRYPOINT ["vllm", "serve"]
