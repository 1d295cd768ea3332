"""Train a tiny Qwen3.5-MoE to count, with a local tokenizer, into a directory (run INSIDE the twin image).

The model answers right or wrong, not "some word": its task is the arithmetic progression modulo 100 on its own
number words ("0" .. "99"). Given two or more numbers it continues the progression (step = the last two's
difference, 1 .. 3 up, 1 down), in a plain prompt or as the assistant's reply in its chat template; the
continuation never ends (no end-of-turn), so any decode length has a known answer. Two chat turns end: given
tools, the assistant calls conform's `get_weather` in Qwen3's XML tool-call format; asked to think
(`enable_thinking`), it thinks one thought between <think> and </think> and answers (what vLLM's qwen3_coder tool
parser and qwen3 reasoning parser take apart, as the shipped Qwen3.5 profiles enable them). Nothing is downloaded:
transformers 5's own Qwen3_5Moe configuration scaled down (4 layers, gated-delta-net `linear_attention` and
`full_attention` alternating, 4 experts top-2, a 512-word vocabulary, a one-block vision tower with Qwen3-VL's
processor files so vLLM accepts an image, untrained), trained on the CPU from a fixed seed, saved as bf16
safetensors; greedy accuracy is measured on held-out prompts and written to `accuracy.json`. Head sizes are
the ones vLLM's CPU kernels accept (attention 64, gated-delta-net 128).
An MTP layer (`mtp.*`, what vLLM's Qwen3_5MoeMTP drafter loads) is added after training, UNTRAINED:
transformers' Qwen3_5Moe has no MTP module to train; greedy output must not depend on what a drafter proposes.
Usage (in the image): python3 tiny_trained_qwen35moe.py OUT_DIR [STEPS]
"""

import json
import os
import random
import sys
import time
from pathlib import Path

VOCAB = 512
MODULUS = 100
STEPS = (1, 2, 3, -1)
SEED = 0
SPECIALS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
NUMBERS = [str(i) for i in range(MODULUS)]  # ids 4 .. 103
WORDS = [
    "user",
    "assistant",
    "system",
    "count",
    ":",
    "?",
    "what",
    "is",
    "the",
    "next",
    "image",
    "answer",
    ".",
]
# Qwen3-VL's image/video markers (Qwen3VLProcessor reads them by name), ids 117 .. 120 of the vocabulary: vLLM
# expands <|image_pad|> to the image's tokens between <|vision_start|> and <|vision_end|>.
VISION = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Qwen3's thinking and XML tool-call markup as plain words (not special: vLLM's parsers read them in the text),
# and the one call the vehicle makes: conform's api row offers a `get_weather(city)` tool.
MARKUP = ["<think>", "</think>", "<tools>", "<tool_call>", "</tool_call>", "<function=get_weather>", "</function>",
          "<parameter=city>", "</parameter>", "paris"]  # fmt: skip
TOOL_CALL = ["<tool_call>", "<function=get_weather>", "<parameter=city>", "paris", "</parameter>", "</function>",
             "</tool_call>", "<|im_end|>"]  # fmt: skip
THOUGHT = ["count", ":", "1", "2", "3", "</think>", "answer", ":", "4", "<|im_end|>"]
# The vision block's input size: Qwen3.5's patch 16 merged 2x2 (32 pixels a token side); a few tokens per image
# here (Qwen3.5 itself asks 256x256 pixels at least), so vLLM's start-up profile of the largest image is cheap.
PIXELS = {"shortest_edge": 32 * 32, "longest_edge": 128 * 128}
# The test vehicle's own template: the assistant's turn opens with the user's (last) text, so a chat reply is
# the progression's continuation ("5 6 7" -> "8 9 10 11 ..."); an image part becomes Qwen3-VL's marker (vLLM
# passes it as {"type": "image"}) before the text; other turns are dropped. Given tools, the turn opens with
# <tools> alone (the reply is the tool call); with enable_thinking true, with <think> alone (the reply is the
# thought, </think>, the answer). Unlike Qwen3.5 it thinks only when asked: conform's api row always says.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(text='', images='') -%}"
    "{%- for m in messages if m['role'] == 'user' -%}"
    "{%- if m['content'] is string -%}{%- set ns.text = m['content'] -%}"
    "{%- else -%}{%- for p in m['content'] -%}"
    "{%- if p['type'] == 'text' -%}{%- set ns.text = p['text'] -%}"
    "{%- elif p['type'] in ('image', 'image_url') -%}"
    "{%- set ns.images = ns.images + '<|vision_start|><|image_pad|><|vision_end|> ' -%}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{%- endfor -%}"
    "<|im_start|> user <|im_end|> <|im_start|> assistant "
    "{%- if tools %} <tools>{%- elif enable_thinking is defined and enable_thinking %} <think>"
    "{%- else %} {{ ns.images }}{{ ns.text }}{%- endif -%}"
)
CHAT_PREFIX = ["<|im_start|>", "user", "<|im_end|>", "<|im_start|>", "assistant"]


