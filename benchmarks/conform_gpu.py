"""GPU figures for conform's reference rule: how much a served token's logprob moves with batch size and kernel
settings on a real GPU (the noise a tolerance must allow), and how far the planted in-model faults move it (what
a tolerance must still catch). Run where torch and transformers see a GPU (the GPU machine), on the trained tiny
model (tests/fixtures/tiny-qwen35moe), bf16:

  python3 benchmarks/conform_gpu.py tests/fixtures/tiny-qwen35moe noise OUT.json
  python3 benchmarks/conform_gpu.py tests/fixtures/tiny-qwen35moe faults OUT.json NOISE.json

(two parts: each fits one 10-minute call on the GPU machine; the faults part takes its tolerance from the noise
part's figures)

The prompts are the ones the model learnt (conform's 120 known-answer probes and 8 progressions,
tests/engine/tiny_trained_qwen35moe.py), each decoded greedily for 32 tokens as one row of a batch of B identical
rows (no padding: only the batch shape differs). "served" is that continuation with its own logprobs; the
reference scores the same tokens teacher-forced at batch 1 with the default settings, as conform's reference row
scores a served continuation with transformers. Settings: "default" (cuBLAS's reduced-precision bf16 reductions
allowed) and "strict" (reductions in full precision, deterministic algorithms, no TF32): torch has no
batch-invariant kernels of its own, so "strict" is the closest setting it offers, named as what it is.
Faults (in the served copy only): output layer x0.5, every expert x0.5, rope_theta x100, experts 0 and 1 swapped
in the router.
"""

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))
import tiny_trained_qwen35moe as maker

TOKENS = 32
BATCHES = (1, 8, 64)
FAULTS = ("lm_head x0.5", "experts x0.5", "rope_theta x100", "routing swapped")


def prompts() -> list[list[int]]:
    import random

    asked = [maker.probe_turn(item, maker.SEQ)[0][: len(maker.CHAT_PREFIX) + len(item.prompt.split())]
             for item in maker.probe_set()]  # fmt: skip
    rng = random.Random(maker.SEED + 1)
    for _ in range(8):
        seq, mask = maker.example(rng, 40)
        asked.append(seq[: mask.index(1)])
    return asked


def settings(torch, strict: bool) -> None:
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = not strict
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = not strict
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(strict, warn_only=True)


def load(torch, folder: str, fault: str | None = None):
    from transformers import AutoConfig, Qwen3_5MoeForConditionalGeneration

    config = AutoConfig.from_pretrained(folder)
    if fault == "rope_theta x100":
        text = config.text_config
        params = dict(getattr(text, "rope_parameters", None) or {})
        params["rope_theta"] = float(params.get("rope_theta", getattr(text, "rope_theta", 10000.0))) * 100
        text.rope_parameters = params
        if hasattr(text, "rope_theta"):
            text.rope_theta = params["rope_theta"]
    net = Qwen3_5MoeForConditionalGeneration.from_pretrained(folder, config=config, dtype=torch.bfloat16)
    net = net.to("cuda").eval()
    with torch.no_grad():
        if fault == "lm_head x0.5":
            net.lm_head.weight.mul_(0.5)
        for name, module in net.named_modules():
            if fault == "experts x0.5" and name.endswith("mlp.experts"):
                for p in module.parameters():
                    p.mul_(0.5)
            if fault == "routing swapped" and name.endswith("mlp.gate"):
                weight = module.weight
                weight[[0, 1]] = weight[[1, 0]].clone()
    return net


def decode(torch, net, ids: list[int], batch: int) -> tuple[list[int], list[float]]:
    """Greedy tokens of row 0 of a batch of `batch` identical rows, and each token's logprob there."""
    x = torch.tensor([ids] * batch, device="cuda")
    with torch.no_grad():
        out = net.generate(input_ids=x, max_new_tokens=TOKENS, do_sample=False, output_scores=True,
                           return_dict_in_generate=True, pad_token_id=1, eos_token_id=None)  # fmt: skip
    tokens = out.sequences[0, len(ids) :].tolist()
    logprobs = [
        float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, tokens, strict=True)
    ]
    return tokens, logprobs


