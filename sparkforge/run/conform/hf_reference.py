"""The reference decode conform compares vLLM with, run INSIDE the served image (its own transformers and torch,
the same weights): Hugging Face transformers' greedy `generate`, top-K logprobs of the raw logits per position.

It is never imported on the host (torch and transformers are the image's): `reference.py` passes this file's
text to the image's python3 with one request (a Python literal of numbers, strings, lists and dicts the host
wrote: `ast.literal_eval` evaluates nothing else) and reads one marker line of JSON back.
Request: {"model": dir, "tokenizer": dir, "pieces_of": [ids the report may show], "dtype": "bfloat16"|"auto"|..., "device": "cpu"|"cuda", "top": K, "max_tokens": N, "threads": T (0: torch's default),
          "prompts": [[token ids], ...]} (the served tokenizer's ids: both sides decode the same input).
Answer:  {"decodes": [{"token_ids": [...], "top": [[[id, logprob], ...], ...]}], "pieces": {id: text},
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
    decodes = []
    k = int(request["top"])
    for ids in request["prompts"]:
        prompt = torch.tensor([ids], device=model.device)
        with torch.inference_mode():
            out = model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=int(request["max_tokens"]),
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
        new = out.sequences[0, prompt.shape[1] :].tolist()
        top = []
        for step in out.logits[: len(new)]:
            values, indices = torch.log_softmax(step[0].float(), dim=-1).topk(k)
            top.append([[int(i), float(v)] for i, v in zip(indices.tolist(), values.tolist(), strict=True)])
        decodes.append({"token_ids": new, "top": top})
    tokenizer = transformers.AutoTokenizer.from_pretrained(request.get("tokenizer") or request["model"])
    ids = set(request.get("pieces_of") or [])
    ids.update(t for d in decodes for t in d["token_ids"])
    ids.update(t for d in decodes for step in d["top"] for t, _ in step)
    # Token by token as the tokenizer decodes a sequence (a word-level vocabulary joins its words with spaces).
    pieces = {str(t): tokenizer.decode([t]) for t in sorted(ids)}
    return {
        "pieces": pieces,
        "decodes": decodes,
        "class": cls.__name__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "load_s": round(loaded - start, 1),
        "generate_s": round(time.monotonic() - loaded, 1),
    }


if __name__ == "__main__":
    try:
        answer = main(ast.literal_eval(sys.argv[1]))
    except Exception as exc:  # the host reads the marker line: the error travels in it
        answer = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    print(MARKER + json.dumps(answer), flush=True)
