"""Do two trained tiny models give the same answers? Run INSIDE the twin image (torch, transformers), beside
tiny_trained_qwen35moe.py (whose prompts it asks: conform's 120 known-answer probes, 8 held-out progressions of
40 tokens, the tool-call and thinking turns), greedy in bf16 as the trainer measures.

  python3 tiny_model_compare.py MODEL_A MODEL_B      # prints one JSON object: same, total, differences
"""

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_trained_qwen35moe as maker


def prompts() -> list[tuple[str, list[int], int]]:
    """(name, prompt ids, tokens to generate): the known-answer probes, progressions and the two turns."""
    asked = []
    for index, item in enumerate(maker.probe_set()):
        ids = maker.probe_turn(item, maker.SEQ)[0][: len(maker.CHAT_PREFIX) + len(item.prompt.split())]
        asked.append((f"probe {index} ({item.kind})", ids, 24))
    rng = random.Random(maker.SEED + 1)
    for index in range(8):
        seq, mask = maker.example(rng, 40)
        asked.append((f"progression {index}", seq[: mask.index(1)], 64))
    for opening, reply in (("<tools>", maker.TOOL_CALL), ("<think>", maker.THOUGHT)):
        ids = maker.turn(opening, reply, len(maker.CHAT_PREFIX) + 1 + len(reply))[0][
            : len(maker.CHAT_PREFIX) + 1
        ]
        asked.append((f"turn {opening}", ids, len(reply) + 4))
    return asked


def answers(folder: str, torch, asked) -> list[list[int]]:
    from transformers import Qwen3_5MoeForConditionalGeneration

    net = Qwen3_5MoeForConditionalGeneration.from_pretrained(folder, dtype=torch.bfloat16).eval()
    out = []
    with torch.no_grad():
        for _, ids, tokens in asked:
            got = net.generate(input_ids=torch.tensor([ids]), max_new_tokens=tokens, do_sample=False,
                               pad_token_id=1, eos_token_id=3)[0, len(ids):].tolist()  # fmt: skip
            out.append(got)
    return out


def main() -> None:
    import torch

    torch.set_num_threads(2)
    asked = prompts()
    first, second = answers(sys.argv[1], torch, asked), answers(sys.argv[2], torch, asked)
    words = maker.words()
    differences = [
        {"prompt": name, "a": " ".join(words[i] for i in a), "b": " ".join(words[i] for i in b)}
        for (name, _, _), a, b in zip(asked, first, second, strict=True)
        if a != b
    ]
    print(
        json.dumps(
            {"same": len(asked) - len(differences), "total": len(asked), "differences": differences[:10]}
        )
    )


if __name__ == "__main__":
    main()
