"""The `reference` row: the served answers set against an implementation outside the server, Hugging Face
transformers in the same image (hf_reference.py, in a container of its own) on the same weights, or on the
folder `--reference-model-dir` names (an unquantized checkpoint beside a quantized served one; a clean copy beside
a faulty one).

transformers scores every served continuation teacher-forced, and each position is judged on logprob values by
the rule of teacher.py: a fault that changes no greedy token still moves the values. The first position outside
the rule is reported with the text before it, both logprobs and both top-5 lists; every prompt's largest delta
and the deltas' median, p99 and maximum are in the details (the figures a profile's tolerance comes from). The
container runs after conform has stopped its servers: a real checkpoint need not fit in memory twice (on a Spark,
128 GB hold one copy of a 35B model and its KV cache); the report says so and how long it took.
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
from sparkforge.run.conform.logprobs import TOP_K
from sparkforge.run.conform.served_checks import decodes, show_top, text
from sparkforge.run.conform.teacher import Miss, Scored, Tolerances, judge, noise, rule_name
from sparkforge.run.launch import MODEL_MOUNT
from sparkforge.run.nodes import NodeEngine

SCRIPT = Path(__file__).with_name("hf_reference.py")
MARKER = "SPARKFORGE-REFERENCE:"
NAMES = ("vLLM", "transformers")


@dataclass(frozen=True)
class ReferenceRun:
    """Where and how the reference scores: the image, the model folder on the node, GPUs or not."""

    image: str
    model_dir: Path
    gpus: bool
    timeout_s: float = 3600


def request(
    profile: Profile, prompt_ids: list[list[int]], served: list[Completion], gpus: bool
) -> dict[str, Any]:
    """The script's request: the served dtype (the profile's, else the checkpoint's), the served prompt ids and
    continuations, and the ids whose text the report may show (the servers are stopped by then: the image's
    tokenizer says)."""
    args = {k.replace("_", "-"): v for k, v in profile.model.args.items()}
    # On a CPU (the twin) float32 and one thread: bf16 matmuls are emulated on most CPUs and threads fight a busy
    # machine (benchmarks/conform.md: 43 s -> 4 s a prompt); on a GPU the served dtype.
    dtype = str(args.get("dtype") or "auto") if gpus else "float32"
    tokenizer = str(args.get("tokenizer") or MODEL_MOUNT)
    tokenizer = tokenizer if tokenizer.startswith(MODEL_MOUNT) else MODEL_MOUNT  # a hub id: the folder's own
    shown = sorted({t for c in served for t in (*c.token_ids, *(i for top in c.top for i in top))})
    return {"model": MODEL_MOUNT, "tokenizer": tokenizer, "dtype": dtype, "device": "cuda" if gpus else "cpu",
            "top": TOP_K, "prompts": prompt_ids, "served": [list(c.token_ids) for c in served], "pieces_of": shown,
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


def reference_scores(answer: dict[str, Any], served: list[Completion]) -> list[Scored]:
    """The answer's scores, checked in shape (a logprob and top-K pairs per served token), one per prompt."""
    found = answer.get("scored")
    if not isinstance(found, list) or len(found) != len(served):
        raise RunError(
            f"the transformers reference answered {type(found).__name__} for {len(served)} prompts"
        )
    out = []
    for item, completion in zip(found, served, strict=True):
        values, top = (
            item.get("logprob") if isinstance(item, dict) else None,
            item.get("top") if isinstance(item, dict) else None,
        )
        if not (
            isinstance(values, list)
            and isinstance(top, list)
            and len(values) == len(top) == len(completion.token_ids)
            and all(isinstance(v, float | int) and not isinstance(v, bool) for v in values)
            and all(isinstance(p, list) and all(isinstance(x, list) and len(x) == 2 for x in p) for p in top)
        ):
            raise RunError(
                "the transformers reference's scores are not a logprob and top-K pairs per served token"
            )
        out.append(
            Scored(tuple(float(v) for v in values), tuple({int(t): float(lp) for t, lp in p} for p in top))
        )
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


def render(miss: Miss, served: Completion, text_of: Callable[[Sequence[int]], str | None]) -> str:
    """The first position outside the rule as a reader needs it: where, the text before it, the served token with
    both logprobs, and both top-5 lists."""
    pos = miss.position
    before = text(served.token_ids[max(0, pos - 8) : pos], text_of) if pos else "(the start)"
    mine = "none" if miss.served is None else f"{miss.served:.3f}"
    return (
        f"prompt {miss.prompt} fails at token {pos} after {before}: vLLM served {text([miss.token], text_of)} "
        f"at logprob {mine}, transformers gives it {miss.reference:.3f} (vLLM's top-{TOP_K} "
        f"{show_top(miss.served_top, text_of)}, transformers' {show_top(miss.reference_top, text_of)}): "
        f"{miss.why}"
    )


