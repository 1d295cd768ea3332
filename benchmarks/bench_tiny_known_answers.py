"""Can the tiny test vehicle learn conform's known-answer probe set? (benchmarks/conform.md, "Known answers").

Trains the tiny Qwen3.5-MoE of tests/engine/tiny_trained_qwen35moe.py (its config, vocabulary and progressions;
not its tool-call and thought turns) with conform's probes (sparkforge/run/conform/probes.py) mixed in as chat turns
that end, then scores, in bf16 transformers, the row's default set (seed 0, 120 probes, judged by the row's own
rule) and the progression (4 held-out prompts x 64 tokens). MODE `exact`: the probes trained on are the row's
own set (the vehicle learns the known answers, as it learns the progression); `fresh`: new probes from the
generator (does it learn the skills?). Prints one JSON line.

Needs torch and transformers 5 (the CPU twin has both; run it there under the engine lock, or on any machine
with them). From the repository root:
  [DEV=cuda] [STEPS=1500] [SHARE=0.6] [THREADS=2] [NOSCORE=1] python3 benchmarks/bench_tiny_known_answers.py exact|fresh
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEQ = (
    104  # the longest probe of the default set (a recall, 80 words) in the chat template, its answer, the end
)


def _load(name: str, path: Path):
    """A module from its file (no folder on sys.path: sparkforge/run/conform/kernels.py would shadow the
    `kernels` package transformers looks for)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


trainer = _load("tiny_trained_qwen35moe", ROOT / "tests" / "engine" / "tiny_trained_qwen35moe.py")
probes = _load("conform_probes", ROOT / "sparkforge" / "run" / "conform" / "probes.py")
_LISTED = [*trainer.SPECIALS, *trainer.NUMBERS, *trainer.WORDS, *trainer.VISION, *trainer.MARKUP]
_LISTED += [w for w in dict.fromkeys(probes.WORDS) if w not in _LISTED]  # after the rest: their ids stay
VOCAB_WORDS = _LISTED + [f"w{i}" for i in range(trainer.VOCAB - len(_LISTED))]
trainer.words = lambda: VOCAB_WORDS  # the trainer's examples and turns read the vocabulary through words()
IDS = {w: i for i, w in enumerate(VOCAB_WORDS)}
PROBE_SET = probes.probe_set(0, int(os.environ.get("COUNT", "120")))


def probe_turn(item) -> tuple[list[int], list[int]]:
    """A probe as conform asks it: the chat template, the answer learnt, then the end of the turn."""
    prompt = [IDS[w] for w in (*trainer.CHAT_PREFIX, *item.prompt.split())]
    answer = [IDS[w] for w in (*item.answer.split(), "<|im_end|>")]
    pad = SEQ - len(prompt) - len(answer)
    return prompt + answer + [IDS["<|endoftext|>"]] * pad, [0] * len(prompt) + [1] * len(answer) + [0] * pad


def mixed(rng: random.Random, mode: str, share: float) -> tuple[list[int], list[int]]:
    """A probe (`share` of the mix) or a progression; the trainer's tool-call and thought turns are left out."""
    if rng.random() < share:
        item = rng.choice(PROBE_SET) if mode == "exact" else probes.probe(rng.choice(probes.KINDS), rng)
        return probe_turn(item)
    return trainer.example(rng, SEQ)


def known_answers(net, torch) -> tuple[int, dict[str, str]]:
    """Greedy replies to the row's set, judged by the row's rule: right, and right per kind."""
    right: dict[str, list[int]] = {}
    with torch.no_grad():
        for item in PROBE_SET:
            prompt = [IDS[w] for w in (*trainer.CHAT_PREFIX, *item.prompt.split())]
            got = net.generate(input_ids=torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                               pad_token_id=1, eos_token_id=3)[0, len(prompt):].tolist()  # fmt: skip
            text = " ".join(VOCAB_WORDS[i] for i in got if i != 3)
            right.setdefault(item.kind, []).append(int(item.judge(text)))
    return sum(map(sum, right.values())), {k: f"{sum(v)}/{len(v)}" for k, v in right.items()}


def main(mode: str) -> dict:
    """The trainer's own loop (batch 8, AdamW, one-cycle LR to 3e-3) on this mix, then the scores."""
    import torch
    from transformers import Qwen3_5MoeForConditionalGeneration

    env = os.environ.get
    share, steps, device = float(env("SHARE", "0.6")), int(env("STEPS", "1500")), env("DEV", "cpu")
    torch.manual_seed(trainer.SEED)
    torch.set_num_threads(int(env("THREADS", "2")))
    trainer.mixed = lambda rng, _length: mixed(rng, mode, share)
    net = Qwen3_5MoeForConditionalGeneration(trainer.config(torch)).to(device)  # initialised on the CPU
    torch.set_default_device(device)  # the trainer's batches are made where the model is
    start = time.monotonic()
    losses = trainer.train(net, torch, steps, random.Random(trainer.SEED))
    train_s = time.monotonic() - start
    out = {"mode": mode, "share": share, "steps": steps, "device": device, "train_s": round(train_s, 1),
           "per_step_s": round(train_s / steps, 3), "loss": round(losses[-1], 4)}  # fmt: skip
    if not env("NOSCORE"):
        torch.set_default_device("cpu")
        net = net.to("cpu").to(torch.bfloat16).eval()
        right, by_kind = known_answers(net, torch)
        progression = trainer.accuracy(net, torch, random.Random(trainer.SEED + 1), prompts=4, tokens=64)
        out.update(known=f"{right}/{len(PROBE_SET)}", by_kind=by_kind, progression=progression["accuracy"])
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
