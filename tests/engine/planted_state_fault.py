"""A fault planted INSIDE the real vLLM's cache of a hybrid model: the linear-attention (Gated DeltaNet) layers'
recurrent state is lost at every EVERY-token boundary of a sequence (the state a step starts from is zeroed when
the step crosses a boundary), as a hybrid cache that fails to carry the state into a sequence's next block would.
Prompts and answers shorter than EVERY tokens are untouched, so short probes pass; everything later is computed
from a state that forgot the text before the boundary.

Copied into a derived twin image (site-packages/sparkforge_state_fault.py, loaded at every interpreter start by
sparkforge_state_fault.pth), it waits for vLLM's CPU GDN op module to be imported and wraps its
`_cpu_gdn_attention_nonspec` (looked up by name when the op runs). The sequences' lengths come from the
full-attention layers' metadata of the same batch (the GDN metadata has none); the state slots from the GDN's.
Never imported on the host (it is used only in the image by tests/engine/test_conform_state_fault_real.py).
"""

import os
import sys

TARGET = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"
EVERY = int(os.environ.get("SPARKFORGE_FAULT_STATE_EVERY", "384"))
SAID: list[int] = []


def crosses(first: int, end: int) -> bool:
    """Whether positions first..end-1 hold a boundary k x EVERY with k >= 1 that the state must be carried over."""
    return end > first and (end - 1) // EVERY > max(first - 1, 0) // EVERY


def state_lost(original):
    """`_cpu_gdn_attention_nonspec` with the recurrent and conv state of a step that crosses a boundary zeroed."""
    from vllm.forward_context import get_forward_context

    def nonspec(layer, meta, mixed_qkv, b, a, core_attn_out, *args, **kwargs):
        metadata = get_forward_context().attn_metadata or {}
        lens = next((m.seq_lens for m in metadata.values() if getattr(m, "seq_lens", None) is not None), None)
        starts, slots = meta.non_spec_query_start_loc, meta.non_spec_state_indices_tensor
        if lens is not None and starts is not None and slots is not None:
            for row in range(min(len(lens), len(slots), len(starts) - 1)):
                end = int(lens[row])
                first = end - int(starts[row + 1] - starts[row])
                if crosses(first, end):
                    layer.kv_cache[0][slots[row]] = 0
                    layer.kv_cache[1][slots[row]] = 0
                    if not SAID:  # once per process: the fault really acts (the server's log shows it)
                        SAID.append(end)
                        print(
                            f"sparkforge planted fault: linear-attention state zeroed at positions {first}..{end - 1}",
                            file=sys.stderr,
                        )
        return original(layer, meta, mixed_qkv, b, a, core_attn_out, *args, **kwargs)

    return nonspec


def _plant(module) -> None:
    module._cpu_gdn_attention_nonspec = state_lost(module._cpu_gdn_attention_nonspec)
    print(
        f"sparkforge planted fault: linear-attention state lost every {EVERY} tokens",
        file=sys.stderr,
    )


def install() -> None:
    """Called by the .pth at interpreter start: cheap (no vLLM import until vLLM itself imports the op)."""
    from sparkforge_planted_hook import install_on_import

    install_on_import(TARGET, _plant)
