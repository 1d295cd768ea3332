"""Can the tiny test vehicle learn conform's known-answer probe set? (benchmarks/conform.md, "Known answers").

Trains the tiny Qwen3.5-MoE of tests/engine/tiny_trained_qwen35moe.py (its config, vocabulary, loop and mix) with
conform's probes (sparkforge/run/conform/probes.py) as chat turns that end, `SHARE` of the mix, then scores, in bf16 transformers, the row's default set (seed 0, 120 probes, judged by the row's own
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


def _load(name: str, path: Path):
    """A module from its file (no folder on sys.path: sparkforge/run/conform/kernels.py would shadow the
    `kernels` package transformers looks for)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


trainer = _load("tiny_trained_qwen35moe", ROOT / "tests" / "engine" / "tiny_trained_qwen35moe.py")
probes = trainer.probes()  # its vocabulary takes the probes' words (after its own: their ids stay)
SEQ = trainer.SEQ
LEARNT = trainer.mixed  # the trainer's own mix: the row's set, a tool call, a thought, progressions


def mixed(rng: random.Random, mode: str, share: float) -> tuple[list[int], list[int]]:
    """`exact`: the trainer's own mix (probes `share` of it); `fresh`: new probes from the generator instead of the
    row's set, the trainer's tool-call and thought turns left out."""
    if mode == "exact":
        trainer.PROBE_SHARE = share
        return LEARNT(rng, SEQ)
    if rng.random() < share:
        return trainer.probe_turn(probes.probe(rng.choice(probes.KINDS), rng), SEQ)
    return trainer.example(rng, SEQ)


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
        known = trainer.known_answers(net, torch)
        progression = trainer.accuracy(net, torch, random.Random(trainer.SEED + 1), prompts=4, tokens=64)
        out.update(known=f"{known['right']}/{known['probes']}", by_kind=known["by_kind"],
                   progression=progression["accuracy"])  # fmt: skip
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
