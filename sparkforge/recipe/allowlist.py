"""The one allow-list of what a recipe or serve profile may put on `vllm serve`'s command line and in its env.

An entry passes only when it is on the list: a `vllm serve` flag or a vLLM variable of the pinned vLLM (its own
argparse flags and `vllm/envs.py`, as preflight reads them: sparkforge/recipe/vllmnames.py) that loads no code,
plugin, library, module or command and opens no development endpoint, or one of a short reviewed list of
library variables that only select resources. Everything else is either refused with what it would do (code
loading, trust settings: hub endpoints, proxies, CA bundles, cache and file locations, listeners, secrets) or
unknown to the list ("needs attention"): neither passes without an explicit per-entry opt-in
(`--allow ENTRY=REASON` on import; the profile's `allow:` map) that every task starting a container prints.
Import, export, profile load (and with it serve, conform, bench and cluster) call `flag_verdict`/`env_verdict`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from sparkforge.recipe import vllmnames

Status = Literal["allowed", "refused", "unknown"]

# Flags that load code, plugins or modules by path or import name, or hand control to something the recipe names.
CODE_FLAGS = {
    "tool-parser-plugin": "vLLM imports this Python file when the API server starts (a model repository file is "
    "in the HF cache mount)",
    "reasoning-parser-plugin": "vLLM imports this Python file when the API server starts",
    "logits-processors": "vLLM imports these classes by qualified name into every engine process",
    "middleware": "the API server imports these ASGI middlewares by import path and runs them on every request",
    "worker-cls": "vLLM imports its GPU worker class from this import path",
    "worker-extension-cls": "vLLM imports this class into every GPU worker",
    "scheduler-cls": "vLLM imports its scheduler class from this import path",
    "io-processor-plugin": "vLLM loads this plugin (installed code chosen by name) into the API server",
    "model-class-overrides": "maps model classes to other implementations chosen by name",
    "trust-remote-code": "runs the model repository's own Python code (the command line's --trust-remote-code "
    "only)",
    "model-loader-extra-config": "free-form options of the weight loader (tensorizer: remote URIs, credentials, "
    "deserialisation of arbitrary objects)",
    "kv-transfer-config": "JSON that may name a connector module to import (kv_connector_module_path) and opens "
    "side channels on the network",
    "ec-transfer-config": "JSON that may name a connector module to import and opens side channels",
    "weight-transfer-config": "receives new weights from an endpoint while serving",
    "additional-config": "free-form configuration handed to platform plugins unreviewed",
    "tool-server": "connects the model to tool servers (MCP endpoints, or the demo's code interpreter and browser)",
    "logging-config": "a logging configuration: dictConfig instantiates handler classes by import path",
    "log-config-file": "a logging configuration file: dictConfig instantiates handler classes by import path",
    "profiler-config": "enables the profiler's endpoints and writes traces to a folder the recipe picks",
}
# Flags that are the machine owner's trust settings, locations, listeners or secrets: never a recipe's.
TRUST_FLAGS = {
    "hf-token": "sends a Hugging Face token to the hub (the owner's --hf-token-file only)",
    "api-key": "the OpenAI API's key: a secret on the command line (the owner's, never a recipe's)",
    "ssl-keyfile": "the API's TLS key: the owner's trust setting",
    "ssl-certfile": "the API's TLS certificate: the owner's trust setting",
    "ssl-ca-certs": "the CAs the API trusts for client certificates: the owner's trust setting",
    "ssl-cert-reqs": "whether the API asks for client certificates: the owner's trust setting",
    "ssl-ciphers": "the API's TLS ciphers: the owner's trust setting",
    "enable-ssl-refresh": "reloads TLS files the owner placed: the owner's trust setting",
    "download-dir": "where weights are downloaded: a cache location (the owner's --cache-dir)",
    "allowed-local-media-path": "lets API clients read files of this folder inside the container (the HF cache, "
    "the token mount)",
    "trust-request-chat-template": "runs chat templates sent by API clients",
    "trust-request-mm-kwargs": "trusts processor arguments sent by API clients",
    "otlp-traces-endpoint": "sends request traces to an endpoint the recipe picks",
    "uds": "listens on a Unix socket instead of the port sparkforge places",
    "grpc": "opens a second (gRPC) listener beside the OpenAI API",
    "grpc-port": "opens a second (gRPC) listener beside the OpenAI API",
    "mm-encoder-fp8-scale-save-path": "writes a file where the recipe says",
    "kv-events-config": "publishes KV-cache events on an endpoint the recipe picks",
    "allowed-origins": "lets web pages of these origins call the API from a visitor's browser (CORS)",
    "allow-credentials": "lets cross-origin web pages call the API with the visitor's credentials (CORS)",
    "allowed-methods": "widens what cross-origin web pages may call (CORS)",
    "allowed-headers": "widens what cross-origin web pages may send (CORS)",
}
# Library variables that only select resources (interfaces, devices, threads, transports, log levels): reviewed.
RESOURCE_ENV = {
    "NCCL_SOCKET_IFNAME": "the network interface NCCL's sockets use",
    "NCCL_IB_HCA": "the RDMA devices NCCL uses",
    "NCCL_IB_DISABLE": "turns NCCL's InfiniBand/RoCE transport off or on",
    "NCCL_IB_GID_INDEX": "the RoCE GID NCCL uses",
    "NCCL_IB_TIMEOUT": "NCCL's InfiniBand timeout",
    "NCCL_IB_QPS_PER_CONNECTION": "queue pairs per NCCL connection",
    "NCCL_CROSS_NIC": "whether NCCL rings may cross NICs",
    "NCCL_NET_GDR_LEVEL": "when NCCL uses GPUDirect RDMA (off on GB10)",
    "NCCL_P2P_DISABLE": "turns NCCL's peer-to-peer transport off",
    "NCCL_P2P_LEVEL": "when NCCL uses peer-to-peer",
    "NCCL_SHM_DISABLE": "turns NCCL's shared-memory transport off",
    "NCCL_IGNORE_CPU_AFFINITY": "whether NCCL keeps the process's CPU affinity",
    "NCCL_SOCKET_NTHREADS": "threads per NCCL socket connection",
    "NCCL_NSOCKS_PERTHREAD": "sockets per NCCL thread",
    "NCCL_BUFFSIZE": "NCCL's buffer size",
    "NCCL_MIN_NCHANNELS": "NCCL's channel count",
    "NCCL_MAX_NCHANNELS": "NCCL's channel count",
    "NCCL_ALGO": "NCCL's collective algorithm",
    "NCCL_PROTO": "NCCL's protocol",
    "NCCL_CUMEM_ENABLE": "whether NCCL uses cuMem allocations",
    "NCCL_NVLS_ENABLE": "whether NCCL uses NVLink SHARP",
    "NCCL_DEBUG": "NCCL's log level (NCCL_DEBUG_FILE, a location, is not on the list)",
    "NCCL_DEBUG_SUBSYS": "which NCCL subsystems log",
    "GLOO_SOCKET_IFNAME": "the network interface Gloo uses",
    "GLOO_SOCKET_TIMEOUT_MS": "Gloo's socket timeout",
    "TP_SOCKET_IFNAME": "the network interface TensorPipe uses",
    "UCX_NET_DEVICES": "the devices UCX uses",
    "CUDA_VISIBLE_DEVICES": "which GPUs the process sees",
    "CUDA_DEVICE_ORDER": "how GPUs are numbered",
    "CUDA_DEVICE_MAX_CONNECTIONS": "CUDA's hardware work queues",
    "CUDA_MODULE_LOADING": "when CUDA loads kernels (lazy or eager)",
    "CUDA_LAUNCH_BLOCKING": "synchronous kernel launches (debugging)",
    "OMP_NUM_THREADS": "OpenMP's thread count",
    "TORCHDYNAMO_DISABLE": "runs PyTorch eagerly (no torch.compile): for an image without the C++ compiler "
    "inductor needs on a CPU",
    "MKL_NUM_THREADS": "MKL's thread count",
    "OPENBLAS_NUM_THREADS": "OpenBLAS's thread count",
    "TOKENIZERS_PARALLELISM": "whether Hugging Face tokenizers use threads",
    "PYTORCH_CUDA_ALLOC_CONF": "PyTorch's CUDA allocator tuning (segments, split sizes)",
    "PYTORCH_ALLOC_CONF": "PyTorch's allocator tuning",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "how PyTorch handles NCCL errors",
    "TORCH_NCCL_BLOCKING_WAIT": "whether PyTorch waits on NCCL synchronously",
    "HF_HUB_OFFLINE": "never contact the hub (use the cache only)",
    "HF_HUB_DISABLE_TELEMETRY": "no telemetry to the hub",
    "HF_HUB_DOWNLOAD_TIMEOUT": "the hub client's download timeout",
    "HF_HUB_ETAG_TIMEOUT": "the hub client's metadata timeout",
    "TRANSFORMERS_OFFLINE": "never contact the hub (use the cache only)",
}
# Variables refused by name, with what they would do (the rules below cover whole families).
REFUSED_ENV = {
    "PATH": "where every program is looked up",
    "HOME": "where programs read their configuration (pip, git, the HF cache)",
    "SHELL": "the shell programs run",
    "BASH_ENV": "a file every non-interactive bash runs",
    "ENV": "a file every sh runs",
    "IFS": "how shells split words",
    "TMPDIR": "where temporary files go",
    "BROWSER": "the command line `webbrowser` (and CPython's `antigravity`) runs",
    "EDITOR": "a command programs run",
    "VISUAL": "a command programs run",
    "PAGER": "a command programs run",
    "OPENSSL_CONF": "an OpenSSL configuration: it loads engines and providers (libraries) it names",
    "OPENSSL_MODULES": "where OpenSSL loads provider libraries from",
    "OPENSSL_ENGINES": "where OpenSSL loads engine libraries from",
    "SSL_CERT_FILE": "the CAs TLS trusts: a trust setting of the machine's owner",
    "SSL_CERT_DIR": "the CAs TLS trusts: a trust setting of the machine's owner",
    "REQUESTS_CA_BUNDLE": "the CAs TLS trusts: a trust setting of the machine's owner",
    "CURL_CA_BUNDLE": "the CAs TLS trusts: a trust setting of the machine's owner",
    "CUDA_HOME": "where CUDA's compilers and libraries are found",
    "CUDA_INJECTION64_PATH": "a library CUDA loads into every process",
    "CUDA_INJECTION32_PATH": "a library CUDA loads into every process",
    "NCCL_CONF_FILE": "a file NCCL reads more settings from (plugins included)",
    "NCCL_DEBUG_FILE": "writes NCCL's log where the recipe says",
    "NCCL_TOPO_FILE": "a file NCCL reads its topology from",
    "VIRTUAL_ENV": "which Python environment runs",
    "VLLM_PLUGINS": "which plugins (installed code, chosen by name) vLLM loads",
    "VLLM_SERVER_DEV_MODE": "development endpoints on the API server (reset caches, sleep, collective RPC)",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "an endpoint that loads LoRA adapters from paths API clients send",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "pickle between processes: deserialising runs code",
    "VLLM_USE_MODELSCOPE": "downloads from ModelScope instead of the hub the owner configured",
    "VLLM_USAGE_STATS_SERVER": "where usage statistics are sent",
    "VLLM_MODEL_REDIRECT_PATH": "redirects model names to other repositories or paths",
    "VLLM_LORA_RESOLVER_HF_REPO_LIST": "loads LoRA adapters from repositories the recipe names",
    "VLLM_TRACE_FUNCTION": "traces every Python call into a file",
    "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY": "copies more variables to every Ray worker, past this list",
    "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "copies more variables to every Ray worker, past this list",
    "VLLM_API_KEY": "the OpenAI API's key: a secret (the owner's)",
    "VLLM_HOST_IP": "the address vLLM's internode traffic uses: the launch plan's",
    "VLLM_LOGGING_STREAM": "Python's logging configuration imports the object an ext:// value names",
    "VLLM_NIC_SELECTION_VARS": "vLLM sets the variables it names inside every worker (through its parser a value "
    "produced LD_PRELOAD=... pointing at a file of the model repository)",
    "VLLM_GPU_NIC_PCIE_MAPPING": "free text vLLM turns into per-worker NIC variables",
    "VLLM_LOOPBACK_IP": "the address vLLM's local traffic uses: the launch plan's",
}
# Families refused by a name rule: (pattern, what they would do). The first match names the reason.
REFUSED_ENV_RULES = (
    (r"(LD|DYLD)_.*", "the dynamic loader loads libraries (or audits every load) as it says"),
    (
        r"PYTHON.*",
        "changes how CPython starts (PYTHONWARNINGS imports the module named as a warning category, "
        "PYTHONSTARTUP runs a file, PYTHONPATH adds import paths)",
    ),
    (
        r"(HF|HUGGING_?FACE|HUGGINGFACE|TRANSFORMERS|DIFFUSERS)_.*",
        "a hub endpoint, token or cache location: "
        "trust settings of the machine's owner (the token would go where the recipe says)",
    ),
    (
        r"(?i)(HTTPS?|ALL|NO|FTP|SOCKS)_PROXY",
        "routes the container's traffic (and the token) through a host the recipe picks",
    ),
    (r"(PIP|UV|CONDA|GIT|NPM|NODE)_.*", "installer, git or node settings: indexes, trust, commands"),
    (r"NCCL_.*PLUGIN.*|.*_PLUGINS?(_.*)?", "a plugin (a library or module) the runtime loads"),
    (
        r"(TRITON|TORCHINDUCTOR|TORCH|XDG)_.*(DIR|PATH|HOME|HOST)",
        "a file or cache location, or a library path",
    ),
    (r"TRITON_LIBCUDA_PATH|TRITON_.*_PATH", "a library Triton loads"),
    (r"S3_.*|AWS_.*|GOOGLE_.*|AZURE_.*", "cloud storage endpoints and credentials"),
    (
        r"(.*_)?(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|API_KEY|ACCESS_KEY|SECRET_KEY)",
        "a secret (mounted files only)",
    ),
    (
        r"VLLM_.*(_PATH|_DIR|_ROOT|_FOLDER|_CACHE|_URL|_HOST|_IP|_PORT)",
        "a file, cache or library location, an endpoint or a listener: the owner's or the launch plan's",
    ),
)
_RULES = tuple((re.compile(p), why) for p, why in REFUSED_ENV_RULES)
# The owner's settings: where the token goes and whom TLS trusts. No recipe or profile opt-in lets them through.
_OWNER_ONLY = re.compile(
    r"(HF|HUGGING_?FACE|HUGGINGFACE|TRANSFORMERS|DIFFUSERS)_.*|(?i:(HTTPS?|ALL|NO|FTP|SOCKS)_PROXY)|"
    r"SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|VLLM_USE_MODELSCOPE|VLLM_API_KEY|"
    r"(.*_)?(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|API_KEY|ACCESS_KEY|SECRET_KEY)|S3_.*|AWS_.*|"
    r"hf-token|api-key|download-dir|ssl-.*|enable-ssl-refresh"
)
OWNER_FIX = (
    "it is the machine owner's setting, never a recipe's or profile's (no opt-in): the hub endpoint comes from "
    "your environment or --hf-endpoint, the token from --hf-token-file, proxies and CA bundles from your machine"
)
FINAL_FIX = (
    "revisions come from the profile's pinned model revision; files a profile needs live beside it, never in "
    "the secrets, the caches or the snapshot"
)
ENV_FIX = "remove it from env (or, having reviewed what it does, opt in: import --allow {entry}=REASON)"
FLAG_FIX = (
    "remove it from the command (or, having reviewed what it does, opt in: import --allow {entry}=REASON)"
)


@dataclass(frozen=True)
class Verdict:
    """One flag or env entry against the list: allowed, refused (what it would do) or unknown."""

    kind: Literal["flag", "env"]
    name: str  # the flag's long name without dashes, or the variable's name
    status: Status
    reason: str
    final: bool = False  # refused whatever the opt-ins say (a path into the secrets, a branch ref)
    value: object = None  # the entry's value (a flag's, a field's, a variable's): what an opt-in reviews
    voided: str = ""  # the digest an opt-in recorded for another value

    @property
    def entry(self) -> str:
        return f"--{self.name}" if self.kind == "flag" else self.name

    @property
    def allow_key(self) -> str:
        """How the opt-in names it: the flag without dashes, or the variable."""
        return self.name

    def message(self) -> str:
        """'ENTRY: what it would do; fix: ...' for a refused or unknown entry."""
        fix = owner_only(self.allow_key) or (FLAG_FIX if self.kind == "flag" else ENV_FIX).format(
            entry=self.allow_key
        )
        if self.final:
            return f"{self.entry}: refused: {self.reason}; fix: remove it (no opt-in: {FINAL_FIX})"
        if self.voided:
            return (
                f"{self.entry}: {self.status}: {self.reason}; its opt-in reviewed the value with sha256:{self.voided}, "
                f"this value is sha256:{value_digest(self.value)} ({json.dumps(self.value, default=str)[:80]}): a "
                f"changed value voids the opt-in; fix: review the value, then record it (import --allow "
                f"{self.allow_key}=REASON, or end the reason with [sha256:{value_digest(self.value)}])"
            )
        if self.status == "unknown":
            return f"{self.entry}: needs attention: {self.reason}; fix: {fix}"
        return f"{self.entry}: refused: {self.reason}; fix: {fix}"


_DIGEST = re.compile(r"\s*\[sha256:([0-9a-f]{16})\]$")


def value_digest(value: object) -> str:
    """The digest an opt-in records of the value it reviewed (canonical JSON, sha256, 16 hex)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def reviewed(reason: str) -> tuple[str, str]:
    """An opt-in's reason -> (the reviewer's words, the digest of the value it reviewed or '')."""
    match = _DIGEST.search(reason)
    return (reason[: match.start()], match.group(1)) if match else (reason, "")


