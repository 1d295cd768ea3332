"""The reference conform sets vLLM against, run INSIDE the served image (its own transformers and torch, the
weights given): Hugging Face transformers scores each served continuation teacher-forced (the prompt and every
served token in one forward pass), the logprob of each served token and the top-K of the raw logits there.

It is never imported on the host (torch and transformers are the image's): `reference.py` passes this file's
text to the image's python3 with one request (a Python literal of numbers, strings, lists and dicts the host
wrote: `ast.literal_eval` evaluates nothing else) and reads one marker line of JSON back.
Request: {"model": dir, "tokenizer": dir, "pieces_of": [ids the report may show], "dtype": "bfloat16"|"auto"|...,
          "device": "cpu"|"cuda", "top": K, "threads": T (0: torch's default),
          "prompts": [[token ids], ...] (the served tokenizer's ids), "served": [[served token ids], ...]}.
Answer:  {"scored": [{"logprob": [...], "top": [[[id, logprob], ...], ...]}], "pieces": {id: text},
          "transformers": ..., ...}.
"""

import ast
import json
import sys
import time

MARKER = "SPARKFORGE-REFERENCE:"


def main(request: dict) -> dict:
    import torch
    import transformers

    start = time.monotonic()
    if request.get("threads"):
        torch.set_num_threads(int(request["threads"]))
    config = transformers.AutoConfig.from_pretrained(request["model"])
    arch = (getattr(config, "architectures", None) or ["AutoModelForCausalLM"])[0]
    cls = getattr(transformers, arch, None) or transformers.AutoModelForCausalLM
    dtype = request.get("dtype") or "auto"
    dtype = (
        dtype
        if dtype == "auto"
        else getattr(torch, {"half": "float16", "float": "float32"}.get(dtype, dtype))
    )
    model = cls.from_pretrained(request["model"], dtype=dtype).to(request.get("device") or "cpu").eval()
    loaded = time.monotonic()
    scored = []
    k = int(request["top"])
    for ids, served in zip(request["prompts"], request["served"], strict=True):
        # Teacher forcing: the prompt and every served token in one pass; the logits at position i predict token
        # i + 1, so the served tokens are scored by the positions from the prompt's last one on.
        whole = torch.tensor([list(ids) + list(served)], device=model.device)
        with torch.inference_mode():
            logits = model(input_ids=whole, attention_mask=torch.ones_like(whole)).logits[0]
        steps = torch.log_softmax(logits[len(ids) - 1 : len(ids) - 1 + len(served)].float(), dim=-1)
        values, indices = steps.topk(k, dim=-1)
        mine = steps.gather(1, torch.tensor(served, device=model.device, dtype=torch.long).view(-1, 1)).view(
            -1
        )
        scored.append(
            {
                "logprob": [float(v) for v in mine.tolist()],
                "top": [
                    [[int(i), float(v)] for i, v in zip(row_i, row_v, strict=True)]
                    for row_i, row_v in zip(indices.tolist(), values.tolist(), strict=True)
                ],
            }
        )
    tokenizer = transformers.AutoTokenizer.from_pretrained(request.get("tokenizer") or request["model"])
    ids = set(request.get("pieces_of") or [])
    ids.update(t for served in request["served"] for t in served)
    ids.update(t for d in scored for step in d["top"] for t, _ in step)
    # Token by token as the tokenizer decodes a sequence (a word-level vocabulary joins its words with spaces).
    pieces = {str(t): tokenizer.decode([t]) for t in sorted(ids)}
    return {
        "pieces": pieces,
        "scored": scored,
        "class": cls.__name__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "load_s": round(loaded - start, 1),
        "score_s": round(time.monotonic() - loaded, 1),
    }


if __name__ == "__main__":
    try:
        answer = main(ast.literal_eval(sys.argv[1]))
    except Exception as exc:  # the host reads the marker line: the error travels in it
        answer = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    print(MARKER + json.dumps(answer), flush=True)
