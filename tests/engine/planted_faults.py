"""Faults planted INSIDE the real vLLM through its own `--logits-processors` (run in the twin's engine core).

Copied into a derived twin image (site-packages/sparkforge_faults.py) by tests/engine/test_conform_real.py;
it imports vLLM, so it is never imported on the host.
- `CorruptAfter`: greedy decodes go wrong after CORRUPT_AFTER tokens (the field's silent garble, deterministic).
- `UnseededSampling`: sampled requests ignore their seed (noise from a generator seeded anew each run).
"""

import os

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

CORRUPT_AFTER = int(os.environ.get("SPARKFORGE_FAULT_AFTER", "40"))
WRONG = 104  # the word "user": never a number, so never the answer


class CorruptAfter(AdapterLogitsProcessor):
    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        if params.temperature > 0:
            return None

        def corrupt(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            if len(output_ids) >= CORRUPT_AFTER:
                logits = logits.clone()
                logits[WRONG] = logits.max() + 10
            return logits

        return corrupt


class UnseededSampling(AdapterLogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        self.noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(7), "little"))

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        if params.temperature == 0:
            return None

        def scramble(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            return (torch.randn(logits.shape, generator=self.noise) * 10).to(logits.dtype)

        return scramble
