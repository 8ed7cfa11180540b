"""The global batch a pretraining run of known length uses when the user gives none.

Published runs grow the batch with the run: GPT-3 175B 3.2M tokens (Brown et al. 2020,
Table 2.1), Llama 2 4M (arXiv:2307.09288, Sec. 2.2), DeepSeek LLM 67B 18.9M (arXiv:2401.02954,
Table 2), Llama 3 405B 16M at the end of its ramp (arXiv:2407.21783, Sec. 3.4.1). DeepSeek
LLM fits the compute-optimal batch to its own runs (arXiv:2401.02954, Sec. 3.1, Eq. 1):

    B_opt = 0.2920 x C^0.3271 tokens,   C the training compute in FLOPs

The planner takes C = 6 x parameters x tokens (DeepSeek counts non-embedding FLOPs per token
with attention: an approximation, said so), rounds B_opt to a power of two of sequences (as
published batches are, and so that power-of-two GPU counts divide it) and keeps at least the
fixed default's 1,024 sequences. It overshoots the Llama and GPT-3 choices (405B on 15T
tokens: 16,384 sequences, 67M tokens, against Llama 3's 16M; GPT-3 175B: 16.8M against
3.2M) and matches DeepSeek's own (67B on 2T: 16.8M against 18.9M). It is applied to full training with
--tokens only; a fine-tune (LoRA, QLoRA, freeze) without a batch takes Llama 2-Chat's
supervised fine-tuning batch, 64 sequences (arXiv:2307.09288, Sec. 3.1).
"""

from __future__ import annotations

import math

from planner.training.setup import DEFAULT_SETUP

FINETUNE_SEQUENCES = 64      # Llama 2-Chat's supervised fine-tuning (arXiv:2307.09288, Sec. 3.1): 64 x 4,096
DEEPSEEK_COEFF = 0.2920
DEEPSEEK_EXPONENT = 0.3271
MIN_SEQUENCES = DEFAULT_SETUP.global_batch       # the fixed default's (TrainingSetup.global_batch)


def scaled_global_batch(n_params: int, tokens: float, seq_len: int) -> int:
    """Sequences per step for a run of ``tokens`` on a model of ``n_params`` (module docstring)."""
    compute_flops = 6.0 * n_params * tokens
    batch_tokens = DEEPSEEK_COEFF * compute_flops ** DEEPSEEK_EXPONENT
    sequences = max(1.0, batch_tokens / seq_len)
    return max(MIN_SEQUENCES, 2 ** round(math.log2(sequences)))


def default_global_batch(n_params: int, tokens: float, seq_len: int, method: str) -> int:
    """Sequences per step when the user gives no batch: scaled with the run for full training
    (scaled_global_batch), FINETUNE_SEQUENCES for a fine-tune (LoRA, QLoRA, freeze: issue 33,
    fine-tunes in `plan buy` ran 4M-token pretraining batches)."""
    if method != "full":
        return FINETUNE_SEQUENCES
    return scaled_global_batch(n_params, tokens, seq_len)


def basis(n_sequences: int, seq_len: int, method: str = "full") -> str:
    """The line that says where the batch came from."""
    if method != "full":
        return (f"global batch {n_sequences:,} sequences ({n_sequences * seq_len / 1e6:.2f}M tokens), a fine-tune's: "
                f"Llama 2-Chat's supervised fine-tuning batch (arXiv:2307.09288, Sec. 3.1); --global-batch to choose")
    return (f"global batch {n_sequences:,} sequences ({n_sequences * seq_len / 1e6:.1f}M tokens), scaled with "
            f"the run: DeepSeek LLM's B = 0.292 C^0.3271 tokens (arXiv:2401.02954), C = 6 x parameters x tokens, "
            f"to a power of two; --global-batch to choose")
