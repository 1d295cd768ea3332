"""Write a tiny random-weight Qwen3.5-MoE checkpoint and a local tokenizer into a directory (run INSIDE the image).

Nothing is downloaded: transformers 5's own Qwen3_5Moe configuration scaled down (4 layers, gated-delta-net
`linear_attention` and `full_attention` alternating, 4 experts top-2, a 512-word vocabulary, a one-block vision tower),
weights drawn from a fixed seed, saved as safetensors; a word-level tokenizer built with the `tokenizers` library
from a few sentences plus filler words up to exactly the model's vocabulary (every id decodes to a word), with a
chat template. Head sizes are the ones vLLM's CPU kernels accept (attention 64, gated-delta-net 128).
Usage (in the image): python3 tiny_qwen35moe.py OUT_DIR
"""

import json
import sys
from pathlib import Path

VOCAB = 512
SPECIALS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SENTENCES = [
    "what is two plus two ? the answer is four .",
    "the quick brown fox jumps over the lazy dog .",
    "a spark is a small computer with one gpu and unified memory .",
    "user assistant system hello world you are a helpful model",
    "zero one two three four five six seven eight nine ten",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(SPECIALS)
    for word in " ".join(SENTENCES).split():
        if word not in words:
            words.append(word)
    words += [f"w{i}" for i in range(VOCAB - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    assert len(fast) == VOCAB, len(fast)


def model(out: Path) -> int:
    import torch
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    torch.manual_seed(0)
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
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "max_position_embeddings": 4096,
        "eos_token_id": 3,
        "pad_token_id": 1,
        "bos_token_id": 1,
        "tie_word_embeddings": False,
    }
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "out_hidden_size": 64, "intermediate_size": 64}
    config = Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
    config.dtype = torch.bfloat16
    net = Qwen3_5MoeForConditionalGeneration(config).to(torch.bfloat16)
    net.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 3, "pad_token_id": 1}) + "\n")
    return sum(p.numel() for p in net.parameters())


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    tokenizer(target)
    params = model(target)
    print(
        json.dumps(
            {"dir": str(target), "parameters": params, "files": sorted(p.name for p in target.iterdir())}
        )
    )
