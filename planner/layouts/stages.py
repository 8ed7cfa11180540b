"""Layers per pipeline stage: the one count memory, timing, the layout rules and the emitters
read (a fact of the layout, so that the rules, below memory/, call it rather than restate it)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from planner.training.pp_layout import is_layout, rank_chunks, stack_refusal, stage_refusal, stages


def split_extras(balance: str, pp: int, mtp: int = 0) -> tuple[int, int]:
    """What the split counts as layers besides the transformer layers, on the first and on the
    last stage (TrainingSetup.pp_balance): none without a pipeline or under "none"; the
    embedding and the loss under "embedding-loss"; and under "embedding-loss-mtp" each of the
    ``mtp`` MTP modules too, on the last stage, where megatron-core builds them."""
    if pp <= 1 or balance == "none":
        return 0, 0
    return 1, 1 + (mtp if balance == "embedding-loss-mtp" else 0)


def stage_layers(n_layers: int, pp: int, balance: str = "none", mtp: int = 0) -> list[int]:
    """Transformer layers per pipeline stage. Uneven splits put the extra layers on the middle
    stages first: the first stage holds the most in-flight activations and the
    embedding, the last one the LM head (picotron and torchtitan split unevenly too).

    ``balance`` "embedding-loss" (TrainingSetup.pp_balance): the embedding and the loss each
    count as one layer, so n_layers + 2 are split (megatron-core 0.16.1
    transformer/transformer_block.py get_num_layers_to_build, lines 176-202: num_layers + 1
    for each of account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split,
    divided by pp, less one on the first and on the last stage); megatron-core asserts that pp
    divides n_layers + 2 (layouts.rules refuses the others); here the uneven split of
    n_layers + 2 stands in for them. "embedding-loss-mtp": the ``mtp`` MTP modules count as one
    layer each too, so n_layers + 2 + mtp are split and the last stage holds 1 + mtp layers
    fewer, as Megatron-Bridge's DeepSeek-V3 layouts place them ("Et|(tt|)*30mL" at pp 8, vp 4:
    megatron-core's --pipeline-model-parallel-layout, which emit.megatron writes; no
    divisibility asked). Under "none" and "embedding-loss" the MTP modules sit on the last stage
    on top of its layers (megatron-core 0.16.1 transformer/multi_token_prediction.py,
    mtp_on_this_rank: without a layout, every MTP layer on the last pipeline stage). A layout
    stated with --pp-layout (training.pp_layout) gives each rank the layers of its virtual
    stages; where pp does not divide them (a layout the rules refuse) the even split stands in."""
    if is_layout(balance):
        if pp >= 1 and len(stages(balance)) % pp == 0:
            return [sum(c) for c in rank_chunks(balance, pp)]
        balance = "none"
    return list(_stage_layers(n_layers, pp, balance, mtp if balance == "embedding-loss-mtp" else 0))


@lru_cache(maxsize=4096)
def _stage_layers(n_layers: int, pp: int, balance: str = "none", mtp: int = 0) -> tuple[int, ...]:
    """stage_layers, kept per (n_layers, pp, balance, MTP modules the split counts)."""
    first, last = split_extras(balance, pp, mtp)
    if first or last:
        counts = list(_stage_layers(n_layers + first + last, pp))
        counts[0] -= first
        counts[-1] -= last
        return tuple(counts)
    base, extra = divmod(n_layers, pp)
    counts = [base] * pp
    # the middle stages from the last one down, then the last stage, then the first: the order
    # sorted(range(pp), key=lambda i: (i == 0, i == pp - 1, -i)) gives, built without a sort,
    # which made sizing every pp up to the layer count quadratic (issue 32, H3)
    order = [*range(pp - 2, 0, -1), *([pp - 1] if pp > 1 else []), 0]
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


def end_stage_layers(n_layers: int, pp: Any, balance: str = "none", mtp: int = 0) -> Any:
    """Per pipeline degree of ``pp`` (an int or an array of them): the layers of the end stage
    (first or last) that holds fewer, by stage_layers, worked out once per distinct pp; 0 where
    pp < 1 (layouts.rules refuses those first). Where megatron-core's first/last BF16 layers
    sit (training.layer_precision)."""
    import numpy as np

    from planner.layouts.distinct import group

    flat = np.asarray(pp, dtype=np.int64).ravel()
    at, first = group([flat])
    ends = np.zeros(len(first), dtype=np.int64)
    for i, p in enumerate(flat[first].tolist()):
        if p >= 1:
            counts = stage_layers(n_layers, p, balance, mtp)
            ends[i] = min(counts[0], counts[-1])
    out = ends[at].reshape(np.shape(pp))
    return out if out.ndim else int(out)


def layout_refusal(balance: str, stack: str, pp: Any, vp: Any) -> Any:
    """Per (pp, vp) of a batch (ints or arrays): why a layout stated with --pp-layout cannot run
    there (training.pp_layout.stage_refusal; megatron-core's syntax, so --stack megatron), or ""
    where it can and where the split is a rule's. Worked out once per distinct (pp, vp)."""
    import numpy as np

    from planner.layouts.distinct import group

    if not is_layout(balance):
        return ""       # a rule's split: nothing to refuse here, one answer for the whole batch
    pairs = np.broadcast_arrays(np.asarray(pp, dtype=np.int64), np.asarray(vp, dtype=np.int64))
    flat = [a.ravel() for a in pairs]
    at, first = group(flat)
    on_stack = stack_refusal(stack)
    why = [(on_stack if on_stack and p > 1 else stage_refusal(balance, max(p, 1), max(q, 1)) or "")
           for p, q in zip(flat[0][first].tolist(), flat[1][first].tolist())]
    out = np.asarray(why, dtype=object)[at].reshape(pairs[0].shape)
    return out if out.ndim else str(out)