def words() -> list[str]:
    listed = [*SPECIALS, *NUMBERS, *WORDS, *VISION, *MARKUP]
    return listed + [f"w{i}" for i in range(VOCAB - len(listed))]


def tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words())}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(SPECIALS + VISION)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    # Beside config.json, transformers 5 loads the model type's own tokenizer class (Qwen3_5Tokenizer: byte-level
    # BPE, digits split) instead of this word-level one; alone in a folder it loads as written. Profiles pass it
    # to vLLM with `tokenizer: /models/tokenizer`.
    fast.save_pretrained(out / "tokenizer")
    assert len(fast) == VOCAB, len(fast)
    processor(out, fast)


def processor(out: Path, fast) -> None:
    """Qwen3-VL's processor files (what vLLM's Qwen3_5Moe class loads to accept an image), sized to the block."""
    from transformers import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl import Qwen3VLProcessor, Qwen3VLVideoProcessor

    vision = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "size": PIXELS}
    made = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**vision),
        video_processor=Qwen3VLVideoProcessor(**vision),
        tokenizer=fast,
        chat_template=CHAT_TEMPLATE,
    )
    made.save_pretrained(out)
    assert made.image_token_id == words().index("<|image_pad|>"), made.image_token_id


def example(rng: random.Random, length: int) -> tuple[list[int], list[int]]:
    """One training sequence (token ids) and its loss mask: a progression, plain or after the chat prefix."""
    ids = {w: i for i, w in enumerate(words())}
    start, step = rng.randrange(MODULUS), rng.choice(STEPS)
    prefix = [ids[w] for w in CHAT_PREFIX] if rng.random() < 0.3 else []
    seq = [ids[str((start + k * step) % MODULUS)] for k in range(length - len(prefix))]
    # The first two numbers fix the step: nothing to predict before them.
    return prefix + seq, [0] * (len(prefix) + 2) + [1] * (len(seq) - 2)


def turn(opening: str, reply: list[str], length: int) -> tuple[list[int], list[int]]:
    """A chat turn that ends: the prefix and its opening word, the reply learnt, then padding (not learnt)."""
    ids = {w: i for i, w in enumerate(words())}
    prompt = [ids[w] for w in (*CHAT_PREFIX, opening)]
    answer = [ids[w] for w in reply]
    pad = length - len(prompt) - len(answer)
    return prompt + answer + [ids["<|endoftext|>"]] * pad, [0] * len(prompt) + [1] * len(answer) + [0] * pad


def mixed(rng: random.Random, length: int) -> tuple[list[int], list[int]]:
    """The training mix: mostly progressions, one in ten a tool call or a thought."""
    draw = rng.random()
    if draw < 0.05:
        return turn("<tools>", TOOL_CALL, length)
    if draw < 0.10:
        return turn("<think>", THOUGHT, length)
    return example(rng, length)


def config(torch):
    from transformers import Qwen3_5MoeConfig

    text = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        # Both kinds in each half: with pipeline parallel 2 every stage holds one of each (vLLM 0.32 refuses
        # stages that disagree on KV cache layouts, as a stage of gated-delta-net layers only would).
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "max_position_embeddings": 16384,
        "eos_token_id": 3,
        "pad_token_id": 1,
        "bos_token_id": 1,
        "tie_word_embeddings": False,
        "mtp_num_hidden_layers": 1,
    }
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "out_hidden_size": 64, "intermediate_size": 64,
              "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}  # fmt: skip
    marks = {f"{k}_token_id": words().index(f"<|{v}|>") for k, v in
             (("image", "image_pad"), ("video", "video_pad"), ("vision_start", "vision_start"), ("vision_end", "vision_end"))}  # fmt: skip
    return Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **marks)


