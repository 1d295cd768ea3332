"""The identity of a result: what was measured, on what, with what; and which differences forbid a comparison.

Read from the running head container (`docker inspect`: image ID and digests, labels, the exact argv and env it
was started with, the model mount) and from inside it (CPU, memory, and GPU name, clocks and power where
`nvidia-smi` answers). Two results may be compared when their model, suite, settings, hardware and serve
command match; the image, its recipe hash and vLLM version are what a comparison is for, and are always shown.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from sparkforge.boundary import linear_regex

# Run inside the container: the machine the figures came from. nvidia-smi's readings vary run to run (clocks,
# power draw): they are shown, not matched; the GPU's name, limits and maximum clocks are matched.
HARDWARE_SCRIPT = """
import hashlib, json, os, platform, shutil, subprocess, sys
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
mem = next((int(l.split()[1]) // 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
gpus = []
fields = "name,driver_version,memory.total,clocks.max.sm,power.limit,clocks.sm,clocks.mem,power.draw,temperature.gpu"
if shutil.which("nvidia-smi"):
    out = subprocess.run(["nvidia-smi", "--query-gpu=" + fields, "--format=csv,noheader,nounits"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(fields.split(",")):
            gpus.append(dict(zip(fields.split(","), values)))
config = os.path.join(sys.argv[1], "config.json")
digest = hashlib.sha256(open(config, "rb").read()).hexdigest() if os.path.isfile(config) else None
print(json.dumps({"machine": platform.machine(), "cpu": cpu, "cpus": os.cpu_count(), "memory_mib": mem, "gpus": gpus, "model_config_sha256": digest}))
"""
GPU_READINGS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu")
ENV_KEPT = ("VLLM_", "CUDA_", "NCCL_", "TORCH_", "OMP_", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def serve_env(env: list[str]) -> dict[str, str]:
    """The container env that can change vLLM's speed (no PATH, no secrets: HF_TOKEN is not among them)."""
    out = {}
    for item in env:
        key, _, value = item.partition("=")
        if key.startswith(ENV_KEPT) and "TOKEN" not in key and "KEY" not in key:
            out[key] = value
    return dict(sorted(out.items()))


def model_identity(model_path: str, served: str, reading: dict[str, Any]) -> dict[str, Any]:
    """The served model's name, path and revision: the hub revision in its path, else config.json's sha256."""
    revision = reading.get("model_config_sha256")
    return {
        "name": served,
        "path": model_path,
        "revision": f"config-sha256:{revision[:16]}" if revision else None,
    }


def identity(
    info: dict[str, Any], image: dict[str, Any], hardware: dict[str, Any], model: dict[str, Any]
) -> dict:
    """Everything a figure depends on, from the head container's inspect and the hardware reading."""
    config = info.get("Config") or {}
    labels = config.get("Labels") or {}
    return {
        "image": {
            "ref": config.get("Image"),
            "id": str(info.get("Image") or ""),
            "digests": sorted(image.get("RepoDigests") or []),
        },
        "recipe": labels.get("dev.sparkforge.recipe"),
        "recipe_hash": labels.get("dev.sparkforge.recipe-hash"),
        "vllm": (labels.get("dev.sparkforge.pin.vllm") or "").split("@")[0] or None,
        "serve": {
            "argv": [str(a) for a in info.get("Args") or []],
            "env": serve_env(config.get("Env") or []),
        },
        "model": model,
        "hardware": hardware,
        "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
    }


def _matched_hardware(hardware: dict[str, Any]) -> dict[str, Any]:
    gpus = [{k: v for k, v in g.items() if k not in GPU_READINGS} for g in hardware.get("gpus") or []]
    return {**hardware, "gpus": gpus}


_ADDRESS_FLAGS = ("--port", "--host")  # where the server listens does not change what it measures


def _serve_matched(serve: dict[str, Any]) -> dict[str, Any]:
    argv, kept = list(serve.get("argv") or []), []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in _ADDRESS_FLAGS and i + 1 < len(argv):
            skip = True
            continue
        if not arg.startswith(tuple(f"{f}=" for f in _ADDRESS_FLAGS)):
            kept.append(arg)
    return {"argv": kept, "env": serve.get("env")}


def _backend_names(doc: dict[str, Any]) -> dict[str, list[str]]:
    return {kind: list(entry.get("names") or []) for kind, entry in (doc.get("backends") or {}).items()}


def _corpus(doc: dict[str, Any]) -> str | None:
    return ((doc.get("suite") or {}).get("corpus") or {}).get("sha256")


def refusing_differences(old: dict[str, Any], new: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Differences that make two results incomparable unless --allow-different: settings, hardware, serve."""
    a, b = old.get("identity") or {}, new.get("identity") or {}
    pairs = {
        "suite settings": ((old.get("suite") or {}).get("params"), (new.get("suite") or {}).get("params")),
        "model revision": ((a.get("model") or {}).get("revision"), (b.get("model") or {}).get("revision")),
        "hardware": (_matched_hardware(a.get("hardware") or {}), _matched_hardware(b.get("hardware") or {})),
        "serve argv": (
            _serve_matched(a.get("serve") or {}),
            _serve_matched(b.get("serve") or {}),
        ),
        "corpus": (_corpus(old), _corpus(new)),
    }
    return {k: {"old": x, "new": y} for k, (x, y) in pairs.items() if x != y}


def shown_differences(old: dict[str, Any], new: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What a comparison is for, always printed: image, recipe hash, vLLM, backends, GPU readings, date."""
    a, b = old.get("identity") or {}, new.get("identity") or {}
    pairs = {
        "image": ((a.get("image") or {}).get("id"), (b.get("image") or {}).get("id")),
        "recipe_hash": (a.get("recipe_hash"), b.get("recipe_hash")),
        "vllm": (a.get("vllm"), b.get("vllm")),
        "backends": (_backend_names(old), _backend_names(new)),  # names: the log lines carry times and pids
        "gpu readings": (
            [{k: g.get(k) for k in GPU_READINGS} for g in (a.get("hardware") or {}).get("gpus") or []],
            [{k: g.get(k) for k in GPU_READINGS} for g in (b.get("hardware") or {}).get("gpus") or []],
        ),
    }
    return {k: {"old": x, "new": y} for k, (x, y) in pairs.items() if x != y}


def describe(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 300 else text[:297] + "..."


# What vLLM logs when it picks a kernel family (0.3x wording); every distinct choice is kept with its line.
BACKEND_PATTERNS = {
    "attention": r"\bUsing (?:default backend )?(?:AttentionBackendEnum\.)?([A-Za-z0-9_]+)(?: attention)? backend",
    "vision_attention": r"(?:AttentionBackendEnum\.)([A-Za-z0-9_]+) for (?:vit attention|MMEncoderAttention)",
    "linear_attention": r"\bUsing (.+? GDN .*?kernel)",
    "moe": r"\bUsing ([A-Za-z0-9_ ]+?) MoE backend",
    "fp8": r"(?i)\b(?:using|selected)\s+([A-Za-z0-9_]*fp8[A-Za-z0-9_]*)",
}
_NOT_TEXT_ATTENTION = re.compile(r"(?i)vit attention|MMEncoder|MoE|GDN|fp8")


def backends(log: str) -> dict[str, dict[str, list[str]]]:
    """The kernel families vLLM logged choosing: {kind: {"names": [...], "lines": [...]}} (absent: not logged)."""
    found: dict[str, dict[str, list[str]]] = {}
    for line in log.splitlines():
        for kind, pattern in BACKEND_PATTERNS.items():
            if kind == "attention" and _NOT_TEXT_ATTENTION.search(line):
                continue
            match = linear_regex(pattern).search(line)
            if match:
                entry = found.setdefault(kind, {"names": [], "lines": []})
                if match.group(1) not in entry["names"]:
                    entry["names"].append(match.group(1))
                    entry["lines"].append(line.strip()[-240:])
    return found
