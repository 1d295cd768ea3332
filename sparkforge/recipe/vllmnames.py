"""The pinned vLLM's own names: `vllm serve` flags (argparse) and variables (vllm/envs.py).

Generated from the wheel by sparkforge.preflight.serveflags.render_names (preflight's reader); `invoke preflight`
checks it against the recipe's pinned vLLM. Edit the allow-list, not this file.
"""


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


VERSION = "0.33.0"
FLAGS = _words(
    """
ac additional-config aggregate-engine-logging all2all-backend allow-credentials
allow-deprecated-quantization allowed-headers allowed-local-media-path allowed-media-domains
allowed-methods allowed-origins anthropic-disabled-thinking-effort api-key api-server-count asc
async-scheduling attention-backend attention-config aux-output-config block-size cc chat-template
chat-template-content-format code-revision cohere-format cohere-is-reasoning-model
collect-detailed-traces compilation-config config config-format convert cp-kv-cache-interleave-size
cpu-distributed-timeout-seconds cpu-offload-gb cpu-offload-params cudagraph-capture-sizes
cudagraph-metrics custom-histogram-buckets data-parallel-address data-parallel-backend
data-parallel-external-lb data-parallel-hybrid-lb data-parallel-multi-port-external-lb
data-parallel-rank data-parallel-rpc-port data-parallel-size data-parallel-size-local
data-parallel-start-rank data-parallel-supervisor-port dbo-decode-token-threshold
dbo-prefill-token-threshold dc dcp dcp-comm-backend dcp-kv-cache-interleave-size dcp-q-replicate
decode-context-parallel-size default-chat-template-kwargs default-mm-loras device-ids
device-memory-utilization diffusion-config disable-access-log-for-endpoints disable-cascade-attn
disable-chunked-mm-input disable-custom-all-reduce disable-fastapi-docs
disable-hybrid-kv-cache-manager disable-log-stats disable-nccl-for-dp-synchronization
disable-sliding-window disable-uvicorn-access-log distributed-executor-backend
distributed-timeout-seconds download-dir dp dp-supervisor-probe-failure-threshold
dp-supervisor-probe-interval-s dp-supervisor-probe-timeout-s dp-sync-interval dpa dpb dpe dph dpl
dpm dpn dpp dpr dtype ec-manager-config ec-transfer-config elastic-ep-max-dp-size
enable-auto-tool-choice enable-batch-sharded-sampling enable-chunked-prefill enable-cumem-allocator
enable-dbo enable-elastic-ep enable-ep-weight-filter enable-eplb enable-expert-parallel
enable-fault-tolerance enable-flash-late-interaction enable-flashinfer-autotune
enable-force-include-usage enable-hc-sp enable-layerwise-nvtx-tracing enable-log-deltas
enable-log-outputs enable-log-requests enable-logging-iteration-details enable-lora
enable-mamba-cache-stochastic-rounding enable-mamba-shared-prefix-checkpoint enable-mfu-metrics
enable-mixed-moe-lora-format enable-mm-embeds enable-moe-shared-loras enable-nccl-comm-suspend
enable-offline-docs enable-per-request-metrics enable-prefix-caching enable-prompt-embeds
enable-prompt-tokens-details enable-request-id-headers enable-return-routed-experts enable-scale-out
enable-server-load-tracking enable-shm-tensor-arena enable-sleep-mode enable-ssl-refresh
enable-tokenizer-info-endpoint enable-tower-connector-lora enable-trace-replay enforce-eager
engram-config ep eplb-config exclude-tools-when-tool-choice-none expert-placement-strategy
fail-on-environ-validation fault-tolerance-config fingerprint-mode fingerprint-value
fully-sharded-loras gdn-prefill-backend generation-config gpu-memory-utilization grpc grpc-port
h11-max-header-count h11-max-incomplete-event-size headless hf-config-path hf-overrides hf-token
host ignore-patterns interleave-mm-strings io-processor-plugin ir-op-priority jit-monitor-mode
jit-monitor-verbose kda-decode-backend kda-prefill-backend kernel-config kv-cache-dtype
kv-cache-dtype-skip-layers kv-cache-memory-bytes kv-cache-metrics kv-cache-metrics-sample
kv-events-config kv-offloading-backend kv-offloading-size kv-sharing-fast-prefill kv-transfer-config
language-model-only limit-mm-per-prompt linear-backend load-format log-config-file log-error-stack
log-level logging-config logits-processors logprobs-mode long-prefill-token-threshold
long-prefill-token-threshold-adaptive lora-dtype lora-modules lora-target-modules mamba-backend
mamba-block-size mamba-cache-dtype mamba-cache-mode mamba-cache-philox-rounds mamba-ssm-cache-dtype
mamba-ssu-algorithm master-addr master-port max-cpu-loras max-cudagraph-capture-size max-log-len
max-logprobs max-lora-cls-labels max-lora-rank max-loras max-model-len max-num-active-seqs
max-num-batched-tokens max-num-queued-reqs max-num-queued-tokens max-num-scheduled-tokens
max-num-seqs max-parallel-loading-workers media-io-kwargs middleware mm-device-do-normalize
mm-encoder-attn-backend mm-encoder-attn-dtype mm-encoder-fp8-scale-path
mm-encoder-fp8-scale-save-margin mm-encoder-fp8-scale-save-path mm-encoder-only mm-encoder-tp-mode
mm-hasher-algorithm mm-ipc-gpu-memory-gb mm-processor-cache-gb mm-processor-cache-type
mm-processor-device mm-processor-kwargs mm-shm-cache-max-object-size-mb mm-tensor-ipc model
model-class-overrides model-impl model-loader-extra-config moe-backend monokernel n nnodes node-rank
num-gpu-blocks-override numa-bind numa-bind-cpus numa-bind-nodes offload-backend offload-group-size
offload-num-in-group offload-params offload-prefetch-step optimization-level otlp-traces-endpoint
override-generation-config pcp per-request-spec-decode-metrics performance-mode
pipeline-parallel-size pooler-config port pp prefill-context-parallel-size prefill-schedule-interval
prefix-cache-retention-interval prefix-caching-hash-algo prefix-match-unit profiler-config
pt-load-map-location q quantization quantization-config r ray-workers-use-nsight reasoning-config
reasoning-effort-map reasoning-parser reasoning-parser-plugin renderer-num-workers
replayssm-buffer-len response-role return-sampling-mask return-tokens-as-token-ids revision
root-path runner safetensors-load-strategy safetensors-prefetch-block-size
safetensors-prefetch-num-threads sc scheduler-cls scheduler-reserve-full-isl scheduling-policy seed
served-model-name show-hidden-metrics-for-version shutdown-timeout skip-mm-profiling
skip-tokenizer-init sleep-mode-backend sleep-mode-offload-cudagraph sleep-preserve-parameter-names
sparse-indexer-topk-backend spec-method spec-model spec-tokens specialize-active-lora
speculative-config sse-keep-alive-interval ssl-ca-certs ssl-cert-reqs ssl-certfile ssl-ciphers
ssl-keyfile stream-interval structured-outputs-config swa-bounded-replay tensor-parallel-size
tokenizer tokenizer-mode tokenizer-revision tokens-only tool-call-parser tool-parser-plugin
tool-server tool-strict-level tp trust-remote-code trust-request-chat-template
trust-request-mm-kwargs ubatch-size uds use-fp64-gumbel use-replayssm use-tqdm-on-load
uvicorn-log-level video-pruning-method video-pruning-rate watchdog-config watermark watermark-config
weight-transfer-config worker-cls worker-extension-cls
"""
)
ALIASES = {
    "ac": "attention-config",
    "asc": "api-server-count",
    "cc": "compilation-config",
    "dc": "diffusion-config",
    "dcp": "decode-context-parallel-size",
    "dp": "data-parallel-size",
    "dpa": "data-parallel-address",
    "dpb": "data-parallel-backend",
    "dpe": "data-parallel-external-lb",
    "dph": "data-parallel-hybrid-lb",
    "dpl": "data-parallel-size-local",
    "dpm": "data-parallel-multi-port-external-lb",
    "dpn": "data-parallel-rank",
    "dpp": "data-parallel-rpc-port",
    "dpr": "data-parallel-start-rank",
    "ep": "enable-expert-parallel",
    "n": "nnodes",
    "pcp": "prefill-context-parallel-size",
    "pp": "pipeline-parallel-size",
    "q": "quantization",
    "r": "node-rank",
    "sc": "speculative-config",
    "tp": "tensor-parallel-size",
}
ENV = _words(
    """
CMAKE_BUILD_TYPE CUDA_HOME CUDA_VISIBLE_DEVICES FORCE_COLOR LD_LIBRARY_PATH LOCAL_RANK MAX_JOBS
MOONCAKE_PREFERRED_SEGMENT MOONCAKE_REQUESTER_LOCAL_HOSTNAME NO_COLOR NVCC_THREADS S3_ACCESS_KEY_ID
S3_ENDPOINT_URL S3_SECRET_ACCESS_KEY VERBOSE VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN
VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE VLLM_ALLOW_INSECURE_SERIALIZATION
VLLM_ALLOW_LONG_MAX_MODEL_LEN VLLM_ALLOW_RUNTIME_LORA_UPDATING VLLM_ALLREDUCE_USE_FLASHINFER
VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC VLLM_ALLREDUCE_USE_SYMM_MEM VLLM_API_KEY VLLM_ASSETS_CACHE
VLLM_ASSETS_CACHE_MODEL_CLEAN VLLM_AUDIO_FETCH_TIMEOUT VLLM_B12X_MOE_FP4_FORCE_A16
VLLM_BATCH_INVARIANT VLLM_BEAM_ALWAYS_CONSTRAIN_OUTPUT VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER
VLLM_BUILD_COMMIT VLLM_BUILD_PIPELINE VLLM_BUILD_URL VLLM_CACHE_ROOT VLLM_CHAT_TEMPLATE_FUEL
VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT VLLM_COHERE2_ATTN_MOE_DUAL_STREAM_TOKEN_THRESHOLD
VLLM_COMPILE_CACHE_SAVE_FORMAT VLLM_COMPUTE_NANS_IN_LOGITS VLLM_CONFIGURE_LOGGING VLLM_CONFIG_ROOT
VLLM_CPU_ATTN_SPLIT_KV VLLM_CPU_CI_ENV VLLM_CPU_INT4_W4A8 VLLM_CPU_KVCACHE_SPACE
VLLM_CPU_NUM_OF_RESERVED_CPU VLLM_CPU_OMP_THREADS_BIND VLLM_CUDART_SO_PATH
VLLM_CUDA_COMPATIBILITY_PATH VLLM_CUSTOM_SCOPES_FOR_PROFILING VLLM_DBO_COMM_SMS VLLM_DCP_Q_REPLICATE
VLLM_DEBUG_DUMP_PATH VLLM_DEBUG_LOG_API_SERVER_RESPONSE VLLM_DEBUG_MFU_METRICS VLLM_DEBUG_WORKSPACE
VLLM_DEEPEPLL_NVFP4_DISPATCH VLLM_DEEPEP_BUFFER_SIZE_MB VLLM_DEEPEP_HIGH_THROUGHPUT_FORCE_INTRA_NODE
VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL VLLM_DEEPEP_V2_ALLOW_HYBRID_MODE
VLLM_DEEPEP_V2_ALLOW_MULTIPLE_REDUCTION VLLM_DEEPEP_V2_PREFER_OVERLAP VLLM_DEEP_GEMM_WARMUP
VLLM_DISABLED_KERNELS VLLM_DISABLE_COMPILE_CACHE VLLM_DISABLE_DSV4_MEGAMOE_SHARED_EXPERT_FUSION
VLLM_DISABLE_LOG_LOGO VLLM_DISABLE_PYNCCL VLLM_DISABLE_REQUEST_ID_RANDOMIZATION
VLLM_DISABLE_SHARED_EXPERTS_STREAM VLLM_DISTRIBUTED_USE_SPLIT_GROUP VLLM_DOCKER_BUILD_CONTEXT
VLLM_DO_NOT_TRACK VLLM_DP_MASTER_IP VLLM_DP_MASTER_PORT VLLM_DP_RANK VLLM_DP_RANK_LOCAL VLLM_DP_SIZE
VLLM_EC_SIDE_CHANNEL_HOST VLLM_EC_SIDE_CHANNEL_PORT VLLM_ELASTIC_EP_DRAIN_REQUESTS
VLLM_ELASTIC_EP_SCALE_UP_LAUNCH VLLM_ENABLE_COHERE_API VLLM_ENABLE_CUDAGRAPH_GC
VLLM_ENABLE_CUDA_COMPATIBILITY VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE VLLM_ENABLE_GEMM_RS
VLLM_ENABLE_HPC_OPS VLLM_ENABLE_INDUCTOR_COORDINATE_DESCENT_TUNING VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE
VLLM_ENABLE_PREGRAD_PASSES VLLM_ENABLE_RESPONSES_API_STORE VLLM_ENABLE_STARTUP_PLAN
VLLM_ENABLE_V1_MULTIPROCESSING VLLM_ENFORCE_STRICT_TOOL_CALLING VLLM_ENGINE_READY_TIMEOUT_S
VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS VLLM_FASTSAFETENSORS_QUEUE_SIZE VLLM_FLASHINFER_ALLREDUCE_BACKEND
VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS
VLLM_FLASHINFER_MOE_A2A_LOW_PRECISION_COMBINE VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE
VLLM_FLOAT32_MATMUL_PRECISION VLLM_FORCE_AOT_LOAD VLLM_GC_DEBUG VLLM_GDN_DECODE_KERNEL
VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS VLLM_GPT_OSS_SYSTEM_TOOL_MCP_LABELS
VLLM_GPU_NIC_PCIE_MAPPING VLLM_GPU_SYNC_CHECK VLLM_HAS_FLASHINFER_CUBIN VLLM_HOST_IP
VLLM_HTTP_MAX_REQUEST_BODY_SIZE VLLM_HTTP_TIMEOUT_KEEP_ALIVE VLLM_HUMMING_INPUT_QUANT_CONFIG
VLLM_HUMMING_MOE_GEMM_TYPE VLLM_HUMMING_ONLINE_QUANT_CONFIG VLLM_HUMMING_USE_F16_ACCUM
VLLM_IMAGE_FETCH_TIMEOUT VLLM_IMAGE_TAG VLLM_KEEP_ALIVE_ON_ENGINE_DEATH
VLLM_KIMI_K3_AUX_ATTN_RES_STREAM VLLM_KIMI_K3_GEMM_AR VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT
VLLM_KV_CACHE_LAYOUT VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES VLLM_KV_OFFLOAD_MAX_BATCH_DESCRIPTORS
VLLM_LOGGING_COLOR VLLM_LOGGING_CONFIG_PATH VLLM_LOGGING_LEVEL VLLM_LOGGING_PREFIX
VLLM_LOGGING_STREAM VLLM_LOG_BATCHSIZE_INTERVAL VLLM_LOG_MODEL_INSPECTION VLLM_LOG_STATS_INTERVAL
VLLM_LOOPBACK_IP VLLM_LORA_DISABLE_PDL VLLM_LORA_ENABLE_DUAL_STREAM VLLM_LORA_RESOLVER_CACHE_DIR
VLLM_LORA_RESOLVER_HF_REPO_LIST VLLM_MAIN_CUDA_VERSION VLLM_MARLIN_INPUT_DTYPE
VLLM_MARLIN_USE_ATOMIC_ADD VLLM_MAX_AUDIO_CLIP_FILESIZE_MB VLLM_MAX_AUDIO_DECODE_BYTES
VLLM_MAX_AUDIO_DECODE_DURATION_S VLLM_MAX_AUDIO_PREPROCESS_WORKERS VLLM_MAX_BAD_WORDS_TOTAL_TOKENS
VLLM_MAX_COMPLETION_PROMPTS VLLM_MAX_EMBED_DECODE_BYTES VLLM_MAX_IMAGE_PIXELS
VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB VLLM_MAX_MEDIA_REQUEST_DECODE_BYTES
VLLM_MAX_MEDIA_REQUEST_DOWNLOAD_SIZE_MB VLLM_MAX_NUM_BAD_WORDS VLLM_MAX_N_SEQUENCES
VLLM_MAX_STOP_STRINGS VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE VLLM_MEDIA_CACHE
VLLM_MEDIA_CACHE_MAX_SIZE_MB VLLM_MEDIA_CACHE_TTL_HOURS VLLM_MEDIA_CONNECTOR
VLLM_MEDIA_FETCH_MAX_RETRIES VLLM_MEDIA_LOADING_THREAD_COUNT VLLM_MEDIA_URL_ALLOW_REDIRECTS
VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS VLLM_MLA_DISABLE VLLM_MODEL_REDIRECT_PATH
VLLM_MOE_ROUTING_SIMULATION_STRATEGY VLLM_MOE_SKIP_PADDING VLLM_MOE_USE_DEEP_GEMM
VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT VLLM_MOONCAKE_BOOTSTRAP_PORT VLLM_MOONCAKE_CONNECTOR_TIMEOUT
VLLM_MOONCAKE_DISK_STAGING_USABLE_RATIO VLLM_MOONCAKE_LOAD_RECV_THREADS VLLM_MOONCAKE_STORE_TIER_LOG
VLLM_MQ_MAX_CHUNK_BYTES_MB VLLM_MSGPACK_ZERO_COPY_THRESHOLD VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD
VLLM_MXFP4_EMULATION_DEQUANT_AT_LOAD VLLM_MXFP8_EMULATION_DEQUANT_AT_LOAD VLLM_NCCL_INCLUDE_PATH
VLLM_NCCL_SO_PATH VLLM_NIC_SELECTION_VARS VLLM_NIXL_SIDE_CHANNEL_HOST VLLM_NIXL_SIDE_CHANNEL_PORT
VLLM_NO_USAGE_STATS VLLM_NVTX_SCOPES_FOR_PROFILING VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME
VLLM_P2P_HANDSHAKE_TIMEOUT_S VLLM_P2P_IDLE_TIMEOUT_S VLLM_P2P_MAX_PEERS VLLM_P2P_SIDE_CHANNEL_HOST
VLLM_P2P_SIDE_CHANNEL_PORT VLLM_PATTERN_MATCH_DEBUG VLLM_PLUGINS VLLM_PORT VLLM_PP_LAYER_PARTITION
VLLM_PROCESS_NAME_PREFIX VLLM_RAISE_ON_LOGIT_NANS VLLM_RANDOMIZE_DP_DUMMY_INPUTS
VLLM_RAY_BUNDLE_INDICES VLLM_RAY_DP_PACK_STRATEGY VLLM_RAY_DP_PLACEMENT_NODE_IPS
VLLM_RAY_EXTRA_ENV_VARS_TO_COPY VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY VLLM_RAY_PER_WORKER_GPUS
VLLM_REGEX_COMPILATION_TIMEOUT_S VLLM_REPLICATE_EMBED VLLM_REQUEST_BODY_LOG_LEVEL
VLLM_RINGBUFFER_WARNING_INTERVAL VLLM_ROCM_AITER_MLA_ASM_PADDING VLLM_ROCM_AITER_MOE_DISPATCH_POLICY
VLLM_ROCM_FP8_MFMA_PAGE_ATTN VLLM_ROCM_FP8_PADDING VLLM_ROCM_MOE_PADDING
VLLM_ROCM_MUSE_MOE_ONLINE_QUANT VLLM_ROCM_MUSE_MOE_REDUCE_DTYPE
VLLM_ROCM_QUICK_REDUCE_CAST_BF16_TO_FP16 VLLM_ROCM_QUICK_REDUCE_MAX_SIZE_BYTES_MB
VLLM_ROCM_QUICK_REDUCE_MIN_SIZE_BYTES_MB VLLM_ROCM_QUICK_REDUCE_QUANTIZATION
VLLM_ROCM_QUICK_REDUCE_QUANTIZATION_MIN_SIZE_KB VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT
VLLM_ROCM_SLEEP_MEM_CHUNK_SIZE VLLM_ROCM_USE_AITER VLLM_ROCM_USE_AITER_CUSTOM_AR
VLLM_ROCM_USE_AITER_FP4BMM VLLM_ROCM_USE_AITER_FP8BMM VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS
VLLM_ROCM_USE_AITER_LINEAR VLLM_ROCM_USE_AITER_LINEAR_HIPBMM VLLM_ROCM_USE_AITER_MHA
VLLM_ROCM_USE_AITER_MLA VLLM_ROCM_USE_AITER_MOE VLLM_ROCM_USE_AITER_MOE_A4W4_DSV4
VLLM_ROCM_USE_AITER_MOE_SITUV2 VLLM_ROCM_USE_AITER_RMSNORM VLLM_ROCM_USE_AITER_TRITON_GEMM
VLLM_ROCM_USE_AITER_TRITON_ROPE VLLM_ROCM_USE_AITER_TRITON_SPARSE_MLA
VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION VLLM_ROCM_USE_SKINNY_GEMM VLLM_RPC_BASE_PATH
VLLM_RUST_FRONTEND_PATH VLLM_SERVER_DEV_MODE VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD
VLLM_SKIP_MODEL_NAME_VALIDATION VLLM_SKIP_P2P_CHECK VLLM_SKIP_PRECOMPILED_VERSION_SUFFIX
VLLM_SKIP_VERSION_SUFFIX VLLM_SPARSE_INDEXER_MAX_LOGITS_MB VLLM_SSM_CONV_STATE_LAYOUT
VLLM_STEP5_SHARD_SP_SHARED_EXPERT VLLM_SYSTEM_START_DATE VLLM_TARGET_DEVICE
VLLM_TEST_FORCE_LOAD_FORMAT VLLM_TOOL_JSON_ERROR_AUTOMATIC_RETRY
VLLM_TOOL_PARSE_REGEX_TIMEOUT_SECONDS VLLM_TPU_USING_PATHWAYS VLLM_TRACE_FUNCTION
VLLM_TRITON_FORCE_FIRST_CONFIG VLLM_TRITON_JIT_WARMUP_NUM_THREADS VLLM_TRITON_USE_TD
VLLM_TUNED_CONFIG_FOLDER VLLM_USAGE_SOURCE VLLM_USAGE_STATS_SERVER VLLM_USE_AOT_COMPILE
VLLM_USE_BREAKABLE_CUDAGRAPH VLLM_USE_BYTECODE_HOOK VLLM_USE_DEEP_GEMM VLLM_USE_DEEP_GEMM_E8M0
VLLM_USE_DEEP_GEMM_TMA_ALIGNED_SCALES VLLM_USE_DIRECT_DCP_A2A VLLM_USE_DIRECT_DCP_KV_GATHER
VLLM_USE_DIRECT_DCP_Q_GATHER VLLM_USE_EXPERIMENTAL_PARSER_CONTEXT VLLM_USE_FASTOKENS
VLLM_USE_FLASHINFER_MOE_INT4 VLLM_USE_FLASHINFER_SAMPLER VLLM_USE_FUSED_MOE_GROUPED_TOPK
VLLM_USE_HW_AGNOSTIC VLLM_USE_LAYERNAME VLLM_USE_MEGA_AOT_ARTIFACT VLLM_USE_MODELSCOPE
VLLM_USE_NCCL_SYMM_MEM VLLM_USE_OINK_OPS VLLM_USE_PRECOMPILED VLLM_USE_PRECOMPILED_RUST
VLLM_USE_RUST_BENCH VLLM_USE_RUST_FRONTEND VLLM_USE_SIMPLE_KV_OFFLOAD VLLM_USE_SPINLOOP_EXT
VLLM_USE_STANDALONE_COMPILE VLLM_USE_TRITON_AWQ VLLM_USE_V2_MODEL_RUNNER
VLLM_V1_OUTPUT_PROC_CHUNK_SIZE VLLM_V1_USE_OUTLINES_CACHE VLLM_VIDEO_FETCH_TIMEOUT
VLLM_VIDEO_LOADER_BACKEND VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY
VLLM_WEIGHT_OFFLOADING_DISABLE_UVA VLLM_WORKER_MULTIPROC_METHOD VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS
VLLM_WSL2_ENABLE_PIN_MEMORY VLLM_XGRAMMAR_CACHE_MB VLLM_XLA_CACHE_PATH VLLM_XLA_CHECK_RECOMPILATION
VLLM_XLA_USE_SPMD VLLM_XPU_FORCE_N_CONTIG_WEIGHT VLLM_XPU_INC_WNA16_BACKEND VLLM_XPU_PP_MICROBATCH
VLLM_XPU_USE_SAMPLER_KERNEL VLLM_ZENTORCH_WEIGHT_PREPACK
"""
)