def opt_in_reason(reason: str, value: object) -> str:
    """The reason as a profile records it: the reviewer's words and the digest of the value reviewed."""
    return f"{reviewed(reason)[0]} [sha256:{value_digest(value)}]"


def long_flag(name: str, aliases: Mapping[str, str] | None = None) -> str:
    """A flag as written (dashes, underscores, `no-`, a short alias, a dotted sub-key) -> its long name."""
    flag = name.lstrip("-").split("=", 1)[0].split(".", 1)[0].replace("_", "-")
    table = vllmnames.ALIASES if aliases is None else aliases
    flag = table.get(flag, flag)
    if flag.startswith("no-") and flag[3:] in vllmnames.FLAGS:
        flag = flag[3:]
    return flag


def flag_verdict(name: str) -> Verdict:
    """A `vllm serve` flag against the list (any spelling: `--x`, `x_y`, `no-x`, a short alias, `x.sub`)."""
    flag = long_flag(name)
    if flag in CODE_FLAGS:
        return Verdict("flag", flag, "refused", CODE_FLAGS[flag])
    if flag in TRUST_FLAGS:
        return Verdict("flag", flag, "refused", TRUST_FLAGS[flag])
    if flag in vllmnames.FLAGS:
        return Verdict("flag", flag, "allowed", f"a `vllm serve` flag of vLLM {vllmnames.VERSION}")
    expands = sorted(f for f in (*CODE_FLAGS, *TRUST_FLAGS) if f.startswith(flag))
    if expands:  # argparse expands an unambiguous prefix: `--tool-parser-plug` is the plugin flag
        why = {**CODE_FLAGS, **TRUST_FLAGS}[expands[0]]
        return Verdict(
            "flag", flag, "refused", f"an abbreviation vLLM's parser expands to --{expands[0]}: {why}"
        )
    near = difflib.get_close_matches(flag, sorted(vllmnames.FLAGS), n=2, cutoff=0.75)
    hint = f" (did you mean {', '.join('--' + n for n in near)}?)" if near else ""
    return Verdict("flag", flag, "unknown", f"not a `vllm serve` flag of vLLM {vllmnames.VERSION}{hint}")


