"""A fault planted INSIDE the real vLLM's KV cache: past the first AFTER_BLOCKS blocks of each sequence, the
attention reads the wrong block back (every later block holds a copy of block AFTER_BLOCKS - 1, as a block-table or
paging bug would give). Prompts and answers that fit in those first blocks are untouched, so short probes pass;
everything later attends to stale keys and values.

Copied into a derived twin image (site-packages/sparkforge_kv_fault.py, loaded at every interpreter start by
sparkforge_kv_fault.pth), it waits for vLLM's CPU attention backend to be imported and wraps
`CPUAttentionBackendImpl.forward`: vLLM writes the step's keys and values into the cache first
(`do_kv_cache_update`), then `forward` reads the cache; the wrapper overwrites the later blocks between the two.
Only blocks a running sequence really uses are touched (its seq_len), never a padded or stale entry of the table.
Never imported on the host (it is used only in the image by tests/engine/test_conform_model_faults_real.py).
"""

import importlib.abc
import importlib.util
import os
import sys

TARGET = "vllm.v1.attention.backends.cpu_attn"
AFTER_BLOCKS = int(os.environ.get("SPARKFORGE_FAULT_KV_AFTER_BLOCKS", "1"))
# stale: a later block reads back a copy of block AFTER_BLOCKS - 1; noise: it reads back garbage of SCALE x that
# block's spread, the same garbage every step (seeded by the block's id)
MODE = os.environ.get("SPARKFORGE_FAULT_KV_MODE", "stale")
SCALE = float(os.environ.get("SPARKFORGE_FAULT_KV_SCALE", "1"))
SAID: list[int] = []


def stale_blocks(original, decoder):
    """`forward` with every used block past AFTER_BLOCKS of each sequence overwritten by block AFTER_BLOCKS - 1."""
    import torch

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        if os.environ.get("SPARKFORGE_FAULT_KV_DEBUG") and len(SAID) < 1 and attn_metadata is not None:
            print(
                "kvdebug",
                self.attn_type,
                decoder,
                tuple(kv_cache.shape),
                attn_metadata.seq_lens.tolist()[:4],
                tuple(attn_metadata.block_table.shape),
                attn_metadata.block_table[:2, :4].tolist(),
                file=sys.stderr,
            )
        if attn_metadata is not None and self.attn_type == decoder and kv_cache.numel():
            block_size = kv_cache.size()[2]
            seqs = attn_metadata.seq_lens.shape[0]
            table = attn_metadata.block_table[:seqs]
            used = (attn_metadata.seq_lens.to(torch.long) + block_size - 1) // block_size
            columns = torch.arange(table.shape[1], device=table.device)
            for row in range(seqs):
                later = table[row][(columns >= AFTER_BLOCKS) & (columns < used[row])]
                if later.numel():
                    last_good = kv_cache[table[row][AFTER_BLOCKS - 1].long()].clone()
                    if MODE == "noise":
                        spread = float(last_good.float().std()) * SCALE
                        for block in later.tolist():
                            seeded = torch.Generator().manual_seed(int(block))
                            garbage = torch.randn(last_good.shape, generator=seeded) * spread
                            kv_cache[block] = garbage.to(kv_cache.dtype)
                    else:
                        kv_cache[later.long()] = last_good
                    if not SAID:  # once per process: the fault really acts (the test's log shows it)
                        SAID.append(block_size)
                        print(
                            f"sparkforge planted fault: KV blocks {later.tolist()[:8]} of {block_size} "
                            f"tokens overwritten (seq_len {int(attn_metadata.seq_lens[row])})",
                            file=sys.stderr,
                        )
        return original(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)

    return forward


class _PlantOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # once: the real finders locate the module
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            impl = module.CPUAttentionBackendImpl
            if not hasattr(impl.forward, "planted"):  # the loader may run twice on one module
                impl.forward = stale_blocks(impl.forward, module.AttentionType.DECODER)
                impl.forward.planted = True
                print(
                    f"sparkforge planted fault: KV cache blocks past {AFTER_BLOCKS} read back stale",
                    file=sys.stderr,
                )

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Called by the .pth at interpreter start: cheap (no vLLM import until vLLM itself imports the backend)."""
    sys.meta_path.insert(0, _PlantOnImport())
