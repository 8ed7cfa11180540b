"""Parameters on one rank of a pipeline stage, after tensor, pipeline and expert splitting
(per shape: the batched model computes them once per distinct (tp, ep, pp) and stage)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from planner.layouts.layout import Layout
from planner.layouts.stages import stage_layers  # noqa: F401 - memory.model's name for it
from planner.models.spec import ModelSpec, ParamCount
from planner.training.setup import TrainingSetup, optimizer_state_bytes_per_param
from planner.units import ceil_div


def stages_to_check(counts: list[int]) -> list[int]:
    """The stages that can be the most loaded: the first, the last, and the earliest
    middle stage of each layer count (later ones hold fewer in-flight micro-batches)."""
    last = len(counts) - 1
    picked = {0, last}
    seen: set[int] = set()
    for i in range(1, last):
        if counts[i] not in seen:
            seen.add(counts[i])
            picked.add(i)
    return sorted(picked)


@dataclass(frozen=True, kw_only=True, slots=True)
class RankParams:
    """Parameters held by one rank of a stage, before ZeRO/FSDP sharding over data ranks."""

    dense: int
    expert: int
    block_unit: int       # one transformer block: the unit FSDP and ZeRO-3 gather
    root_unit: int        # embedding + final norm + LM head: FSDP2's root unit
    largest_module: int   # the largest single module DeepSpeed ZeRO-3 gathers at once

    @property
    def total(self) -> int:
        return self.dense + self.expert


def rank_params(m: ModelSpec, pc: ParamCount, lay: Layout, stage: int, n_layers: int) -> RankParams:
    """Parameters on one rank of ``stage``.

    Tensor parallelism splits every matrix of a block by tp and replicates the norms
    (Shoeybi et al. 2019, Megatron-LM Sec. 3); the word embedding and the LM head are
    split over the vocabulary. Expert weights are split over ep and the expert
    tensor-parallel size etp (Layout.expert_tp, tp by default): megatron-core 0.16.1 builds
    the experts' linear layers on the expert tensor-parallel group
    (transformer/moe/experts.py line 121, GroupedMLP: self.tp_group = pg_collection.expt_tp;
    line 534 TEGroupedMLP alike) with num_moe_experts/ep of them per rank (moe_layer.py,
    num_local_experts, line 102). With tied
    embeddings and pp > 1, the last stage keeps its own copy of the embedding for the
    LM head (Megatron-LM). Biases of row-parallel layers are replicated; they are
    counted as split, an error of at most d_model parameters per layer.
    """
    tp, ep, etp = lay.tp, lay.ep, lay.expert_tp
    norms = pc.norms_per_layer
    expert_all = pc.expert_per_layer * pc.n_experts
    router = pc.mlp_per_layer - expert_all if m.is_moe else 0
    dense_layer = ceil_div(pc.per_layer - norms - expert_all - router, tp) + norms + router
    expert_layer = ceil_div(expert_all, ep * etp) if m.is_moe else 0
    dense = n_layers * dense_layer
    root = 0
    h = m.d_model
    first, last = stage == 0, stage == lay.pp - 1
    if first:
        word = m.vocab_size * h
        root += ceil_div(word, tp) + (pc.embedding - word)
    if last:
        head = pc.final - pc.lm_head
        head += ceil_div(pc.lm_head, tp)
        if m.tied_embeddings and lay.pp > 1:
            head += ceil_div(m.vocab_size * h, tp)
        root += head
    dense += root
    # the unit FSDP wraps: one layer module of the model's code, two letters of a Qwen3-Next pattern
    block = (dense_layer + expert_layer) * m.letters_per_block if n_layers else 0
    largest_module = max(block, ceil_div(m.vocab_size * h, tp) if (first or last) else 0)
    return RankParams(dense=dense, expert=n_layers * expert_layer, block_unit=block,
                      root_unit=root, largest_module=largest_module)


def block_units(m: ModelSpec, n_letters: Any) -> Any:
    """The blocks FSDP2 wraps (one layer module of the model's code, rank_params' block_unit)
    among ``n_letters`` letters of the layer pattern: ``m.letters_per_block`` letters each (a
    Qwen3NextDecoderLayer or KimiLinearDecoderLayer is its token mixer and its MLP, two
    letters; measure.build.shard wraps each of transformers' decoder layers). An int or an
    array, rounded up."""
    return -(-n_letters // m.letters_per_block)


def with_mtp_params(m: ModelSpec, rp: RankParams, tp: int, mtp: int) -> RankParams:
    """``rp`` (the last stage's rank_params, its ``mtp`` MTP blocks counted among its layers) with
    each MTP module's own parameters besides its block: the 2h x h eh_proj (models.matmuls),
    split by tp, and its two RMSNorms (DeepSeek-V3, arXiv:2412.19437, Sec. 2.2); the one count
    memory (memory.shapes) and the step time's data-parallel part (timing.dp) read."""
    if not mtp:
        return rp
    from dataclasses import replace

    from planner.models.matmuls import mtp_eh_proj

    eh = mtp_eh_proj(m)
    return replace(rp, dense=rp.dense + mtp * (ceil_div(eh.d_in * eh.d_out, tp) + 2 * m.d_model))


def largest_tensor(m: ModelSpec, lay: Layout) -> int:
    """Elements of the largest local tensor: the word embedding (or LM head) or an MLP matrix."""
    return max(ceil_div(m.vocab_size * m.d_model, lay.tp), ceil_div(m.d_ff * m.d_model, lay.tp))


def adafactor_bytes_per_param(m: ModelSpec) -> float:
    """Adafactor's factored second moment, per parameter: one fp32 row and one column
    vector per matrix, a full fp32 vector for each 1-D parameter, no first moment
    (Shazeer & Stern 2018, arXiv:1804.04235, Alg. 4; torch.optim.Adafactor's default
    beta1=None)."""
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    mats = [(h, q), (h, kv), (h, kv), (q, h)]
    mats += [(h, f)] * (2 if m.gated_mlp else 1) + [(f, h)]
    experts = max(m.n_experts, 1)
    state = sum(4 * (a + b) for a, b in mats[:4])
    state += experts * sum(4 * (a + b) for a, b in mats[4:])
    params = sum(a * b for a, b in mats[:4]) + experts * sum(a * b for a, b in mats[4:])
    return state / params


def optimizer_state_bytes(m: ModelSpec | None, setup: TrainingSetup) -> float:
    """Bytes of optimizer state per trainable parameter, without the fp32 master copy, as the
    set-up keeps them: the one rule the memory model, its floors, the step time's optimizer
    update and the DeepSpeed cross-check read. TrainingSetup.optimizer_state_bytes when given;
    else the optimizer's (training.setup.optimizer_state_bytes_per_param; paged 8-bit AdamW
    under QLoRA's paged optimizer, FinetuneSpec.paged_8bit_optimizer; Adafactor from the
    model's shapes, adafactor_bytes_per_param). ``m`` None (a bound before a model is sized):
    Adafactor's factored state counts 0, its lower bound."""
    if setup.optimizer_state_bytes is not None:
        return setup.optimizer_state_bytes
    optimizer = "adam8bit" if setup.finetune.paged_8bit_optimizer else setup.optimizer
    if m is None:
        return 0.0 if optimizer == "adafactor" else optimizer_state_bytes_per_param(optimizer)
    return optimizer_bytes_per_param(m, optimizer)


@lru_cache(maxsize=256)
def optimizer_bytes_per_param(m: ModelSpec, optimizer: str) -> float:
    if optimizer == "adafactor":
        return adafactor_bytes_per_param(m)
    return optimizer_state_bytes_per_param(optimizer)
