"""Faults planted INSIDE the real vLLM through its own `--logits-processors` (run in the twin's engine core).

Copied into a derived twin image (site-packages/sparkforge_faults.py) by tests/engine/test_conform_real.py;
it imports vLLM, so it is never imported on the host.
- `CorruptAfter`: greedy decodes go wrong after CORRUPT_AFTER tokens (the field's silent garble, deterministic).
- `UnseededSampling`: sampled requests ignore their seed (noise from a generator seeded anew each run).
Mode-specific ones (each silent in every other mode, so only the row meant for it can catch it):
- `BatchedOnly`: greedy decodes go wrong only while more than one request is in the batch (concurrency).
- `PrefixCachingOnly`: greedy decodes go wrong only in a server with prefix caching on (the prefix-cache
  equivalence, run from a profile with prefix caching off).
- `CrashWithoutChunkedPrefill`: the engine core dies at start-up when chunked prefill is off (the chunked-prefill
  variant: a crash that must fail the report, never pass as a skip).
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


def _wrong_from(output_ids: list[int], logits: torch.Tensor, after: int) -> torch.Tensor:
    if len(output_ids) < after:
        return logits
    logits = logits.clone()
    logits[WRONG] = logits.max() + 10
    return logits


class BatchedOnly(AdapterLogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        self.batched = False

    def is_argmax_invariant(self) -> bool:
        return False

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        self.batched = logits.shape[0] > 1  # one row per request being sampled this step
        return super().apply(logits)

    def new_req_logits_processor(self, params):
        if params.temperature > 0:
            return None
        return lambda output_ids, logits: _wrong_from(output_ids, logits, 2) if self.batched else logits


class PrefixCachingOnly(AdapterLogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        self.on = bool(vllm_config.cache_config.enable_prefix_caching)

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        if params.temperature > 0 or not self.on:
            return None
        return lambda output_ids, logits: _wrong_from(output_ids, logits, 5)


class CrashWithoutChunkedPrefill(AdapterLogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        if not vllm_config.scheduler_config.enable_chunked_prefill:
            raise RuntimeError(
                "planted start-up crash: illegal memory access (tests/engine/planted_faults.py)"
            )

    def is_argmax_invariant(self) -> bool:
        return True

    def new_req_logits_processor(self, params):
        return None
