"""Train a tiny Qwen3.5-MoE to count and to answer conform's known-answer probes, with a local tokenizer, and distil
its MTP drafter, into a directory (run INSIDE the twin image).

The model answers right or wrong, not "some word". Its first task is the arithmetic progression modulo 100 on its
own number words ("0" .. "99"). Given two or more numbers it continues the progression (step = the last two's
difference, 1 .. 3 up, 1 down), in a plain prompt or as the assistant's reply in its chat template; the
continuation never ends (no end-of-turn), so any decode length has a known answer. Chat turns that end: the
known-answers row's own probe set (sparkforge/run/conform/probes.py, seed 0, 120 probes: arithmetic, copying,
long-range recall, counting, ordering, format), each answer followed by <|im_end|>, learnt by heart as the
progression is (the row then checks that the served path gives them back); given tools, the assistant calls
conform's `get_weather` in Qwen3's XML tool-call format; asked to think (`enable_thinking`), it thinks one thought
between <think> and </think> and answers (what vLLM's qwen3_coder tool parser and qwen3 reasoning parser take
apart, as the shipped Qwen3.5 profiles enable them). Nothing is downloaded: transformers 5's own Qwen3_5Moe
configuration scaled down (4 layers, gated-delta-net `linear_attention` and `full_attention` alternating, 4
experts top-2, a 512-word vocabulary: the vehicle's words, then the probes', a one-block vision tower with
Qwen3-VL's processor files so vLLM accepts an image, untrained), trained on the CPU from a fixed seed, saved as
bf16 safetensors; greedy accuracy (the progression, both turns, the 120 known answers) is measured in bf16 on
the model's own outputs and written to `accuracy.json`. Head sizes are the ones vLLM's CPU kernels accept
(attention 64, gated-delta-net 128).
Then the MTP layer (`mtp.*`, what vLLM's Qwen3_5MoeMTP drafter loads: pre_fc_norm_embedding, pre_fc_norm_hidden,
fc, one full-attention MoE decoder layer, norm; embed_tokens and lm_head are the model's) is DISTILLED with the
model frozen: at position t it takes the model's hidden state at t (after the final norm) and the embedding of
token t+1 and learns the model's greedy token t+2, as vLLM's proposer feeds it; how often its token agrees with
the model's is written beside the rest (vLLM accepts a draft exactly then, greedy, one speculative token).
Usage (in the image, probes.py at ../../sparkforge/run/conform/ from this file, as in the repository):
  [TINY_THREADS=2] python3 tiny_trained_qwen35moe.py OUT_DIR STEPS MTP_STEPS
"""

import copy
import functools
import importlib.util
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


# conform's known-answer probes (sparkforge/run/conform/probes.py, standard library only): the fixture mounts the
# file at the same place relative to this one as in the repository (/opt/tests/engine/ and /opt/sparkforge/...).
PROBES_FILE = Path(__file__).resolve().parents[2] / "sparkforge" / "run" / "conform" / "probes.py"
PROBE_SEED, PROBE_COUNT = 0, 120  # the known-answers row's default set (seed 0, 120 probes)
# The probes' share of the training mix (benchmarks/conform.md, "Known answers": 0.5 fell short at 1,500 steps).
PROBE_SHARE = 0.6
LONG = 4096  # conform's long decode (the tiny profiles' long_decode.tokens)
SEQ = 104  # the longest probe of the set (a recall, 80 words) in the chat template, its answer, the end


