"""The download phase of `serve` and `cluster.up`: the model's weights on disk before vLLM starts.

Without --model-dir, each node (with --weights shared: the head alone, which then streams the model folder to
the peers over the fabric link, sparkforge/run/weights/weightstream.py) runs Hugging Face's own `snapshot_download` in a
container of the serving image, with the same cache mount and token file the launch uses, and reports progress
(bytes in the cache) while it runs. The health timeout then starts with the weights
on disk instead of racing a first download of ~120 GB. A failed download keeps its logs and names the stage.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.recipe.allowlist import RESOURCE_ENV
from sparkforge.recipe.profile import Profile
from sparkforge.run.launch import (
    CACHES,
    TOKEN_MOUNT,
    LaunchOptions,
    downloads_first,
    model_revision,
    shown_argv,
)
from sparkforge.run.nodes import LABEL, ContainerSpec, NodeEngine, run_argv
from sparkforge.run.postmortem import keep_logs
from sparkforge.run.weights.weightstream import json_events

# Runs in the serving image: huggingface_hub ships with vLLM. One JSON line per event on stdout.
_DOWNLOAD = """
import json, os, sys, threading, time
from huggingface_hub import constants, snapshot_download
# (repository, revision) pairs: the model first (unless served from --model-dir), then each pinned repository.
pairs = list(zip(sys.argv[1::2], [r or None for r in sys.argv[2::2]]))
# What serving reads: weights, configs, tokenizer, chat template. Never the repository's code (*.py) or pickles.
serving = ["*.safetensors", "*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
folders = [os.path.join(constants.HF_HUB_CACHE, "models--" + repo.replace("/", "--")) for repo, _ in pairs]
result = {}
def fetch():
    try:
        for repo, revision in pairs:
            path = snapshot_download(repo_id=repo, revision=revision, allow_patterns=serving)
            result.setdefault("path", path)
    except Exception as exc:
        result["error"] = f"{exc.__class__.__name__}: {exc}"
def size():
    total = 0
    for base, _, files in (w for folder in folders for w in os.walk(os.path.join(folder, "blobs"))):
        total += sum(os.path.getsize(os.path.join(base, f)) for f in files if not os.path.islink(os.path.join(base, f)))
    return total
start = time.monotonic()
worker = threading.Thread(target=fetch, daemon=True)
worker.start()
while worker.is_alive():
    worker.join(float(os.environ.get("SPARKFORGE_PROGRESS_S", "10")))
    print(json.dumps({"event": "progress", "bytes": size(), "seconds": round(time.monotonic() - start, 1)}), flush=True)
if "error" in result:
    print(json.dumps({"event": "failed", "error": result["error"][-1500:]}), flush=True)
    sys.exit(1)
print(json.dumps({"event": "done", "path": result["path"], "bytes": size(), "seconds": round(time.monotonic() - start, 1)}), flush=True)
"""


UNPINNED = "the hub's current files (--allow-unpinned-model)"


@dataclass(frozen=True)
class Download:
    """One node's download container."""

    rank: int
    container: ContainerSpec


def fetched(profile: Profile, options: LaunchOptions) -> list[tuple[str, str]]:
    """(repository, revision) the download phase fetches: the model (not with --model-dir; '' when unpinned and
    allowed), then every other repository at its pin (also with --model-dir: vLLM is given their snapshots)."""
    if options.weights == "skip" or not options.gpus:
        return []
    model = [(profile.model.model, model_revision(profile) or "")] if downloads_first(options) else []
    return model + [(repo, commit) for repo, commit in profile.model.repositories.items() if commit]


def plan_downloads(profile: Profile, ranks: Sequence[int], options: LaunchOptions) -> list[Download]:
    """A container per node (only the head's with --weights shared); none with --weights skip, or with --gpus
    none (vLLM stops at device detection, before loading any weights), or with --model-dir and no other
    repository (the doctor checks the folder)."""
    pairs = fetched(profile, options)
    if not pairs:
        return []
    hf = f"{options.cache_dir.rstrip('/')}/huggingface:{CACHES['huggingface']}"
    mounts: tuple[str, ...] = (hf,)
    # The hub and the token are the owner's alone: of the profile's environment only the hub client's reviewed
    # switches (offline, timeouts, telemetry off: they can only narrow what it does) reach this container.
    env = {k: v for k, v in profile.model.env.items() if k in RESOURCE_ENV and k.startswith("HF_")}
    if options.hf_endpoint:
        env["HF_ENDPOINT"] = options.hf_endpoint
    if options.hf_token_file is not None:
        mounts += (f"{options.hf_token_file}:{TOKEN_MOUNT}:ro",)
        env["HF_TOKEN_PATH"] = TOKEN_MOUNT
    return [
        Download(
            rank,
            ContainerSpec(
                name=f"sparkforge-weights-{profile.name}-{rank}",
                image=options.image,
                entrypoint="python3",
                args=("-c", _DOWNLOAD, *(word for pair in pairs for word in pair)),
                env={"PYTHONUNBUFFERED": "1", **env},
                labels={LABEL: "weights", f"{LABEL}.profile": profile.name, f"{LABEL}.rank": str(rank)},
                mounts=mounts,
            ),
        )
        for rank in (ranks[:1] if options.weights == "shared" else ranks)
    ]


def fetch_weights(
    session: Session,
    engines: Sequence[NodeEngine],
    profile: Profile,
    options: LaunchOptions,
    *,
    dry: bool = False,
    timeout_s: float | None = None,
    address: str | None = None,
) -> dict[str, float]:
    """Run the downloads to the end (progress on `echo`); seconds per node. RunError names the node and stage.
    With --weights shared and peers, the head's copy is then streamed to them through `address` (its link's)."""
    echo = session.echo
    by_rank = {e.node.rank: e for e in engines}
    downloads = plan_downloads(profile, sorted(by_rank), options)
    for line in download_lines(profile, options, {r: e.node.label for r, e in by_rank.items()}, dry=dry):
        echo(line)
    if dry or not downloads:
        return {}
    end = None if timeout_s is None else time.monotonic() + timeout_s
    done: dict[str, float] = {}
    try:
        for download in downloads:
            engine = by_rank[download.rank]
            engine.remove([download.container.name])
            engine.start(download.container)
        pending = list(downloads)
        seen: dict[int, int] = {}
        while pending:
            for download in list(pending):
                engine = by_rank[download.rank]
                events = json_events(engine.logs(download.container.name))
                for event in events[seen.get(download.rank, 0) :]:
                    if event.get("event") == "progress":
                        echo(
                            f"  download {engine.node.label}: {event['bytes'] / 1e9:.2f} GB, {event['seconds']:.0f} s"
                        )
                seen[download.rank] = len(events)
                state = engine.state(download.container.name)
                if state.status in ("exited", "dead", "missing"):
                    last = events[-1] if events else {}
                    if state.exit_code != 0 or last.get("event") != "done":
                        raise RunError(_failed(engine, download, last, options))
                    done[engine.node.label] = float(last.get("seconds", 0))
                    echo(
                        f"  weights on disk on {engine.node.label}: {last['bytes'] / 1e9:.2f} GB ({last['path']})"
                    )
                    pending.remove(download)
            if end is not None and time.monotonic() > end and pending:
                kept = keep_logs([by_rank[d.rank] for d in pending], [d.container.name for d in pending])
                raise RunError(
                    f"stage download: the weights of {profile.model.model} were not on disk within {timeout_s:g} s on "
                    f"{', '.join(by_rank[d.rank].node.label for d in pending)}; logs kept in {kept}; fix: rerun (the "
                    "download resumes from the cache) or fetch the model once and pass --model-dir"
                )
            if pending:
                time.sleep(2)
    finally:
        for download in downloads:
            by_rank[download.rank].remove([download.container.name])
    peers = [e for rank, e in sorted(by_rank.items()) if rank != downloads[0].rank]
    if options.weights == "shared" and peers:
        from sparkforge.run.weights.weightstream import Transfer, share_weights

        head = by_rank[downloads[0].rank]
        start = time.monotonic()
        for repo, _ in fetched(profile, options):  # the model's folder, then each pinned repository's
            folder = f"{options.cache_dir.rstrip('/')}/huggingface/hub/models--{repo.replace('/', '--')}"
            share_weights(
                session, head, peers, Transfer(options.image, address or "127.0.0.1", folder, folder)
            )
        for peer in peers:
            done[peer.node.label] = round(time.monotonic() - start, 1)
    return done


def download_lines(
    profile: Profile, options: LaunchOptions, labels: Mapping[int, str], *, dry: bool
) -> list[str]:
    """What the download phase says before it starts (and, `dry`, each container's exact argv): pure."""
    downloads = plan_downloads(profile, sorted(labels), options)
    if not downloads:
        if options.model_dir is not None:
            return []
        why = "--weights skip: vLLM downloads" if options.gpus else "--gpus none: vLLM stops before loading"
        return [f"download: skipped ({why})"]
    where = (
        "once, on the head, then streamed to the peers" if options.weights == "shared" else "on every node"
    )
    hub = options.hf_endpoint or "https://huggingface.co"
    lines = [
        f"download: {repo} at {revision or UNPINNED} from {hub} into {options.cache_dir}/huggingface {where}"
        for repo, revision in fetched(profile, options)
    ]
    if not dry:
        return lines
    lines += [
        f"# container: the download on {labels[d.rank]} (holds the token file, if given): "
        f"docker {shown_argv(run_argv(d.container))}"
        for d in downloads
    ]
    if options.weights == "shared" and len(labels) > 1:
        lines.append(
            "# containers: the weight server on the head and a puller on each peer (a per-run key, never "
            "sent over the link: sparkforge/run/weights/weightstream.py)"
        )
    return lines


def _failed(engine: NodeEngine, download: Download, last: dict[str, object], options: LaunchOptions) -> str:
    kept = keep_logs([engine], [download.container.name])
    error = str(last.get("error") or engine.logs(download.container.name, tail=5).strip()[-600:])
    hint = (
        "check the model name; for a gated model pass --hf-token-file (a file on that node)"
        if options.hf_token_file is None
        else "check the model name and that the token on that node may read it"
    )
    return (
        f"stage download: fetching the weights on {engine.node.label} failed: {error}; logs kept in {kept}; "
        f"fix: {hint}, or pass --model-dir with the model already on every node"
    )
