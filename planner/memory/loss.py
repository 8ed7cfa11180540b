"""The output layer and the loss on the last pipeline stage (per shape)."""

from __future__ import annotations

from planner.layouts.layout import Layout
from planner.memory.activations import norm_saved_bytes
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup
from planner.units import ceil_div


def logits_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """The output layer and loss on the last stage, for one micro-batch, at the start
    of backward.

    Fused (Megatron-LM's vocab-parallel cross entropy): the final norm input and the LM
    head input, sbh each (split under sp), and the logits in fp32, 4sbv/t (Korthikanti
    et al. Sec. 4.3). Eager (Hugging Face loss on PyTorch ops): the final norm as in the
    blocks, the fp32 logits the loss keeps for backward, and the two fp32 logit-sized
    gradients the loss's backward creates, 12 bytes per token and vocabulary entry.
    Measured with FSDPMemTracker on Llama-3-8B (s=2048): 1.05e9 B kept plus 2.10e9 B of
    temporaries, 4sv and 8sv. The 16-bit logits the model returns are freed before
    backward, as the Hugging Face Trainer and torchtitan do. Fine-tuning methods other than
    full freeze the final norm and the LM head: their inputs are kept only for the input
    gradients (the normalised tensor and the head's input are not).
    """
    b, s = lay.micro_batch, lay.seq_len // lay.cp
    a = setup.precision_spec.activation_bytes
    tokens = b * s
    sp_div = lay.tp if lay.sp else 1
    eager = kernels != "fused"
    frozen_head = not setup.finetune.is_full
    norm_width = norm_saved_bytes(m, a, kernels, frozen_head)
    norm_in = 0 if not m.final_norm else ceil_div(tokens * m.d_model * norm_width, sp_div)
    head_in = 0 if frozen_head else ceil_div(tokens * m.d_model * a, sp_div)
    v = ceil_div(m.vocab_size, lay.tp)
    per_vocab = 12 if eager else 4
    return norm_in + head_in + tokens * v * per_vocab