def env_verdict(name: str) -> Verdict:
    """An environment variable against the list: refused families first, then the reviewed and vLLM lists."""
    if name in REFUSED_ENV:
        return Verdict("env", name, "refused", REFUSED_ENV[name])
    if name in RESOURCE_ENV:
        return Verdict("env", name, "allowed", RESOURCE_ENV[name])
    for rule, why in _RULES:
        if rule.fullmatch(name):
            return Verdict("env", name, "refused", why)
    if name in vllmnames.ENV:
        return Verdict("env", name, "allowed", f"a variable vLLM {vllmnames.VERSION} reads (vllm/envs.py)")
    return Verdict(
        "env",
        name,
        "unknown",
        "neither a variable of the pinned vLLM (vllm/envs.py) nor a reviewed resource-selecting library variable",
    )


def owner_only(name: str) -> str:
    """Why no opt-in may let `name` (an allow key) through, or '' when one may."""
    if name in RESOURCE_ENV:
        return ""
    return OWNER_FIX if _OWNER_ONLY.fullmatch(name) else ""


def value_verdicts(key: str, value: object, args: Mapping[str, object] | None = None) -> list[Verdict]:
    """A flag's value against the value allow-list (sparkforge/recipe/values.py): each field of a JSON value off
    the list as its own entry (`compilation-config.backend`); a revision that is no full commit or differs from
    the pin in `args`; another repository; a file the recipe picks."""
    from sparkforge.recipe.values import flag_findings, plain_findings

    found = flag_findings(key, value) + plain_findings(key, value, args or {})
    return [Verdict("flag", f.entry, f.status, f.reason, f.final, f.value) for f in found]  # type: ignore[arg-type]


