"""NVIDIA's recipe catalog format (NVIDIA/local-ai-inference-recipes), schema versions 3 and 4, read strictly and
written back. The keys follow the catalog as read on 2026-12-05 (commits 12b25c6 / dedcf6b; docs/formats.md):
`models/<org>/<model>/<hardware>/<os>/<backend>/[variant/]recipe.yaml`. Unknown keys are errors, as for the other
formats, so a catalog file that differs says where.

What runs is `serve.command`, shell text: optional `export K=V` lines, then `vllm serve MODEL \\` with one flag per
continued line (a multi-node head adds `--nnodes/--node-rank/--master-addr "$HEAD_IP"/--master-port`, its workers
`--headless`). It is turned into the one-line `vllm serve MODEL ...` command the other formats carry, so import
checks it the same way (allow-list, parsing, preflight); the launch flags sparkforge's cluster.up sets itself are
taken out here and named, and so is everything `runtime.setup_command` (the author's `docker run`) does.
"""

from __future__ import annotations

import datetime
import re
import shlex
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from sparkforge.errors import RecipeError

NvidiaFormat = Literal["nvidia-v3", "nvidia-v4"]
BACKENDS = ("vllm",)
# The launch flags sparkforge's cluster.up (and serve) set themselves: taken out of the catalog's command, named.
LAUNCH_FLAGS = ("nnodes", "node-rank", "master-addr", "master-port", "headless", "host", "port")
_VALUELESS = ("headless",)
_CONTINUATION = re.compile(r"\\[ \t]*\r?\n")
_EXPORT = re.compile(r"export\s+([A-Za-z_][A-Za-z0-9_]*)=(.*)")
HARDWARE_BY_NODES = {1: "dgx-spark", 2: "dgx-spark-2gpu", 4: "dgx-spark-4gpu"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Platform(_Strict):
    os: StrictStr  # linux | windows
    execution: Literal["container"]


class Precision(_Strict):
    label: StrictStr


class Checkpoint(_Strict):
    target: StrictStr  # https://huggingface.co/ORG/NAME
    target_label: StrictStr = Field(min_length=1)  # ORG/NAME
    draft: StrictStr | None = None
    draft_label: StrictStr | None = None


class Topology(_Strict):
    summary: StrictStr
    gpu_count: StrictInt = Field(ge=1)
    node_count: StrictInt = Field(ge=1, le=64)
    tensor_parallel_size: StrictInt | None = Field(None, ge=1)


class Runtime(_Strict):
    kind: Literal["container"]
    label: StrictStr
    image: StrictStr = Field(min_length=1)
    image_url: StrictStr
    setup_label: StrictStr
    setup_target: Literal["single-node", "all-nodes"]
    setup_instructions: StrictStr
    setup_command: StrictStr


class ExtraCommand(_Strict):
    id: StrictStr
    label: StrictStr
    target: StrictStr  # workers
    instructions: StrictStr | None = None
    command: StrictStr


class Serve(_Strict):
    label: StrictStr
    target: Literal["single-node", "head"]
    instructions: StrictStr | None = None
    command: StrictStr = Field(min_length=1)
    port: StrictInt = Field(ge=1, le=65535)
    api_model: StrictStr
    additional_commands: list[ExtraCommand] | None = None


class Validation(_Strict):
    validated_at: datetime.date
    validated_by: StrictStr
    tested_stack: TestedStack


class TestedStack(_Strict):
    os_version: StrictStr
    driver: StrictStr
    cuda: StrictStr


Validation.model_rebuild()


class _Recipe(_Strict):
    title: StrictStr
    model: StrictStr  # the catalog's lowercase slug, org/name
    hardware: StrictStr
    platform: Platform
    backend: StrictStr
    backend_version: StrictStr
    status: StrictStr  # optimized | experimental | ...
    variant: StrictStr | None = None
    precision: Precision
    checkpoint: Checkpoint
    concurrency: StrictInt = Field(ge=1)
    topology: Topology
    sampling: dict[StrictStr, Any] | None = None
    security: StrictStr
    notes: StrictStr | None = None
    runtime: Runtime
    serve: Serve


class RecipeV3(_Recipe):
    schema_version: Literal[3]
    validation: Validation
    mtp: StrictStr | None = None


class RecipeV4(_Recipe):
    schema_version: Literal[4]
    spec_dec: StrictStr | None = None
    min_vidmem_gb: StrictInt | None = Field(None, ge=1)


@dataclass(frozen=True)
class NvidiaServe:
    """What a catalog recipe serves: formats.read_community makes it a CommunityRecipe."""

    name: str
    description: str
    model: str  # the Hugging Face repository (checkpoint.target_label)
    image: str
    command: str  # `vllm serve MODEL ...`, one line, shell-quoted, launch flags taken out
    env: dict[str, object]  # the command's `export K=V` lines
    nodes: int
    notes: tuple[tuple[str, str], ...]  # (key, what was not carried and why)


def _shell_lines(text: str) -> list[str]:
    return [line.strip() for line in _CONTINUATION.sub(" ", text).split("\n") if line.strip()]


def _split(line: str, where: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise RecipeError(f"{where}: does not split into words ({exc}); fix: check its quotes") from None


def _serve_command(text: str, where: str) -> tuple[list[str], dict[str, object], list[str]]:
    """`export` lines -> env, the `vllm serve` line -> its words with the launch flags out (named)."""
    env: dict[str, object] = {}
    serve: list[str] | None = None
    dropped: list[str] = []
    for line in _shell_lines(text):
        match = _EXPORT.fullmatch(line)
        if match:
            value = _split(match.group(2), where) if match.group(2).strip() else [""]
            env[match.group(1)] = value[0] if len(value) == 1 else " ".join(value)
            continue
        words = _split(line, where)
        if words[:2] != ["vllm", "serve"] or serve is not None:
            raise RecipeError(
                f"{where}: line {line[:60]!r} is neither `export K=V` nor the one `vllm serve MODEL ...` command; "
                "fix: import a vLLM recipe whose serve.command is those lines"
            )
        serve = words
    if serve is None:
        raise RecipeError(f"{where}: no `vllm serve MODEL ...` line; fix: import a vLLM recipe")
    kept = serve[:3]
    i = 3
    while i < len(serve):
        word = serve[i]
        name = word[2:].split("=", 1)[0].replace("_", "-") if word.startswith("--") else ""
        if name in LAUNCH_FLAGS:
            take = 1 if "=" in word or name in _VALUELESS else 2
            dropped.append(" ".join(serve[i : i + take]))
            i += take
            continue
        kept.append(word)
        i += 1
    return kept, env, dropped


def _setup_flags(text: str, where: str) -> list[str]:
    """The author's `docker run` flags (and export lines) of runtime.setup_command, as written."""
    named: list[str] = []
    for line in _shell_lines(text):
        if _EXPORT.fullmatch(line):
            named.append(line)
            continue
        words = _split(line, where)
        if words[:2] == ["docker", "run"]:
            named += words[2:-1]  # the last word is the image
    return named


def parse_nvidia(data: dict[str, Any], where: str, fmt: NvidiaFormat) -> NvidiaServe:
    """An NVIDIA catalog document, validated (pydantic's ValidationError for the caller to explain with lines)."""
    recipe = (RecipeV3 if fmt == "nvidia-v3" else RecipeV4).model_validate(data)
    if recipe.backend not in BACKENDS:
        raise RecipeError(
            f"{where}: backend {recipe.backend!r}: sparkforge builds and serves vLLM only (a llama.cpp recipe "
            "runs llama-server's GGUF files, not a vLLM argv); fix: import a recipe with backend: vllm"
        )
    words, env, dropped = _serve_command(recipe.serve.command, f"{where}: serve.command")
    env_as_written = dict(env)
    port = next(
        (d.split()[-1].split("=")[-1] for d in dropped if d.startswith("--port")), str(recipe.serve.port)
    )
    host = next((d.split()[-1].split("=")[-1] for d in dropped if d.startswith("--host")), "0.0.0.0")
    command = shlex.join([*words, "--host", host, "--port", port])
    notes: list[tuple[str, str]] = []
    cluster = [d for d in dropped if not d.startswith(("--host", "--port"))]
    if cluster:
        notes.append(
            (
                "serve.command",
                f"{', '.join(cluster)}: the launch flags sparkforge's cluster.up sets itself; dropped",
            )
        )
    for key, value in list(env.items()):
        if "<" in str(value) or "$" in str(value):
            notes.append(
                (
                    f"serve.command.{key}",
                    f"export {key}={value}: a value of the author's machines; not carried",
                )
            )
            del env[key]
    setup = _setup_flags(recipe.runtime.setup_command, where)
    if setup:
        notes.append(
            (
                "runtime.setup_command",
                f"the author's container launch ({' '.join(setup)}): sparkforge's serve/cluster.up starts its own "
                "container (host network, GPUs, model cache); not carried",
            )
        )
    if recipe.sampling:
        notes.append(
            ("sampling", f"{recipe.sampling}: the clients' request settings, not a server flag; not carried")
        )
    for extra in recipe.serve.additional_commands or []:
        worker, worker_env, _ = _serve_command(extra.command, f"{where}: serve.additional_commands")
        same = worker == words and worker_env == env_as_written
        differs = (
            ""
            if same
            else "; its vLLM flags or exports differ from the head's, which sparkforge runs everywhere"
        )
        notes.append(
            (
                "serve.additional_commands",
                f"{extra.id} ({extra.target}): sparkforge's cluster.up starts the workers from the same profile"
                + differs,
            )
        )
    description = recipe.notes or recipe.title
    name = f"{recipe.model.rsplit('/', 1)[-1]}-{recipe.hardware}" + (
        f"-{recipe.variant}" if recipe.variant else ""
    )
    nodes = recipe.topology.node_count
    return NvidiaServe(
        name,
        description,
        recipe.checkpoint.target_label,
        recipe.runtime.image,
        command,
        env,
        nodes,
        tuple(notes),
    )


@dataclass(frozen=True)
class ServeSpec:
    """What an export serves: the profile's model, pinned args (flag -> value), env, node count, image."""

    model: str
    args: dict[str, Any]
    env: dict[str, str]
    nodes: int
    image: str
    description: str
    served_model_name: str | None = None


def _flag_words(args: dict[str, Any]) -> list[list[str]]:
    lines: list[list[str]] = []
    for key, value in args.items():
        if value is True:
            lines.append([f"--{key}"])
        elif value is False:
            lines.append([f"--no-{key}"])
        else:
            for item in value if isinstance(value, list) else [value]:
                lines.append([f"--{key}", shlex.quote(str(item))])
    return lines


def _render(spec: ServeSpec, rank: int | None) -> str:
    """`export K=V` lines, then `vllm serve MODEL \\` with one flag per continued line."""
    exports = [f"export {k}={shlex.quote(v)}" for k, v in spec.env.items()]
    lines = [["vllm", "serve", shlex.quote(spec.model)], *_flag_words(spec.args)]
    if rank is not None:
        lines += [["--nnodes", str(spec.nodes)], ["--node-rank", str(rank)]]
        lines += [["--master-addr", '"$HEAD_IP"'], ["--master-port", '"$MASTER_PORT"']]
        lines += [["--headless"]] if rank else []
    if not rank:
        lines += [["--host", "0.0.0.0"], ["--port", "8000"]]
    return "\n".join([*exports, " \\\n  ".join(" ".join(line) for line in lines)]) + "\n"


def _precision(spec: ServeSpec) -> str:
    quant = spec.args.get("quantization")
    if isinstance(quant, str):
        return quant.upper()
    found = re.search(r"(NVFP4(?:-W4A16)?|FP8|FP4|AWQ|GPTQ|INT4|INT8|BF16)", spec.model, re.IGNORECASE)
    return found.group(1).upper() if found else "BF16"


def _version(image: str) -> str:
    tag = image.split("@", 1)[0].rsplit("/", 1)[-1].partition(":")[2]
    found = re.search(r"(\d+\.\d+\.\d+)", tag)
    return found.group(1) if found else "unknown"


def nvidia_document(fmt: NvidiaFormat, spec: ServeSpec, today: datetime.date) -> dict[str, object]:
    """The catalog document of `fmt` serving `spec` (status experimental: sparkforge's export, not NVIDIA's)."""
    hardware = HARDWARE_BY_NODES.get(spec.nodes, f"dgx-spark-{spec.nodes}gpu")
    tp = spec.args.get("tensor-parallel-size")
    multi = spec.nodes > 1
    image_name = spec.image.split("@", 1)[0]  # the repository, without tag or digest
    image_name = image_name.rsplit(":", 1)[0] if ":" in image_name.rsplit("/", 1)[-1] else image_name
    docker = [
        "docker run -it --rm --gpus all --ipc host --network host",
        "-v ~/.cache/huggingface:/root/.cache/huggingface",
    ]
    setup = (["export HEAD_IP=<head-connectx-ip>", "export MASTER_PORT=29501"] if multi else []) + [
        " \\\n  ".join(
            [
                *docker,
                *(['-e HEAD_IP="$HEAD_IP"', '-e MASTER_PORT="$MASTER_PORT"'] if multi else []),
                f"--entrypoint /bin/bash {spec.image}",
            ]
        )
    ]
    serve: dict[str, object] = {
        "label": "Start the vLLM server" + (" on the head node" if multi else ""),
        "target": "head" if multi else "single-node",
        "instructions": None,
        "command": _render(spec, 0 if multi else None),
        "port": 8000,
        "api_model": spec.served_model_name or spec.model,
    }
    if multi:
        serve["additional_commands"] = [
            {
                "id": "worker",
                "label": f"Start vLLM on worker node {rank}",
                "target": "workers",
                "instructions": f"Run inside the container on worker node {rank}.",
                "command": _render(spec, rank),
            }
            for rank in range(1, spec.nodes)
        ]
    doc: dict[str, object] = {
        "schema_version": 3 if fmt == "nvidia-v3" else 4,
        "title": f"{spec.model.rsplit('/', 1)[-1]} · DGX Spark{f' x{spec.nodes}' if multi else ''} · vLLM",
        "model": spec.model.lower(),
        "hardware": hardware,
        "platform": {"os": "linux", "execution": "container"},
        "backend": "vllm",
        "backend_version": _version(spec.image),
        "status": "experimental",
        "variant": None,
    }
    if fmt == "nvidia-v3":
        doc["validation"] = {
            "validated_at": today,
            "validated_by": "sparkforge export (not validated by NVIDIA)",
            "tested_stack": {"os_version": "unknown", "driver": "unknown", "cuda": "unknown"},
        }
        doc["mtp"] = None
    else:
        doc["spec_dec"] = None
        doc["min_vidmem_gb"] = None
    doc.update(
        {
            "precision": {"label": _precision(spec)},
            "checkpoint": {
                "target": f"https://huggingface.co/{spec.model}",
                "target_label": spec.model,
                "draft": None,
                "draft_label": None,
            },
            "concurrency": int(spec.args.get("max-num-seqs", 1))
            if str(spec.args.get("max-num-seqs", 1)).isdigit()
            else 1,
            "topology": {
                "summary": f"{spec.nodes} x DGX Spark" + (f", TP={tp}" if tp else ""),
                "gpu_count": spec.nodes,
                "node_count": spec.nodes,
                "tensor_parallel_size": int(tp) if str(tp).isdigit() else None,
            },
            "sampling": None,
            "security": "Exported by sparkforge: check the image and model pins before serving.",
            "notes": spec.description or None,
            "runtime": {
                "kind": "container",
                "label": "vLLM container",
                "image": spec.image,
                "image_url": f"https://hub.docker.com/r/{image_name}"
                if image_name.count("/") == 1
                else image_name,
                "setup_label": "Start the container" + (" on every node" if multi else ""),
                "setup_target": "all-nodes" if multi else "single-node",
                "setup_instructions": "Run on "
                + ("every node (set HEAD_IP to the head's ConnectX address)." if multi else "the DGX Spark."),
                "setup_command": "\n".join(setup) + "\n",
            },
            "serve": serve,
        }
    )
    return doc