@functools.cache
def probes():
    """probes.py as a module, loaded from its file (no folder on sys.path: the repository's
    sparkforge/run/conform/kernels.py would shadow the `kernels` package transformers looks for)."""
    spec = importlib.util.spec_from_file_location("conform_probes", PROBES_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@functools.cache
def words() -> list[str]:
    """The vocabulary: the vehicle's own words, then the probes' words not already listed (the earlier ids stay)."""
    listed = [*SPECIALS, *NUMBERS, *WORDS, *VISION, *MARKUP]
    listed += [w for w in dict.fromkeys(probes().WORDS) if w not in listed]
    return listed + [f"w{i}" for i in range(VOCAB - len(listed))]


@functools.cache
def probe_set() -> list:
    return probes().probe_set(PROBE_SEED, PROBE_COUNT)


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


def probe_turn(item, length: int) -> tuple[list[int], list[int]]:
    """A known-answer probe as conform asks it: the chat template, the answer learnt, the end of the turn."""
    ids = {w: i for i, w in enumerate(words())}
    prompt = [ids[w] for w in (*CHAT_PREFIX, *item.prompt.split())]
    answer = [ids[w] for w in (*item.answer.split(), "<|im_end|>")]
    pad = length - len(prompt) - len(answer)
    return prompt + answer + [ids["<|endoftext|>"]] * pad, [0] * len(prompt) + [1] * len(answer) + [0] * pad


def mixed(rng: random.Random, length: int) -> tuple[list[int], list[int]]:
    """The training mix: the known-answers row's own probes (PROBE_SHARE), a tool call and a thought (4 % each),
    progressions the rest."""
    draw = rng.random()
    if draw < PROBE_SHARE:
        return probe_turn(rng.choice(probe_set()), length)
    if draw < PROBE_SHARE + 0.04:
        return turn("<tools>", TOOL_CALL, length)
    if draw < PROBE_SHARE + 0.08:
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
        batch = [mixed(rng, SEQ) for _ in range(8)]
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


def known_answers(net, torch) -> dict:
    """Greedy replies to the known-answers row's own set (seed 0, 120), judged by the row's rule, per kind."""
    right: dict[str, list[int]] = {}
    with torch.no_grad():
        for item in probe_set():
            prompt = probe_turn(item, SEQ)[0][: len(CHAT_PREFIX) + len(item.prompt.split())]
            got = net.generate(input_ids=torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                               pad_token_id=1, eos_token_id=3)[0, len(prompt):].tolist()  # fmt: skip
            right.setdefault(item.kind, []).append(
                int(item.judge(" ".join(words()[i] for i in got if i != 3)))
            )
    total = sum(map(sum, right.values()))
    return {
        "right": total,
        "probes": len(probe_set()),
        "by_kind": {k: f"{sum(v)}/{len(v)}" for k, v in right.items()},
    }


def mtp_block(net, torch):
    """Qwen3.5's multi-token-prediction layer as vLLM's Qwen3_5MoeMTP drafter builds it (vllm/model_executor/models/
    qwen3_5_mtp.py): norms of the next token's embedding and of the main model's hidden state, fc joining them,
    one full-attention MoE decoder layer (here a copy of layer 1, the same kind, as its start), the final norm;
    embed_tokens and lm_head are the main model's."""
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeRMSNorm

    text = net.model.language_model
    size, eps = net.config.text_config.hidden_size, net.config.text_config.rms_norm_eps
    block = torch.nn.Module()
    block.pre_fc_norm_embedding = Qwen3_5MoeRMSNorm(size, eps=eps)
    block.pre_fc_norm_hidden = Qwen3_5MoeRMSNorm(size, eps=eps)
    block.fc = torch.nn.Linear(2 * size, size, bias=False)
    with torch.no_grad():  # the hidden half starts as the identity
        block.fc.weight[:, size:] = torch.eye(size)
        block.fc.weight[:, :size] *= 0.1
    block.layers = torch.nn.ModuleList([copy.deepcopy(text.layers[1])])
    block.norm = copy.deepcopy(text.norm)
    for p in block.parameters():
        p.requires_grad_(True)
    return block


def mtp_logits(net, block, torch, ids):
    """The drafter's logits for positions 0 .. L-2, fed as vLLM feeds it (spec_decode/llm_base_proposer.py): at
    position t the main model's hidden state at t (after its final norm: Qwen3NextModel.forward) and the embedding
    of token t+1, the position t for RoPE, causal attention over the earlier positions; it predicts token t+2.
    Also the main model's own greedy tokens (its logits at t+1), the targets."""
    text = net.model.language_model
    with torch.no_grad():
        hidden = text(input_ids=ids).last_hidden_state
        greedy = net.lm_head(hidden).argmax(-1)
    batch, length = ids.shape[0], ids.shape[1] - 1
    embedded = block.pre_fc_norm_embedding(text.embed_tokens(ids[:, 1:]))
    x = block.fc(torch.cat([embedded, block.pre_fc_norm_hidden(hidden[:, :-1])], dim=-1))
    positions = torch.arange(length).view(1, 1, -1).expand(3, batch, -1)
    causal = torch.full((length, length), float("-inf")).triu(1).to(x.dtype).view(1, 1, length, length)
    for layer in block.layers:
        x = layer(x, position_embeddings=text.rotary_emb(x, positions), attention_mask=causal,
                  position_ids=positions[0])  # fmt: skip
    return net.lm_head(block.norm(x)), greedy[:, 1:]


def train_mtp(net, torch, steps: int, rng: random.Random) -> tuple:
    """Distil the drafter from the frozen main model: on the training mix, at every position whose token t+2 is
    learnt (the answers), the drafter's logits are trained toward the main model's greedy token t+2."""
    for p in net.parameters():
        p.requires_grad_(False)
    block = mtp_block(net, torch)
    opt = torch.optim.AdamW(block.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    losses = []
    for _ in range(steps):
        batch = [mixed(rng, SEQ) for _ in range(8)]
        logits, target = mtp_logits(net, block, torch, torch.tensor([b[0] for b in batch]))
        learnt = torch.tensor([b[1] for b in batch])[:, 2:] == 1  # token t+2 learnt, t = 0 .. L-3
        loss = torch.nn.functional.cross_entropy(logits[:, :-1][learnt], target[:, :-1][learnt])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    return block, losses


def mtp_agreement(net, block, torch, rng: random.Random) -> dict:
    """How often the drafter's token t+2 is the main model's greedy one (what vLLM accepts with one speculative
    token), over the main model's own greedy replies: the known-answer probes and held-out progressions."""
    agreed = total = 0
    with torch.no_grad():
        prompts = [
            probe_turn(item, SEQ)[0][: len(CHAT_PREFIX) + len(item.prompt.split())] for item in probe_set()
        ]
        prompts += [seq[: mask.index(1)] for seq, mask in (example(rng, 40) for _ in range(8))]
        for prompt in prompts:
            full = net.generate(input_ids=torch.tensor([prompt]), max_new_tokens=48, do_sample=False,
                                pad_token_id=1, eos_token_id=3)  # fmt: skip
            logits, _ = mtp_logits(net, block, torch, full)
            # The first draft: the prompt's last hidden state and the first reply token.
            first = len(prompt) - 1
            drafted, wanted = logits[0, first:-1].argmax(-1), full[0, first + 2 :]
            agreed += int((drafted == wanted).sum())
            total += len(wanted)
        # conform's long decode: 4,096 tokens of a progression, far past the training sequences' 104 positions
        ids = {w: i for i, w in enumerate(words())}
        long = torch.tensor([[ids[str((3 + k) % MODULUS)] for k in range(LONG)]])
        logits, _ = mtp_logits(net, block, torch, long)
        far = float((logits[0, :-1].argmax(-1) == long[0, 2:]).float().mean())
    return {"agreed": agreed, "drafts": total, "rate": round(agreed / max(total, 1), 4),
            f"long_{LONG}_rate": round(far, 4)}  # fmt: skip


def mtp_weights(out: Path, net, block, torch) -> None:
    """The drafter's weights under `mtp.*` beside the model's (vLLM's main model skips them, its drafter loads
    them): the decoder layer in the checkpoint's own format (saved through the model, in layer 1's place)."""
    from safetensors.torch import load_file, save_file

    text = net.model.language_model
    text.layers[1], block.layers[0] = block.layers[0], text.layers[1]
    staging = out / ".mtp"
    try:
        net.save_pretrained(staging, safe_serialization=True)
        source = "model.language_model.layers.1."
        layer = {f"mtp.layers.0.{k[len(source) :]}": v for k, v in load_file(staging / "model.safetensors").items()
                 if k.startswith(source)}  # fmt: skip
    finally:
        text.layers[1], block.layers[0] = block.layers[0], text.layers[1]
        for f in staging.glob("*"):
            f.unlink()
        staging.rmdir()
    dtype = net.lm_head.weight.dtype
    named = {f"mtp.{k}": v.detach().to(dtype).contiguous() for k, v in block.state_dict().items()
             if not k.startswith("layers.")}  # fmt: skip
    weights = load_file(out / "model.safetensors")
    save_file({**weights, **layer, **named}, out / "model.safetensors", metadata={"format": "pt"})


def model(out: Path, steps: int, mtp_steps: int) -> dict:
    import torch
    from transformers import Qwen3_5MoeForConditionalGeneration

    torch.manual_seed(SEED)
    torch.set_num_threads(int(os.environ.get("TINY_THREADS", "2")))
    rng = random.Random(SEED)
    net = Qwen3_5MoeForConditionalGeneration(config(torch))
    start = time.monotonic()
    losses = train(net, torch, steps, rng)
    trained_s = time.monotonic() - start
    start = time.monotonic()
    block, mtp_losses = train_mtp(net, torch, mtp_steps, rng)
    mtp_s = time.monotonic() - start
    net, block = net.to(torch.bfloat16).eval(), block.to(torch.bfloat16).eval()
    measured = accuracy(net, torch, random.Random(SEED + 1))
    turns = turns_exact(net, torch)
    known = known_answers(net, torch)
    agreement = mtp_agreement(net, block, torch, random.Random(SEED + 2))
    net.config.dtype = torch.bfloat16
    net.save_pretrained(out, safe_serialization=True)
    mtp_weights(out, net, block, torch)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 3, "pad_token_id": 1}) + "\n")
    facts = {
        "task": f"arithmetic progression mod {MODULUS}, steps {list(STEPS)}; known-answer probes seed "
        f"{PROBE_SEED}, {PROBE_COUNT}; a tool call; a thought",
        "seed": SEED,
        "steps": steps,
        "mtp_steps": mtp_steps,
        "threads": torch.get_num_threads(),
        "train_s": round(trained_s, 1),
        "mtp_train_s": round(mtp_s, 1),
        "final_loss": round(sum(losses[-20:]) / 20, 5),
        "mtp_final_loss": round(sum(mtp_losses[-20:]) / 20, 5),
        "greedy_bf16_transformers": measured,
        "turns_exact_bf16": turns,
        "known_answers_bf16": known,
        "mtp_agreement_bf16": agreement,
        "parameters": sum(p.numel() for p in net.parameters()),
    }
    (out / "accuracy.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    tokenizer(target)
    facts = model(target, *(int(a) for a in sys.argv[2:4]))
    print(json.dumps({"dir": str(target), **facts, "files": sorted(p.name for p in target.iterdir())}))
