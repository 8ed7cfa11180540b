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
    et al. Sec. 4.3); under Transformer Engine's cross entropy (TrainingSetup.cross_entropy
    "te") the 16-bit logits holding their own gradient, a sbv/t. Eager (Hugging Face loss on
    PyTorch ops): the final norm as in the blocks, the fp32 logits the loss keeps for
    backward, and the two fp32 logit-sized gradients the loss's backward creates, 12 bytes
    per token and vocabulary entry.
    Measured with FSDPMemTracker on Llama-3-8B (s=2048): 1.05e9 B kept plus 2.10e9 B of
    temporaries, 4sv and 8sv. The 16-bit logits the model returns are freed before
    backward, as the Hugging Face Trainer and torchtitan do. Fine-tuning methods other than
    full freeze the final norm and the LM head: their inputs are kept only for the input
    gradients (the normalised tensor and the head's input are not).
    """
    if kernels == "torchtitan":
        return chunked_loss_bytes(m, setup, lay)
    b, s = lay.micro_batch, lay.seq_len_per_rank
    a = setup.precision_spec.activation_bytes
    tokens = b * s
    sp_div = lay.tp if lay.sp else 1
    eager = kernels != "fused"
    frozen_head = not setup.finetune.is_full
    norm_width = norm_saved_bytes(m, a, kernels, frozen_head)
    norm_in = 0 if not m.final_norm else ceil_div(tokens * m.d_model * norm_width, sp_div)
    head_in = 0 if frozen_head else ceil_div(tokens * m.d_model * a, sp_div)
    v = ceil_div(m.vocab_size, lay.tp)
    per_vocab = 12 if eager else a if setup.cross_entropy == "te" else 4
    return norm_in + head_in + tokens * v * per_vocab


# torchtitan 0.3.0's ChunkedLossWrapper.Config.num_chunks (torchtitan/components/loss.py),
# which its llama3 trainer configs use (models/llama3/config_registry.py)
TITAN_LOSS_CHUNKS = 8
# bytes per (token of a chunk, vocabulary entry on the rank) while one chunk's loss runs its
# backward under tensor parallelism, where torchtitan computes it under loss_parallel (vocab-
# sharded logits; DTensor's decomposed log-softmax and NLL, torch/distributed/tensor/parallel/
# loss.py): the lm_head's 16-bit logits (2), their fp32 upcast (4) and log-softmax output (4)
# that cross entropy keeps (torchtitan/components/loss.py, CrossEntropyLoss: logits.float(),
# F.cross_entropy), and the fp32 gradients of the log-softmax output and of the upcast (4 + 4)
TITAN_CHUNK_BYTES_PER_LOGIT = 2 + 4 + 4 + 4 + 4
# the same at tp 1, a plain tensor through aten's fused cross entropy: one fp32 copy fewer.
# Measured with MemTracker under fake tensors (torch 2.13.0; bench/published_memory.py
# --measure-loss-parallel: 3.5 fp32 copies of the logits with the 16-bit input, 4.5 under
# loss_parallel at tp 8) and in the whole step (plan measure --stack torchtitan, Llama 3.2 1B,
# dp 2, tp 1, 32,768 tokens per micro-batch, full: activations and loss +20% with 18 B, +2% with 14)
TITAN_CHUNK_BYTES_PER_LOGIT_TP1 = 2 + 4 + 4 + 4


def chunked_loss_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout) -> int:
    """torchtitan's chunked loss on the last stage, for one micro-batch, at its peak.

    ChunkedLossWrapper.__call__ (torchtitan/components/loss.py, 0.3.0) runs the model with
    ``_skip_lm_head``, splits the final norm's output (replicated over tp: the full sequence
    per rank) into TITAN_LOSS_CHUNKS contiguous detached chunks (16-bit) and a
    GradAccumulator for their gradients in fp32; it unshards the LM head once and turns its
    gradient sync off until the last chunk, so FSDP2 accumulates the unsharded LM-head
    gradient in the reduce dtype, fp32 (torch/distributed/fsdp/_fully_shard/_fsdp_param.py,
    to_accumulated_grad_if_needed and accumulate_unsharded_grad_if_needed), beside each
    chunk's new 16-bit gradient until it is added: 4 + 2 bytes per element of the rank's LM
    head (V / tp x h). Each chunk runs
    lm_head, cross entropy and its own backward: TITAN_CHUNK_BYTES_PER_LOGIT per chunk token
    and vocabulary entry on the rank (V / tp under loss parallelism; TITAN_CHUNK_BYTES_PER_LOGIT_TP1
    at tp 1). The final norm keeps
    the fp32 tensors the blocks' norms keep (activations.titan_block_terms). With a micro-batch
    over 1 each chunk is a copy (``_chunk_local``: ``c.contiguous()`` of a split along dim 1,
    which is not contiguous for b > 1) while the gathered hidden states stay alive for the
    decoder's backward: b s h a more. Measured with torchtitan's own step under FSDPMemTracker
    (a 4-block Llama of 8B's width, dp 2, tp 4, full, 65,536 tokens: micro-batch 8 x 8192 peaks
    0.50 GiB = b s h x 2 B above micro-batch 1 x 65,536, at 2 and at 4 blocks).
    Checked with the whole step against FSDPMemTracker in docs/accuracy-torchtitan.md (tests/
    test_memory_stacks.py holds every row to +-10%).
    """
    tokens = lay.tokens_per_rank
    a = setup.precision_spec.activation_bytes
    sp_div = lay.tp                                 # torchtitan's tp is sequence-parallel
    h = m.d_model
    v_rank = ceil_div(m.vocab_size, lay.tp)
    norm = 0 if not m.final_norm else ceil_div(tokens * (8 * h + 4), sp_div)
    hidden = tokens * h * (a + 4)                   # detached 16-bit chunks, fp32 GradAccumulator
    if lay.micro_batch > 1:     # a split along the sequence of a [b, s, h] tensor is not contiguous
        hidden += tokens * h * a                    # for b > 1: the chunks are copies (see the docstring)
    head_grad = 0 if not setup.finetune.is_full else v_rank * h * (4 + a)
    per_logit = TITAN_CHUNK_BYTES_PER_LOGIT if lay.tp > 1 else TITAN_CHUNK_BYTES_PER_LOGIT_TP1
    chunk = ceil_div(tokens, TITAN_LOSS_CHUNKS) * v_rank * per_logit
    return norm + hidden + head_grad + chunk
