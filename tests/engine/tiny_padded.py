"""The tiny trained Qwen3.5-MoE with two more decoder layers in front that compute nothing: a gated-delta-net
and a full-attention layer whose output projections are zero, so the residual stream passes through them
unchanged (linear attention's out_proj, attention's o_proj, every expert's and the shared expert's down_proj are
zero: each branch adds exactly 0 in bf16). The padded model gives the same tokens as the trained one, and its six
layers (L F L F L F) split over three pipeline stages as 2/2/2 (vLLM's get_pp_indices) with both kinds in every
stage, which the four-layer model (L F L F, split 1/2/1) cannot: vLLM fails a hybrid stage lacking a kind
(sparkforge/run/cluster/parallel.py `stage_without_attention`). So three nodes serve the trained model's real
layers, the middle node receiving and sending the intermediate tensors, and the known answer stays the check.

Pure Python: safetensors is an 8-byte header length, a JSON header of names, dtypes, shapes and offsets, then the
bytes; tensors are copied byte for byte, the new layer's zeroed ones are zero bytes (bf16 0.0 is 0x0000).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

LAYERS = "model.language_model.layers."
# The new layers 0 and 1 copy these layers (a gated-delta-net one, a full-attention one) with their output
# projections zeroed.
TEMPLATES = (0, 1)
ZEROED = ("linear_attn.out_proj.weight", "self_attn.o_proj.weight", "down_proj.weight")


def read(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + size]), raw[8 + size :]


def write(path: Path, tensors: dict[str, tuple[str, list[int], bytes]], metadata: dict) -> None:
    header: dict = {"__metadata__": metadata} if metadata else {}
    blobs, offset = [], 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def renumbered(name: str) -> str:
    if not name.startswith(LAYERS):
        return name
    index, rest = name[len(LAYERS) :].split(".", 1)
    return f"{LAYERS}{int(index) + len(TEMPLATES)}.{rest}"


def pad(model: Path, out: Path) -> Path:
    """Write the padded model into `out` (the tokenizer and other files copied as they are)."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(model, out)
    config = json.loads((model / "config.json").read_text())
    text = config["text_config"]
    kinds = text["layer_types"]
    assert [kinds[t] for t in TEMPLATES] == ["linear_attention", "full_attention"], kinds
    text["layer_types"] = [kinds[t] for t in TEMPLATES] + kinds
    text["num_hidden_layers"] += len(TEMPLATES)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    header, body = read(model / "model.safetensors")
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, entry in header.items():
        start, end = entry["data_offsets"]
        data = body[start:end]
        tensors[renumbered(name)] = (entry["dtype"], entry["shape"], data)
        for new, template in enumerate(TEMPLATES):
            prefix = f"{LAYERS}{template}."
            if name.startswith(prefix):
                rest = name[len(prefix) :]
                zero = rest.endswith(ZEROED)
                tensors[f"{LAYERS}{new}.{rest}"] = (
                    entry["dtype"],
                    entry["shape"],
                    bytes(len(data)) if zero else data,
                )
    write(out / "model.safetensors", tensors, metadata)
    (out / "SHA256SUMS").unlink(missing_ok=True)  # the committed fixture's sums name the unpadded files
    return out