def env_value_verdict(name: str, value: object) -> Verdict:
    """A variable by name and then by value: a name on the list passes only with a value of its grammar."""
    from sparkforge.recipe.values import env_finding

    verdict = replace(env_verdict(name), value=value)
    if verdict.status != "allowed":
        return verdict
    finding = env_finding(name, str(value), RESOURCE_ENV)
    return verdict if finding is None else replace(verdict, status=finding.status, reason=finding.reason)  # type: ignore[arg-type]


def verdicts(args: Mapping[str, object], env: Mapping[str, object]) -> list[Verdict]:
    """Every flag (and every field of a JSON-valued flag's value) and variable (by name and value), in order."""
    out = []
    for key, value in args.items():
        out.append(replace(flag_verdict(key), value=value))
        out += value_verdicts(key, value, args)
    return out + [env_value_verdict(str(k), v) for k, v in env.items()]


def blocked(
    args: Mapping[str, object],
    env: Mapping[str, object],
    allow: Mapping[str, str],
    more: list[Verdict] | None = None,
) -> list[Verdict]:
    """The entries off the list that no opt-in in `allow` lets through: none names them, none may, or the one
    that does reviewed another value (its recorded digest differs)."""
    out = []
    found = [*verdicts(args, env), *(more or [])]
    # One opt-in names one entry: a key that is both a variable and a flag of this profile opens neither.
    both = {v.allow_key for v in found if v.kind == "env"} & {v.allow_key for v in found if v.kind == "flag"}
    for v in found:
        if v.status == "allowed":
            continue
        if v.allow_key in both and v.allow_key in allow:
            out.append(
                replace(
                    v,
                    reason=f"{v.reason} (the opt-in {v.allow_key!r} names a variable and a flag "
                    "alike: it opens neither; rename the variable)",
                )
            )
        elif v.allow_key not in allow or owner_only(v.allow_key) or v.final:
            out.append(v)
        elif (digest := reviewed(allow[v.allow_key])[1]) != value_digest(v.value):
            out.append(replace(v, voided=digest or "(none recorded)"))
    return out


def opt_in_warnings(
    allow: Mapping[str, str], env: Mapping[str, object], where: str, args: Mapping[str, object] | None = None
) -> list[str]:
    """One line per opt-in: printed by every task that starts a container."""
    lines = []
    found = {v.allow_key: v for v in verdicts(args or {}, env) if v.status != "allowed"}
    for key, why in allow.items():
        verdict = found.get(key) or (env_verdict(key) if key in env else flag_verdict(key))
        words, digest = reviewed(why)
        shown = json.dumps(verdict.value, default=str)[:120]
        lines.append(
            f"warning: {where} opts in to {verdict.entry} = {shown} (sha256:{digest}) off the allow-list "
            f"({verdict.status}: {verdict.reason}); the reason it gives: {words}"
        )
    return lines
