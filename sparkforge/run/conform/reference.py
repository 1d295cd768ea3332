"""The `reference` row: the served answers set against an implementation outside the server, Hugging Face
transformers in the same image on the same weights (hf_reference.py, in a container of its own).

Both sides decode the same token ids (the served tokenizer's), greedy, top-5 logprobs; each prompt is judged by
vLLM's `check_logprobs_close` rule (conform/logprobs.py), and the first divergence is reported with both top-5
lists and the text around it, accepted or not. The container runs after conform has stopped its servers: a real
checkpoint need not fit in memory twice (on a Spark, 128 GB hold one copy of a 35B model and its KV cache);
the report says so and how long it took.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkforge.boundary import parse_json, read_text
from sparkforge.errors import InputError, RunError
from sparkforge.recipe.profile import Profile
from sparkforge.report import Check
from sparkforge.run.conform.client import Completion
from sparkforge.run.conform.conformrun import ConformRun
from sparkforge.run.conform.logprobs import TOP_K, Decode, judge, rule_name
from sparkforge.run.conform.served_checks import decodes, render
from sparkforge.run.launch import MODEL_MOUNT
from sparkforge.run.nodes import NodeEngine

SCRIPT = Path(__file__).with_name("hf_reference.py")
MARKER = "SPARKFORGE-REFERENCE:"
NAMES = ("vLLM", "transformers")


@dataclass(frozen=True)
class ReferenceRun:
    """Where and how the reference decodes: the image, the model folder on the node, GPUs or not."""

    image: str
    model_dir: Path
    gpus: bool
    timeout_s: float = 3600


def request(
    profile: Profile, prompt_ids: list[list[int]], served: list[Completion], max_tokens: int, gpus: bool
) -> dict[str, Any]:
    """The script's request: the served dtype (the profile's, else the checkpoint's), the served prompt ids, and
    the served ids whose text the report may show (the servers are stopped by then: the image's tokenizer says)."""
    args = {k.replace("_", "-"): v for k, v in profile.model.args.items()}
    # On a CPU (the twin) float32 and one thread: bf16 matmuls are emulated on most CPUs and threads fight a busy
    # machine (benchmarks/conform.md: 43 s -> 4 s a prompt); on a GPU the served dtype.
    dtype = str(args.get("dtype") or "auto") if gpus else "float32"
    tokenizer = str(args.get("tokenizer") or MODEL_MOUNT)
    tokenizer = tokenizer if tokenizer.startswith(MODEL_MOUNT) else MODEL_MOUNT  # a hub id: the folder's own
    shown = sorted({t for c in served for t in (*c.token_ids, *(i for top in c.top for i in top))})
    return {"model": MODEL_MOUNT, "tokenizer": tokenizer, "dtype": dtype, "device": "cuda" if gpus else "cpu",
            "top": TOP_K, "max_tokens": max_tokens, "prompts": prompt_ids, "pieces_of": shown,
            "threads": 0 if gpus else 1}  # fmt: skip


def run_reference(engine: NodeEngine, run: ReferenceRun, ask: dict[str, Any]) -> dict[str, Any]:
    """hf_reference.py in a throwaway container of the served image (no network, the weights read-only)."""
    argv = ["run", "--rm", "--network", "none", *(["--gpus", "all"] if run.gpus else []),
            "--volume", f"{run.model_dir}:{MODEL_MOUNT}:ro", "--env", "HF_HUB_OFFLINE=1",
            "--entrypoint", "python3", run.image, "-c", read_text(SCRIPT, "", 1 << 20), repr(ask)]  # fmt: skip
    output = engine.call("conform-reference", *argv, timeout=run.timeout_s)
    line = next((x for x in reversed(output.splitlines()) if x.startswith(MARKER)), "")
    if not line:
        raise RunError(
            f"the transformers reference in {run.image} gave no answer; its last output: {output[-800:]}; fix: "
            "check that the image holds transformers and the model folder its weights"
        )
    try:
        answer = parse_json(line.removeprefix(MARKER), "the transformers reference's answer")
    except InputError as exc:
        raise RunError(str(exc)) from None
    if not isinstance(answer, dict):
        raise RunError("the transformers reference's answer is not an object")
    if answer.get("error"):
        raise RunError(
            f"transformers could not decode the prompts in {run.image}: {str(answer['error'])[:800]}; fix: check "
            "that the image's transformers knows this architecture"
        )
    return answer


def reference_decodes(answer: dict[str, Any], count: int) -> list[Decode]:
    """The answer's decodes, checked in shape (ids, top-K pairs), one per prompt."""
    found = answer.get("decodes")
    if not isinstance(found, list) or len(found) != count:
        raise RunError(f"the transformers reference answered {type(found).__name__} for {count} prompts")
    out = []
    for item in found:
        ids, top = item.get("token_ids"), item.get("top")
        if not (
            isinstance(ids, list)
            and isinstance(top, list)
            and all(isinstance(i, int) for i in ids)
            and all(isinstance(p, list) and all(isinstance(x, list) and len(x) == 2 for x in p) for p in top)
        ):
            raise RunError("the transformers reference's decode is not token ids and top-K pairs")
        out.append(Decode(tuple(ids), tuple({int(t): float(lp) for t, lp in p} for p in top)))
    return out


def pieces_text(answer: dict[str, Any]) -> Callable[[Sequence[int]], str | None]:
    """Ids to text from the reference's tokenizer pieces (every id either side produced or ranked)."""
    pieces = answer.get("pieces") if isinstance(answer.get("pieces"), dict) else {}

    def text_of(ids: Sequence[int]) -> str | None:
        parts = [pieces.get(str(i)) for i in ids]
        if not all(isinstance(p, str) for p in parts):
            return None
        # BPE pieces carry their own spaces; a word-level vocabulary's do not (the tokenizer joins them with one)
        return ("" if any(p[:1].isspace() for p in parts) else " ").join(parts)

    return text_of


def compare(served: list[Completion], answer: dict[str, Any], seconds: float) -> Check:
    """The row: every prompt under the logprobs rule, the first divergence (accepted or not) in words."""
    ref = reference_decodes(answer, len(served))
    found = judge(decodes(served), ref)
    tokens = sum(len(c.token_ids) for c in served)
    details: dict[str, Any] = {
        "prompts": len(served), "tokens": tokens, "rule": rule_name(False), "seconds": round(seconds, 1),
        "sequential": "conform stopped its servers first: the checkpoint need not fit in memory twice",
        **{k: answer.get(k) for k in ("class", "transformers", "torch", "load_s", "generate_s")},
        "divergences": [d.to_dict() for d in found],
    }  # fmt: skip
    ran = f"transformers {answer.get('transformers')} ({answer.get('class')}), run after the servers stopped, {seconds:.0f} s"
    rejected = [d for d in found if not d.accepted]
    if found:
        first = rejected[0] if rejected else found[0]
        refs = [Completion(d.token_ids, "", "", top=d.top) for d in ref]
        shown = render(first, NAMES, served[first.prompt], refs[first.prompt], pieces_text(answer))
        details.update({"prompt": first.prompt, "position": first.position})
    if rejected:
        return Check("reference", "failed", f"{shown} ({ran})", details)
    identical = len(served) - len(found)
    within = f"; {len(found)} diverge within the rule, first: {shown}" if found else ""
    return Check(
        "reference",
        "passed",
        f"{len(served)} prompts, {identical} identical to transformers, {tokens} tokens ({ran}){within}",
        details,
    )


def reference_row(
    engine: NodeEngine,
    run: ReferenceRun,
    profile: Profile,
    served: list[Completion],
    prompt_ids: list[list[int]],
    max_tokens: int,
) -> Check:
    """Run the reference and judge it; a reference that cannot run is this row's failure, named."""
    start = time.monotonic()
    try:
        answer = run_reference(engine, run, request(profile, prompt_ids, served, max_tokens, run.gpus))
        row = compare(served, answer, time.monotonic() - start)
    except RunError as exc:
        row = Check("reference", "failed", f"the transformers reference did not run: {str(exc)[:800]}")
    row.duration_s = time.monotonic() - start
    return row


def reference_conform_row(run: ConformRun) -> None:
    """The registry's `reference` row (run/conform/rows.py): after the other rows, conform's servers are stopped
    (one copy of the weights in memory), then transformers decodes the served prompt ids and is judged."""
    options, launch = run.options, run.options.launch
    why = ""
    if options.attach or launch is None:
        why = (
            "--attach: conform did not start the server, so it cannot free its memory for the reference; fix: run "
            "conform without --attach (with --model-dir)"
        )
    elif launch.model_dir is None:
        why = "the reference reads the weights from --model-dir; fix: pass --model-dir (the checkpoint's folder)"
    elif not run.inputs.get("prompt_ids"):
        why = "the served prompts were not tokenized"
    if why or launch is None or launch.model_dir is None:
        run.report.add(Check("reference", "skipped", why))
        run.echo(f"  reference: skipped: {why}")
        return
    run.servers.keep_failed_logs(run.engines, run.profile, run.report)
    run.servers.stop(run.engines, run.profile)
    run.echo(
        "conform: the transformers reference (the servers are stopped: one copy of the weights in memory) ..."
    )
    where = ReferenceRun(launch.image, launch.model_dir, launch.gpus)
    row = reference_row(
        run.engines[0], where, run.profile, run.reference, run.inputs["prompt_ids"], run.settings.max_tokens
    )
    run.report.add(row)
    run.echo(f"  reference: {row.status} ({row.duration_s:.1f} s) {row.reason[:600]}")
