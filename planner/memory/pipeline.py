"""What a pipeline stage holds under Megatron's interleaved 1F1B schedule: its layers per model
chunk, and the most layer-micro-batches of activations it keeps at once (per shape: the batched
model asks once per distinct (layers, pp, vp, micro-batches, stage, balance)).

The schedule (megatron-core 0.16.1, pipeline_parallel/schedules.py): rank r of p runs its
forward passes in the order of get_schedule_table (lines 798-826): groups of N micro-batches
(microbatch_group_size_per_vp_stage, default p: model_parallel_config.py lines 447-448), each
group through chunk 0, then chunk 1, ..., chunk v-1, the last group taking the remaining
micro-batches; its backward passes run the same table with the chunk reversed (v - 1 - chunk:
forward_backward_pipelining_with_interleaving, get_model_chunk_id). get_pp_rank_microbatches
(lines 738-795) sets the warm-up, (p - r - 1) x 2 + (v - 1) x N chunk forward passes, at most
all of them; then each step of the steady state runs one forward and one backward, the forward
first (forward_k = k + num_warmup_microbatches), and the cool-down the backward passes left.
A chunk's activations are kept from its forward to its backward, so the live layer count after
each forward, the sum of the forward chunks' layers less the backward chunks', peaks at
held_layer_micro_batches. With every chunk of one size L that peak is (warm-up + 1) x L, which
at rank 0 and N = p is Korthikanti et al. 2022's (1 + (p-1)/(p v)) p micro-batches of the
stage (Sec. 4.2.3); with the Llama 3 balance the first chunk of rank 0 (the embedding alone)
and the last of rank p-1 (the loss alone) hold no block.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from planner.layouts.stages import split_extras
from planner.memory.params import stage_layers
from planner.training.pp_layout import is_layout, rank_chunks, stages


@lru_cache(maxsize=4096)
def chunk_layers(n_layers: int, pp: int, vp: int, balance: str = "none", mtp: int = 0
                 ) -> tuple[tuple[int, ...], ...]:
    """Transformer layers per model chunk, per pipeline rank: rank r's chunk c holds virtual
    stage c x pp + r. Each rank's layers (layouts.stages.stage_layers) are split evenly over its vp
    chunks, extra layers first (as emit.megatron.pipeline_layout writes them). Under
    ``balance`` "embedding-loss" the embedding and the loss count as one layer each of the
    first chunk of rank 0 and the last chunk of rank pp - 1 (megatron-core 0.16.1
    transformer_block.py get_num_layers_to_build, lines 196-202: one layer fewer to build in
    that chunk), so those chunks hold one block fewer; under "embedding-loss-mtp" the last
    chunk of rank pp - 1 holds the ``mtp`` MTP modules too, and 1 + mtp blocks fewer
    (layouts.stages.split_extras). A layout stated with --pp-layout gives each chunk its own
    virtual stage's layers (training.pp_layout.rank_chunks), where it has pp x vp of them."""
    if is_layout(balance):
        if pp >= 1 and len(stages(balance)) == pp * vp:
            return rank_chunks(balance, pp)
        balance = "none"
    counts = stage_layers(n_layers, pp, balance, mtp)
    first, last = split_extras(balance, pp, mtp)
    out = []
    for r, n in enumerate(counts):
        extra_first = first if r == 0 else 0
        extra_last = last if r == pp - 1 else 0
        base, extra = divmod(n + extra_first + extra_last, vp)
        chunks = [base + (1 if c < extra else 0) for c in range(vp)]
        chunks[0] -= extra_first
        chunks[-1] -= extra_last
        if min(chunks) < 0:       # fewer layers than chunks: take the missing one off the next
            chunks = [base + (1 if c < extra else 0) for c in range(vp)]
            need = extra_first + extra_last
            for c in (range(vp) if extra_first else range(vp - 1, -1, -1)):
                take = min(need, chunks[c])
                chunks[c] -= take
                need -= take
        out.append(tuple(chunks))
    return tuple(out)


def _schedule_chunks(n_micro: int, vp: int, group: int) -> np.ndarray:
    """The model chunk of each forward pass in the order megatron-core's get_schedule_table
    lays them out (schedules.py lines 798-826)."""
    out: list[int] = []
    for start in range(0, n_micro, group):
        end = n_micro if start + group >= n_micro else start + group
        for c in range(vp):
            out += [c] * (end - start)
    return np.asarray(out, dtype=np.int64)


def warmup_chunks(pp: int, vp: int, n_micro: int, stage: int, group: int = 0) -> int:
    """Chunk forward passes before the first backward on ``stage`` (megatron-core 0.16.1
    schedules.py get_pp_rank_microbatches, lines 773-787): (pp - stage - 1) x 2 +
    (vp - 1) x N, at most the step's vp x n_micro; ``group`` N, 0: pp (its default)."""
    n = group or pp
    return min((pp - stage - 1) * 2 + (vp - 1) * n, vp * n_micro)


@lru_cache(maxsize=8192)
def held_layer_micro_batches(n_layers: int, pp: int, vp: int, n_micro: int, stage: int, balance: str = "none",
                             group: int = 0, mtp: int = 0) -> int:
    """The most blocks' activations of one micro-batch each that ``stage`` keeps at once under
    the interleaved schedule (vp > 1) with ``n_micro`` micro-batches per step: the peak over
    the schedule of the forward chunks' layers less the backward chunks' (see the module's
    notes). Under 1F1B (vp 1): min(pp - stage, n_micro) micro-batches of the stage's layers
    (Narayanan et al. 2021, Sec. 2.2.1; schedules.py num_warmup_microbatches = pp - rank - 1,
    then one forward before each backward)."""
    layers = chunk_layers(n_layers, pp, vp, balance, mtp)[stage]
    if vp == 1 or pp == 1:
        return min(pp - stage, n_micro) * layers[0]
    n = group or pp
    table = _schedule_chunks(n_micro, vp, n)
    lay = np.asarray(layers, dtype=np.int64)
    fwd = np.cumsum(lay[table])
    bwd = np.cumsum(lay[vp - 1 - table])
    total = len(table)
    w = warmup_chunks(pp, vp, n_micro, stage, n)
    if w >= total:
        return int(fwd[-1])
    # steady step k: forward w + k, then backward k; before it, backward k - 1 is done
    k = np.arange(total - w)
    done = np.concatenate([[0], bwd[:-1]])[k]
    return int(max(fwd[w - 1] if w > 0 else 0, int((fwd[w + k] - done).max())))