def score(torch, net, ids: list[int], tokens: list[int]) -> list[float]:
    """Teacher-forced logprobs of `tokens` after `ids` (batch 1): what the reference says of a served answer."""
    with torch.no_grad():
        logits = net(input_ids=torch.tensor([ids + tokens], device="cuda")).logits[0].float()
    lp = torch.log_softmax(logits[len(ids) - 1 : -1], -1)
    return [float(lp[i, t]) for i, t in enumerate(tokens)]


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p99": ordered[int(0.99 * (len(ordered) - 1))],
            "max": ordered[-1], "n": len(ordered)}  # fmt: skip


def noise(torch, folder: str, asked: list[list[int]], doc: dict) -> None:
    settings(torch, strict=False)
    clean = load(torch, folder)
    reference = [decode(torch, clean, ids, 1) for ids in asked]
    per_prompt: list[float] = []
    for strict, batches in ((False, BATCHES), (True, (1, BATCHES[-1]))):
        settings(torch, strict)
        for batch in batches:
            diverged, deltas = 0, []
            for ids, (ref_tokens, _) in zip(asked, reference, strict=True):
                tokens, logprobs = decode(torch, clean, ids, batch)
                settings(torch, strict=False)
                scored = score(torch, clean, ids, tokens)
                settings(torch, strict)
                diverged += tokens != ref_tokens
                gaps = [abs(a - b) for a, b in zip(logprobs, scored, strict=True)]
                deltas += gaps
                per_prompt.append(max(gaps))
            key = f"{'strict' if strict else 'default'} batch {batch}"
            doc["noise"][key] = {"diverged": diverged, "of": len(asked), "abs_logprob_delta": summary(deltas)}
            print(key, doc["noise"][key], flush=True)
    worst = max(per_prompt)
    tolerance = max(4 * worst, 0.05)
    doc["tolerance"] = {
        "worst_noise": worst,
        "rule": "max(4 x worst measured noise, 0.05 nats)",
        "value": tolerance,
    }
    doc["false_alarms"] = {"over_tolerance": sum(n > tolerance for n in per_prompt), "of": len(per_prompt)}
    doc["reference"] = [tokens for tokens, _ in reference]


def faults(torch, folder: str, asked: list[list[int]], doc: dict, measured: dict) -> None:
    settings(torch, strict=False)
    tolerance = measured["tolerance"]["value"]
    doc["tolerance"] = measured["tolerance"]
    clean = load(torch, folder)
    for fault in FAULTS:
        faulty = load(torch, folder, fault)
        tokens_differ, caught, gaps_max = 0, 0, []
        for ids, ref_tokens in zip(asked, measured["reference"], strict=True):
            tokens, logprobs = decode(torch, faulty, ids, 1)
            scored = score(torch, clean, ids, tokens)
            gap = max(abs(a - b) for a, b in zip(logprobs, scored, strict=True))
            tokens_differ += tokens != ref_tokens
            caught += gap > tolerance
            gaps_max.append(gap)
        doc["faults"][fault] = {"greedy_tokens_differ": tokens_differ, "caught_by_tolerance": caught,
                                "of": len(asked), "max_abs_delta": summary(gaps_max)}  # fmt: skip
        print(fault, doc["faults"][fault], flush=True)
        del faulty
        torch.cuda.empty_cache()


def main() -> None:
    import torch
    import transformers

    folder, part, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    asked = prompts()
    doc: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "transformers": transformers.__version__, "tokens": TOKENS, "prompts": len(asked),
                 "noise": {}, "faults": {}}  # fmt: skip
    start = time.monotonic()
    if part == "noise":
        noise(torch, folder, asked, doc)
    else:
        faults(torch, folder, asked, doc, json.loads(Path(sys.argv[4]).read_text()))
    doc["seconds"] = round(time.monotonic() - start, 1)
    out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
