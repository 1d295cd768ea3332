"""A fault planted INSIDE the real vLLM that acts only with speculative decoding: the drafter's proposals are off
by one token id (a vocabulary-offset bug between drafter and target) AND the rejection sampler accepts every draft
unverified (a classic spec-decode bug). Together the output is the shifted proposal wherever a draft was made:
every drafted position disagrees with the target model's greedy choice, whatever the drafter learnt. (The sampler
fault alone proves nothing once the drafter is distilled: its drafts are the target's own tokens 98 % of the time,
so accepting all of them changed no token; benchmarks/conform.md.)

vLLM refuses custom logits processors with speculative decoding, so this one wraps vLLM's own function instead:
copied into a derived twin image (site-packages/sparkforge_spec_fault.py, loaded at every interpreter start by
sparkforge_spec_fault.pth), it waits for `vllm.v1.sample.rejection_sampler` to be imported (the v1 model
runner's, which vLLM's CPU runner inherits) and replaces the module's `rejection_sample`, which
`RejectionSampler.forward` looks up by name. Without speculative decoding nothing calls it: the fault is silent.
Never imported on the host (it is used only in the image by tests/engine/test_conform_spec_fault_real.py).
"""

import sys

TARGET = "vllm.v1.sample.rejection_sampler"


def accept_every_draft(original):
    """`rejection_sample` with each request's drafts shifted by one id (within the vocabulary), all accepted, and
    the bonus token appended."""

    def rejection_sample(draft_token_ids, num_draft_tokens, *args, **kwargs):
        out = original(draft_token_ids, num_draft_tokens, *args, **kwargs)
        # vLLM 0.32 passes them in order: max_spec_len, cu_num_draft_tokens, draft_probs, target_logits, bonus ids
        bonus = args[4].reshape(-1)
        vocab = args[3].shape[-1]  # the target's logits: one column per token id
        start = 0
        for row, count in enumerate(num_draft_tokens):
            drafts = draft_token_ids[start : start + count]
            start += count
            if count == 0 or bool((drafts < 0).any()):  # a padded draft (-1) stays rejected
                continue
            out[row, :count] = ((drafts + 1) % vocab).to(out.dtype)
            out[row, count] = bonus[row].to(out.dtype)
        return out

    return rejection_sample


def _plant(module) -> None:
    module.rejection_sample = accept_every_draft(module.rejection_sample)
    print("sparkforge planted fault: drafts off by one id, every draft accepted", file=sys.stderr)


def install() -> None:
    """Called by the .pth at interpreter start: cheap (no vLLM import until vLLM itself imports the sampler)."""
    from sparkforge_planted_hook import install_on_import

    install_on_import(TARGET, _plant)