def train(net, torch, steps: int, rng: random.Random) -> list[float]:
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    losses = []
    for _ in range(steps):
        batch = [mixed(rng, 64) for _ in range(8)]
        ids = torch.tensor([b[0] for b in batch])
        labels = ids.clone()
        labels[torch.tensor([b[1] for b in batch]) == 0] = -100
        loss = net(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    return losses


def accuracy(net, torch, rng: random.Random, prompts: int = 8, tokens: int = 125) -> dict:
    """Greedy accuracy over held-out prompts (plain and chat): tokens right / tokens generated."""
    right = total = 0
    net.eval()
    with torch.no_grad():
        for _n in range(prompts):
            seq, mask = example(rng, 40)
            prompt = seq[: mask.index(1)]
            out = net.generate(
                input_ids=torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False, pad_token_id=1
            )[0, len(prompt) :].tolist()
            nums = [int(words()[i]) for i in prompt if 4 <= i < 4 + MODULUS]  # plain, or inside the template
            start, step = nums[-1], (nums[-1] - nums[-2]) % MODULUS
            want = [4 + (start + (k + 1) * step) % MODULUS for k in range(tokens)]
            right += sum(a == b for a, b in zip(out, want, strict=False))
            total += tokens
    return {"right": right, "tokens": total, "accuracy": right / total}


def turns_exact(net, torch) -> dict:
    """Greedy replies of the two turns that end (tool call, thought), word for word."""
    exact = {}
    with torch.no_grad():
        for name, opening, reply in (("tool_call", "<tools>", TOOL_CALL), ("thought", "<think>", THOUGHT)):
            prompt = turn(opening, reply, len(CHAT_PREFIX) + 1 + len(reply))[0][: len(CHAT_PREFIX) + 1]
            got = net.generate(
                input_ids=torch.tensor([prompt]),
                max_new_tokens=len(reply) + 4,
                do_sample=False,
                pad_token_id=1,
            )[0, len(prompt) :].tolist()
            exact[name] = [words()[i] for i in got] == reply
    return exact


def mtp_layer(out: Path, torch) -> None:
    """Qwen3.5's multi-token-prediction layer beside the weights, untrained: fc joins the normed embedding of the
    next token and the normed hidden state (identity on the hidden half), one full-attention MoE decoder layer
    (a copy of layer 1, the same kind), the final norm; vLLM's main model skips `mtp.*`, its drafter loads it."""
    from safetensors.torch import load_file, save_file

    weights = load_file(out / "model.safetensors")
    source = "model.language_model.layers.1."
    mtp = {f"mtp.layers.0.{k[len(source) :]}": v.clone() for k, v in weights.items() if k.startswith(source)}
    hidden = weights["model.language_model.norm.weight"]
    size = hidden.shape[0]
    mtp["mtp.fc.weight"] = torch.cat([torch.zeros(size, size), torch.eye(size)], dim=1).to(hidden.dtype)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{norm}.weight"] = hidden.clone()
    save_file({**weights, **mtp}, out / "model.safetensors", metadata={"format": "pt"})


def model(out: Path, steps: int) -> dict:
    import torch
    from transformers import Qwen3_5MoeForConditionalGeneration

    torch.manual_seed(SEED)
    torch.set_num_threads(int(os.environ.get("TINY_THREADS", "1")))
    rng = random.Random(SEED)
    net = Qwen3_5MoeForConditionalGeneration(config(torch))
    start = time.monotonic()
    losses = train(net, torch, steps, rng)
    trained_s = time.monotonic() - start
    net = net.to(torch.bfloat16)
    measured = accuracy(net, torch, random.Random(SEED + 1))
    turns = turns_exact(net, torch)
    net.config.dtype = torch.bfloat16
    net.save_pretrained(out, safe_serialization=True)
    mtp_layer(out, torch)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 3, "pad_token_id": 1}) + "\n")
    facts = {
        "task": f"arithmetic progression mod {MODULUS}, steps {list(STEPS)}",
        "seed": SEED,
        "steps": steps,
        "train_s": round(trained_s, 1),
        "final_loss": round(sum(losses[-20:]) / 20, 5),
        "greedy_bf16_transformers": measured,
        "turns_exact_bf16": turns,
        "parameters": sum(p.numel() for p in net.parameters()),
    }
    (out / "accuracy.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    tokenizer(target)
    facts = model(target, int(sys.argv[2]) if len(sys.argv) > 2 else 400)
    print(json.dumps({"dir": str(target), **facts, "files": sorted(p.name for p in target.iterdir())}))
