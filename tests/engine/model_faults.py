"""Faults planted INSIDE the model: a faulty copy of a checkpoint folder for the served side only (conform's
`reference` row reads the clean folder through --reference-model-dir), made on the host by editing the
safetensors file's bytes and config.json (the tiny model is bf16 throughout).

- `lm_head x0.5`: the output layer at half scale. The greedy tokens do not change on this model (its margins are
  wide): only logprob values show it.
- `experts x0.5`: every routed expert's output at half scale (each expert's down_proj).
- `routing swapped`: experts 0 and 1 swapped in every router (mlp.gate rows 0 and 1).
- `rope_theta x100`: the RoPE base of the served config a hundred times the checkpoint's.
- `chat template`: the served chat template writes another role tag, the weights untouched (the tokens a chat
  request reaches the model with are not the ones it learnt).
- `tokenizer swapped`: the served tokenizer maps the words "3" and "7" to each other's ids (a tokenizer file from
  another revision of the vocabulary), the weights and template untouched.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import sys
from array import array
from pathlib import Path

FAULTS = (
    "lm_head x0.5",
    "experts x0.5",
    "routing swapped",
    "rope_theta x100",
    "chat template",
    "tokenizer swapped",
)
WEIGHTS = "model.safetensors"


def _halve_bf16(raw: bytes) -> bytes:
    """Every bf16 value at half scale: its exponent one lower (zeros and subnormals flushed to a signed zero)."""
    values = array("H", raw)
    if sys.byteorder != "little":
        values.byteswap()
    for i, v in enumerate(values):
        exponent = (v >> 7) & 0xFF
        values[i] = v - 0x80 if 1 < exponent < 0xFF else (v & 0x8000 if exponent <= 1 else v)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tobytes()


def _swap_rows_01(raw: bytes, shape: list[int]) -> bytes:
    row = (len(raw) // shape[0]) if shape else 0
    return raw[row : 2 * row] + raw[:row] + raw[2 * row :]


def _edit_weights(path: Path, fault: str) -> int:
    """Rewrite the safetensors file in place; the number of tensors changed."""
    data = path.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + size])
    body = bytearray(data[8 + size :])
    changed = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        hit = (
            (fault == "lm_head x0.5" and name == "lm_head.weight")
            or (fault == "experts x0.5" and re.search(r"\.mlp\.experts\.\d+\.down_proj\.weight$", name))
            or (fault == "routing swapped" and name.endswith(".mlp.gate.weight"))
        )
        if not hit:
            continue
        assert info["dtype"] == "BF16", f"{name}: {info['dtype']} (the planter edits bf16 only)"
        raw = bytes(body[start:end])
        body[start:end] = (
            _halve_bf16(raw) if fault != "routing swapped" else _swap_rows_01(raw, info["shape"])
        )
        changed += 1
    path.write_bytes(data[: 8 + size] + bytes(body))
    return changed


def plant(clean: Path, out: Path, fault: str) -> Path:
    """A copy of `clean` in `out` with `fault` planted (the clean folder untouched)."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(clean, out)
    if fault == "rope_theta x100":
        config = json.loads((out / "config.json").read_text())
        rope = config.get("text_config", config)["rope_parameters"]
        rope["rope_theta"] = float(rope["rope_theta"]) * 100
        (out / "config.json").write_text(json.dumps(config, indent=2))
    elif fault == "chat template":
        templates = [
            p for p in (out / "chat_template.jinja", out / "tokenizer" / "chat_template.jinja") if p.is_file()
        ]
        assert templates, f"no chat_template.jinja in {clean}"
        for template in templates:
            text = template.read_text()
            assert "<|im_start|>" in text, template
            template.write_text(text.replace("<|im_start|>", "<|im_start|>x"))
    elif fault == "tokenizer swapped":
        tokenizers = [
            p for p in (out / "tokenizer.json", out / "tokenizer" / "tokenizer.json") if p.is_file()
        ]
        assert tokenizers, f"no tokenizer.json in {clean}"
        for path in tokenizers:
            doc = json.loads(path.read_text())
            vocab = doc["model"]["vocab"]
            vocab["3"], vocab["7"] = vocab["7"], vocab["3"]
            path.write_text(json.dumps(doc))
    else:
        assert _edit_weights(out / WEIGHTS, fault) > 0, f"{fault}: no tensor matched in {clean}"
    return out
