"""The `reference` rule's floor: how much weight noise it sees (benchmarks/conform.md, "The reference row's floor").

The trained tiny model (tests/engine/tiny_trained_qwen35moe.py, cached by the engine tests) is copied with every
floating-point tensor multiplied by (1 + s * N(0, 1)) for each noise level s; conform's own reference script
(sparkforge/run/conform/hf_reference.py, in the CPU twin) scores the clean model's continuation of conform's
prompt set of the twin profile (the progression it was trained on, which its greedy decode is) teacher-forced on
the clean and on each noisy copy, and conform/teacher.py judges clean vs noisy exactly as the `reference` row
judges vLLM vs transformers. Prints one JSON line per level.

Usage: python3 benchmarks/bench_reference_noise.py TWIN_IMAGE MODEL_DIR [LEVELS, e.g. 0.01,0.03,0.1]
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sparkforge.run.conform.client import Completion
from sparkforge.run.conform.logprobs import Decode
from sparkforge.run.conform.reference import ReferenceRun, reference_scores, run_reference
from sparkforge.run.conform.teacher import Tolerances, judge, noise
from sparkforge.run.launch import MODEL_MOUNT
from sparkforge.run.nodes import LOCAL, NodeEngine

PROMPTS = [
    "0 1",
    "17 18",
    "40 42",
    "93 96",
    "50 49",
    "7 8 9 10 11",
]  # tests/profiles/cpu-tiny-qwen35moe-conform
LONG_WORDS = 2000
NOISE = """
import sys, torch
from safetensors.torch import load_file, save_file
level, seed = float(sys.argv[1]), 0
tensors = load_file("/in/model.safetensors")
g = torch.Generator().manual_seed(seed)
out = {k: (v.float() * (1 + level * torch.randn(v.shape, generator=g))).to(v.dtype) if v.is_floating_point() else v
       for k, v in tensors.items()}
save_file(out, "/out/model.safetensors", metadata={"format": "pt"})
"""


def prompt_ids() -> list[list[int]]:
    """The tiny model's word-level ids (number n is id n + 4, no BOS): conform's six prompts and its long one."""
    texts = [p.split() for p in PROMPTS] + [[str(k % 100) for k in range(LONG_WORDS)]]
    return [[int(w) + 4 for w in words] for words in texts]


def continuations(count: int = 48) -> list[list[int]]:
    """What the trained model answers each prompt greedily: the progression of its last two numbers, mod 100."""
    out = []
    for ids in prompt_ids():
        a, b = ids[-2] - 4, ids[-1] - 4
        out.append([(b + (b - a) * (k + 1)) % 100 + 4 for k in range(count)])
    return out


def noisy_copy(engine: NodeEngine, image: str, model: Path, level: float, into: Path) -> None:
    for item in model.iterdir():  # copies (a link would point outside the container's mount)
        if item.is_dir():
            shutil.copytree(item, into / item.name)
        elif item.name != "model.safetensors":
            shutil.copy(item, into / item.name)
    engine.call("noise", "run", "--rm", "--network", "none", "--volume", f"{model}:/in:ro",
                "--volume", f"{into}:/out", "--entrypoint", "python3", image, "-c", NOISE, str(level),
                timeout=600)  # fmt: skip


def score(engine: NodeEngine, image: str, model: Path) -> tuple[list, float]:
    served = continuations()
    ask = {"model": MODEL_MOUNT, "tokenizer": f"{MODEL_MOUNT}/tokenizer", "dtype": "float32", "device": "cpu",
           "top": 5, "prompts": prompt_ids(), "served": served, "pieces_of": [], "threads": 1}  # fmt: skip
    start = time.monotonic()
    answer = run_reference(engine, ReferenceRun(image, model, gpus=False), ask)
    completions = [Completion(tuple(ids), "", "length") for ids in served]
    return reference_scores(answer, completions), time.monotonic() - start


def main(image: str, model: Path, levels: list[float]) -> None:
    engine = NodeEngine(LOCAL)
    clean, seconds = score(engine, image, model)
    # The clean scores as the served side (its values of its own tokens and its top-5), the noisy copy as the
    # reference: the row's rule, unchanged.
    served = [
        Decode(tuple(ids), tuple({**top, t: lp} for t, lp, top in zip(ids, s.logprob, s.top, strict=True)))
        for ids, s in zip(continuations(), clean, strict=True)
    ]
    print(json.dumps({"level": 0.0, "seconds": round(seconds, 1)}), flush=True)
    for level in levels:
        with tempfile.TemporaryDirectory(prefix="noisy-model-", dir=model.parent) as tmp:
            noisy_copy(engine, image, model.resolve(), level, Path(tmp))
            noisy, seconds = score(engine, image, Path(tmp))
        verdicts = judge(served, noisy, Tolerances())
        misses = [v.miss for v in verdicts if v.miss is not None]
        print(json.dumps({
            "level": level, "seconds": round(seconds, 1), "tolerances": [Tolerances().served, Tolerances().top],
            "prompts_failing": len(misses), "of": len(verdicts), "deltas": noise(verdicts), "top_deltas": noise(verdicts, top=True),
            "first": [m.to_dict() for m in misses[:2]],
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main(
        sys.argv[1],
        Path(sys.argv[2]),
        [float(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "0.01").split(",")],
    )