def compare(served: list[Completion], answer: dict[str, Any], seconds: float, rule: Tolerances) -> Check:
    """The row: every position of every prompt under the teacher-forced rule; the first miss in words."""
    verdicts = judge(decodes(served), reference_scores(answer, served), rule)
    tokens = sum(len(c.token_ids) for c in served)
    misses = [v.miss for v in verdicts if v.miss is not None]
    ties = sum(v.near_ties for v in verdicts)
    spread, top = noise(verdicts), noise(verdicts, top=True)
    details: dict[str, Any] = {
        "prompts": len(served), "tokens": tokens, "rule": rule_name(rule), "tolerance": rule.served,
        "top_tolerance": rule.top, "seconds": round(seconds, 1), "deltas": spread, "top_deltas": top,
        "near_ties": ties,
        "max_delta_per_prompt": [round(v.max_delta, 4) for v in verdicts],
        "sequential": "conform stopped its servers first: the checkpoint need not fit in memory twice",
        **{k: answer.get(k) for k in ("class", "transformers", "torch", "load_s", "score_s")},
        "misses": [m.to_dict() for m in misses],
    }  # fmt: skip
    ran = f"transformers {answer.get('transformers')} ({answer.get('class')}), run after the servers stopped, {seconds:.0f} s"
    if misses:
        first = misses[0]
        details.update({"prompt": first.prompt, "position": first.position})
        shown = render(first, served[first.prompt], pieces_text(answer))
        return Check(
            "reference",
            "failed",
            f"{shown}; {len(misses)} of {len(served)} prompts outside the rule ({ran})",
            details,
        )
    largest = spread.get("max", 0.0)
    within = f", {ties} near ties accepted" if ties else ""
    return Check(
        "reference",
        "passed",
        f"{len(served)} prompts, {tokens} tokens scored by transformers teacher-forced, the largest logprob delta "
        f"{largest} nats (tolerance {rule.served:g}), in the top-5 {top.get('max', 0.0)} (tolerance {rule.top:g})"
        f"{within} ({ran})",
        details,
    )


def reference_row(
    engine: NodeEngine,
    run: ReferenceRun,
    profile: Profile,
    served: list[Completion],
    prompt_ids: list[list[int]],
    rule: Tolerances,
) -> Check:
    """Run the reference and judge it; a reference that cannot run is this row's failure, named."""
    start = time.monotonic()
    try:
        answer = run_reference(engine, run, request(profile, prompt_ids, served, run.gpus))
        row = compare(served, answer, time.monotonic() - start, rule)
    except RunError as exc:
        row = Check("reference", "failed", f"the transformers reference did not run: {str(exc)[:800]}")
    row.duration_s = time.monotonic() - start
    return row


def reference_conform_row(run: ConformRun) -> None:
    """The registry's `reference` row (run/conform/rows.py): after the other rows, conform's servers are stopped
    (one copy of the weights in memory), then transformers scores the served continuations and is judged."""
    options, launch = run.options, run.options.launch
    why = ""
    if options.attach or launch is None:
        why = (
            "--attach: conform did not start the server, so it cannot free its memory for the reference; fix: run "
            "conform without --attach (with --model-dir)"
        )
    elif launch.model_dir is None and options.reference_model_dir is None:
        why = (
            "the reference reads the weights from --model-dir or --reference-model-dir; fix: pass --model-dir "
            "(the checkpoint's folder)"
        )
    elif not run.inputs.get("prompt_ids"):
        why = "the served prompts were not tokenized"
    weights = options.reference_model_dir or (launch.model_dir if launch else None)
    if why or launch is None or weights is None:
        run.report.add(Check("reference", "skipped", why))
        run.echo(f"  reference: skipped: {why}")
        return
    run.servers.keep_failed_logs(run.engines, run.profile, run.report)
    run.servers.stop(run.engines, run.profile)
    run.echo(
        f"conform: the transformers reference on {weights} (the servers are stopped: one copy of the weights in "
        "memory) ..."
    )
    where = ReferenceRun(launch.image, weights, launch.gpus)
    # The long continuation (settings.reference.long_tokens), when it was served, is scored as one prompt more.
    long = [run.inputs["long_served"]] if "long_served" in run.inputs else []
    row = reference_row(
        run.engines[0],
        where,
        run.profile,
        [*run.reference, *long],
        [*run.inputs["prompt_ids"], *([run.inputs["long_prompt_ids"]] if long else [])],
        Tolerances(run.settings.reference.tolerance, run.settings.reference.top_tolerance),
    )
    run.report.add(row)
    run.echo(f"  reference: {row.status} ({row.duration_s:.1f} s) {row.reason[:600]}")
