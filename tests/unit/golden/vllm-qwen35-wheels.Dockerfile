# Rendered by sparkforge from recipe vllm-qwen35-wheels (recipe hash a8f1f6f8bb21). Do not edit: change the
# recipe or this template (dockerfiles/vllm.Dockerfile.j2) and run `invoke render --recipe vllm-qwen35-wheels`.
# vLLM 0.33.0 from the official aarch64 wheel (sm_120 + sm_120f kernels run on sm_121), torch 2.14.0
# Stages: runtime. Secrets (CA bundle, HF token) arrive only as BuildKit secret mounts:
# the CA bundle over the system trust store of each downloading RUN, so apt, pip, git and CMake all use it.

# Compile-stage base, pinned by digest in the recipe; `invoke build --base-image` overrides it (mirrors, offline).
ARG BUILDER_IMAGE="nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6"
# Final-stage base, pinned by digest in the recipe; overridable like BUILDER_IMAGE.
ARG RUNTIME_IMAGE="ubuntu:24.04@sha256:80dd3c3b9c6cecb9f1667e9290b3bc61b78c2678c02cbdae5f0fea92cc6734ab"

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
      org.opencontainers.image.title="vllm-qwen35-wheels" \
      org.opencontainers.image.description="vLLM 0.33.0 from the official aarch64 wheel (sm_120 + sm_120f kernels run on sm_121), torch 2.14.0" \
      org.opencontainers.image.source="https://github.com/sparkforge/sparkforge" \
      org.opencontainers.image.version="0.33.0" \
      dev.sparkforge.recipe="vllm-qwen35-wheels" \
      dev.sparkforge.recipe-hash="a8f1f6f8bb216d3d3f401586954677be866acb76a6df58172c2a7977e5c32662" \
      dev.sparkforge.gpu="sm_121" \
      dev.sparkforge.pin.vllm="0.33.0@4ba787ec9" \
      dev.sparkforge.pin.torch="2.14.0" \
      dev.sparkforge.pin.transformers="5.20.2" \
      dev.sparkforge.pin.flashinfer="0.7.2.post1" \
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
 && /opt/sparkforge/bin/with-ca pip install torch==2.14.0 \
 && python3 /opt/sparkforge/bin/slim-venv.py --since /tmp/step-began --site /opt/venv/lib/python3.12/site-packages --cuda 13.0 --toolkit /opt/venv/cuda --strip --remove vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so --remove 'vllm/_flashmla*_C.abi3.so' --remove tokenspeed_mla --remove tokenspeed_triton --remove tilelang --remove z3 --remove vllm/third_party/deep_gemm --remove vllm/third_party/fmha_sm100 --remove nccl/m2n --remove flashinfer/data/csrc/cake_dsv4 --remove flashinfer/data/csrc/kda --remove 'nvidia/cu13/lib/libnvrtc*.alt.so.*' --remove 'nvidia/cu13/lib/libcusolverMg.so.*' --remove mistral_common/data --remove pycountry/locales --remove 'numpy/**/tests' --remove 'numba/**/tests' --remove 'sympy/**/tests' --remove 'networkx/**/tests' --remove mpmath/tests && rm /tmp/step-began
COPY constraints.txt /opt/sparkforge/constraints.txt
# Everything else under the constraints file: nothing may swap torch, transformers or flashinfer. nvcc comes
# as torch's own cuda-toolkit extra, so it matches the CUDA headers and libraries torch pins (a newer nvcc
# than the headers fails FlashInfer's JIT: "CUDA compiler and CUDA toolkit headers are incompatible").
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    --mount=type=secret,id=hf_token \
    touch /tmp/step-began \
 && /opt/sparkforge/bin/with-ca pip install -c /opt/sparkforge/constraints.txt \
      transformers==5.20.2 \
      flashinfer-python==0.7.2.post1 \
      'cuda-toolkit[nvcc]' \
      vllm==0.33.0 \
 && { pip check || echo "sparkforge: pip check reported conflicts above; verify decides"; } \
 && python3 /opt/sparkforge/bin/slim-venv.py --since /tmp/step-began --site /opt/venv/lib/python3.12/site-packages --cuda 13.0 --toolkit /opt/venv/cuda --strip --remove vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so --remove 'vllm/_flashmla*_C.abi3.so' --remove tokenspeed_mla --remove tokenspeed_triton --remove tilelang --remove z3 --remove vllm/third_party/deep_gemm --remove vllm/third_party/fmha_sm100 --remove nccl/m2n --remove flashinfer/data/csrc/cake_dsv4 --remove flashinfer/data/csrc/kda --remove 'nvidia/cu13/lib/libnvrtc*.alt.so.*' --remove 'nvidia/cu13/lib/libcusolverMg.so.*' --remove mistral_common/data --remove pycountry/locales --remove 'numpy/**/tests' --remove 'numba/**/tests' --remove 'sympy/**/tests' --remove 'networkx/**/tests' --remove mpmath/tests && rm /tmp/step-began
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
      org.opencontainers.image.title="vllm-qwen35-wheels" \
      org.opencontainers.image.description="vLLM 0.33.0 from the official aarch64 wheel (sm_120 + sm_120f kernels run on sm_121), torch 2.14.0" \
      org.opencontainers.image.source="https://github.com/sparkforge/sparkforge" \
      org.opencontainers.image.version="0.33.0" \
      dev.sparkforge.recipe="vllm-qwen35-wheels" \
      dev.sparkforge.recipe-hash="a8f1f6f8bb216d3d3f401586954677be866acb76a6df58172c2a7977e5c32662" \
      dev.sparkforge.gpu="sm_121" \
      dev.sparkforge.pin.vllm="0.33.0@4ba787ec9" \
      dev.sparkforge.pin.torch="2.14.0" \
      dev.sparkforge.pin.transformers="5.20.2" \
      dev.sparkforge.pin.flashinfer="0.7.2.post1" \
      dev.sparkforge.pin.cuda="13.0" \
      dev.sparkforge.base.builder="nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6" \
      dev.sparkforge.base.runtime="ubuntu:24.04@sha256:80dd3c3b9c6cecb9f1667e9290b3bc61b78c2678c02cbdae5f0fea92cc6734ab"
ENTRYPOINT ["vllm", "serve"]
