"""FLOPs of a block, of the LM head and of a training step (2 FLOPs per multiply-add).

FLOPs follow the papers' convention: attention scores count the full s x s (no causal
halving), norms and element-wise work are not counted. "Model" FLOPs exclude recomputation
(MFU, Chowdhery et al. 2022, PaLM, App. B; Korthikanti et al. 2022); "hardware" FLOPs include
it (the convention of Narayanan et al.'s Table 1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from planner.models.deltanet import delta_rule_flops_per_token, deltanet_conv_flops_per_token
from planner.models.dsa import attended_keys, indexer_score_flops_per_token
from planner.models.generic.profile import GenericProfile
from planner.models.hybrid import conv_flops_per_token, mtp_depth, ssd_scan_flops_per_token
from planner.models.matmuls import block_matmuls, mean_block_share, mtp_eh_proj
from planner.models.spec import ModelSpec
from planner.training.finetune import FinetuneSpec, resolve_targets
from planner.training.linears import blocks_with


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerFlops:
    """Forward FLOPs of the mean transformer block, per token (2 FLOPs per multiply-add).

    Read off the model's own GEMMs (models.matmuls.block_matmuls), each weighted by the share
    of blocks that hold it: qkv: the projections into the heads (a fused QKV; MLA's q and kv
    down- and up-projections); out: the output projection; mlp: the dense MLP, or an MoE
    block's router, the k routed experts a token visits and the shared experts, with the
    dense blocks' MLP in its share of blocks. scores: Q K^T over the query/key head dim and
    the attention-weighted V over the value head dim, 2 s n_heads (d_qk + d_v), over the full
    s x s (Megatron's and FlopCounterMode's convention: causal masking and sliding windows are
    masks, the kernels' saving is timing.kernels.local_attention_share); under DeepSeek Sparse
    Attention over min(s, index_topk) keys, plus the indexer's scores over all s keys
    (planner.models.dsa).
    A hybrid's (planner.models.hybrid) scores are its attention layers' share of them, and
    ``mamba`` its Mamba-2 layers' share of in_proj, out_proj, the conv1d and the SSD scan
    (hybrid.ssd_scan_flops_per_token: the fused kernel's chunked matmuls), and its gated
    DeltaNet layers' share of theirs (deltanet.delta_rule_flops_per_token, fla's kernels).
    """

    qkv: float
    scores: float
    out: float
    mlp: float
    mamba: float = 0.0

    @property
    def total(self) -> float:
        return self.qkv + self.scores + self.out + self.mlp + self.mamba


def layer_flops(m: ModelSpec, seq_len: int) -> LayerFlops:
    """Forward FLOPs per token of the mean block (see LayerFlops); a generic model's mean
    block is measured (generic_layer_flops)."""
    if m.profile is not None:
        return generic_layer_flops(m.profile, seq_len)
    parts = {"qkv": 0.0, "out": 0.0, "mlp": 0.0, "mamba": 0.0}
    for mm in block_matmuls(m):
        part = mm.kind if mm.kind == "mamba" else (
            "mlp" if mm.kind != "attention" else ("out" if mm.name == "o" else "qkv"))
        parts[part] += mm.flops_per_token() * mean_block_share(m, mm)
    scores = score_flops_per_token(m, seq_len)
    if m.layer_pattern:         # a hybrid's attention layers only
        scores *= m.n_attention_layers / m.n_layers
    if m.n_mamba_layers:
        scan = ssd_scan_flops_per_token(m, seq_len) + conv_flops_per_token(m)
        parts["mamba"] += scan * m.n_mamba_layers / m.n_layers
    if m.n_deltanet_layers:
        rule = delta_rule_flops_per_token(m) + deltanet_conv_flops_per_token(m)
        parts["mamba"] += rule * m.n_deltanet_layers / m.n_layers
    return LayerFlops(qkv=parts["qkv"], scores=scores, out=parts["out"], mlp=parts["mlp"], mamba=parts["mamba"])


def score_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of one attention block's scores (LayerFlops.scores): 2 keys
    n_heads (d_qk + d_v), keys the full s (dsa.attended_keys: min(s, index_topk) under DSA),
    plus DeepSeek-V3.2's indexer scores over all s keys."""
    keys = attended_keys(m, seq_len)
    return 2.0 * keys * m.n_heads * (m.head_dim + m.value_head_dim) + indexer_score_flops_per_token(m, seq_len)


def generic_layer_flops(p: GenericProfile, seq_len: int) -> LayerFlops:
    """Forward FLOPs per token of a generic model's mean block, measured by FlopCounterMode on
    transformers' model at two sequence lengths (planner.models.generic.probe): the part that
    grows with the sequence (attention scores, a chunked scan's intra-chunk terms) as
    ``scores``, the rest (every projection, expert, convolution) as ``mlp``. Backward is
    taken as twice forward, the convention of the written families (the measured backward,
    BlockProfile.bwd_flops_per_token, is larger on reference scans that recompute)."""
    per_seq = p.mean_block("fwd_flops_per_token_per_seq")
    return LayerFlops(qkv=0.0, scores=per_seq * seq_len, out=0.0, mlp=p.mean_block("fwd_flops_per_token"))


def head_flops(m: ModelSpec) -> float:
    """Forward FLOPs per token of the LM head (2 h V; BERT's MLM transform adds 2 h^2); a
    generic model's are measured (everything outside its blocks)."""
    if m.profile is not None:
        return m.profile.head_fwd_flops_per_token
    return 2 * m.d_model * m.vocab_size + (2 * m.d_model**2 if m.mlm_head else 0)


def mtp_flops(m: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of the multi-token prediction modules (DeepSeek-V3,
    arXiv:2412.19437, Sec. 2.2; megatron-core's MultiTokenPredictionBlock): each runs eh_proj
    (2h -> h), its layers and the shared output head (2 h V). DeepSeek-V3's layers are one MoE
    block (attention, router, routed and shared experts); a hybrid's are its MTP pattern's
    (models.hybrid.mtp_depth: an attention and a MoE layer). 0 where the model has none
    (transformers does not build them; ModelSpec.n_mtp_modules)."""
    if not m.n_mtp_modules:
        return 0.0
    depth = mtp_depth(m)
    if depth is not None:
        layers = depth.n_layers * layer_flops(depth, seq_len).total
    else:
        layers = sum(mm.flops_per_token() for mm in block_matmuls(m) if not mm.name.startswith("dense_mlp")) \
            + score_flops_per_token(m, seq_len)
    return m.n_mtp_modules * (mtp_eh_proj(m).flops_per_token() + layers + head_flops(m))


def model_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token without recomputation: backward is twice forward.

    The model's own GEMMs (layer_flops), the LM head and any MTP modules. For a GPT block
    (ffn 4h, no GQA) this is 72 l h^2 (1 + s/6h + V/12lh) per token, Korthikanti et al. 2022,
    arXiv:2205.05198, Eq. 7 ("model FLOPs"); tests/test_model_flops.py checks every family
    against torch's FlopCounterMode on the transformers model.
    """
    return 3 * (m.n_layers * layer_flops(m, seq_len).total + head_flops(m) + mtp_flops(m, seq_len))


def hardware_flops_per_token(m: ModelSpec, seq_len: int, recompute: str, recomputed_share: float = 1.0) -> float:
    """Training FLOPs per token the GPUs execute, recomputation included.

    full: every block runs its forward twice. For a GPT block that gives
    96 l h^2 (1 + s/6h + V/16lh) per token, Narayanan et al. 2021, arXiv:2104.04473, Eq. 3.
    Under Megatron's --recompute-method block only ``recomputed_share`` of the blocks
    (TrainingSetup.recomputed_share: N of each virtual stage's layers) rerun their forward
    (megatron-core TransformerBlock._checkpointed_forward checkpoints layers whose index is
    below recompute_num_layers and runs the others plainly), so the extra is that share of
    full's. selective: the attention scores (Q K^T and scores x V) are recomputed,
    Korthikanti et al. 2022, Sec. 4.2, i.e. 4 s q more forward FLOPs per block.
    """
    lf = layer_flops(m, seq_len)
    extra = {"none": 0.0, "selective": lf.scores, "full": lf.total * recomputed_share}[recompute]
    return model_flops_per_token(m, seq_len) + m.n_layers * extra


@dataclass(frozen=True, kw_only=True, slots=True)
class StepFlops:
    model_flops: float        # no recomputation (for MFU)
    hardware_flops: float     # with recomputation


@dataclass(frozen=True, kw_only=True, slots=True)
class AdapterGemms:
    """One adapted linear layer of the blocks: its LoRA pair x A (d_in -> rank) then (x A) B
    (rank -> d_out) (Hu et al. 2021, arXiv:2106.09685, Sec. 4.1)."""

    d_in: int
    d_out: int
    rank: int           # the LoRA rank times PEFT's rank factor on fused expert projections
    expert: bool        # runs on the tokens routed to each expert (k per token), n_copies experts
    n_copies: int
    n_blocks: int       # blocks that hold the layer (an MoE model's dense blocks differ from its MoE blocks)


@lru_cache(maxsize=256)
def block_adapters(m: ModelSpec, ft: FinetuneSpec) -> tuple[AdapterGemms, ...]:
    """The LoRA adapters of the blocks, the one list the step's FLOPs (adapter_flops_per_token)
    and a block's time (kernels.frozen_block_extra_s) read; () unless LoRA/QLoRA. Adapters
    outside the blocks (BERT's MLM transform) are not counted. Kept per (model, fine-tuning):
    a block's time asks once per block shape (issue 32: 5,271 times in the 256-job `plan buy`)."""
    if not ft.is_lora:
        return ()
    return tuple(AdapterGemms(d_in=lin.d_in, d_out=lin.d_out, rank=ft.lora_rank * lin.rank_factor,
                              expert=lin.expert, n_copies=lin.n_copies, n_blocks=blocks_with(m, lin))
                 for lin in resolve_targets(m, ft) if lin.group != "outside")


def adapter_flops_per_token(m: ModelSpec, ft: FinetuneSpec) -> float:
    """Forward FLOPs per token of the LoRA adapters of every block (block_adapters): each
    runs 2 r (d_in + d_out), an expert layer on the k experts a token visits, in the blocks
    that hold the layer."""
    k = m.n_experts_per_token if m.is_moe else 1
    return float(sum((k if a.expert else 1) * 2 * a.rank * (a.d_in + a.d_out) * a.n_blocks
                     for a in block_adapters(m, ft)))


def executed_flops_per_token(m: ModelSpec, seq_len: int, ft: FinetuneSpec, recompute: str = "none",
                             recomputed_share: float = 1.0) -> float:
    """Training FLOPs per token the GPUs run under ``ft``: full training's (model or hardware
    FLOPs) where everything trains; otherwise only the matmuls that run.

    A frozen weight W in y = x W needs no weight gradient (dL/dW = x^T dL/dy), only the input
    gradient dL/dx = dL/dy W^T that carries the gradient to the trainable layers below: its
    backward is one matmul, not two (the backward of a linear layer is two GEMMs, Narayanan et
    al. 2021, Sec. 3.2; PyTorch autograd skips the weight gradient when requires_grad is False).
    LoRA/QLoRA (every block's base frozen, adapters in every block): base matmuls 2x their
    forward (forward + input gradient), attention scores 3x (no weights), adapters 3x, the
    frozen LM head 2x; recomputation reruns the forward of each block (adapters included) or
    its attention scores. Freeze (the last ``trainable_layers`` blocks train): the frozen
    blocks before them run forward only (autograd stops at the first trainable block,
    finetune.activation_layers), the trained blocks 3x, the frozen head 2x; only trained
    blocks keep activations, so only they recompute. ``recomputed_share``: as in
    hardware_flops_per_token (Megatron's block method, full training)."""
    lf = layer_flops(m, seq_len)
    extra = {"none": 0.0, "selective": lf.scores, "full": lf.total * recomputed_share}[recompute]
    if ft.is_full:
        return model_flops_per_token(m, seq_len) + m.n_layers * extra
    weights = lf.total - lf.scores
    head = 2 * head_flops(m)
    if ft.is_lora:
        adapters = adapter_flops_per_token(m, ft)
        if recompute == "full":
            extra_all = m.n_layers * lf.total + adapters
        else:
            extra_all = m.n_layers * extra
        return m.n_layers * (2 * weights + 3 * lf.scores) + 3 * adapters + head + extra_all
    trained = min(ft.trainable_layers, m.n_layers)
    frozen = m.n_layers - trained
    return frozen * lf.total + trained * (3 * lf.total + extra) + head


def with_mtp(m: ModelSpec, mtp_layers: int) -> ModelSpec:
    """The model with the MTP modules a run trains: the checkpoint's own (ModelSpec.n_mtp_modules,
    where the model's config counts them) or Megatron-Core's mtp_num_layers
    (TrainingSetup.mtp_layers), whichever is larger: they are the same modules, not extra ones."""
    if mtp_layers <= m.n_mtp_modules:
        return m
    return replace(m, n_mtp_modules=mtp_layers)


def mtp_blocks(m: ModelSpec, mtp_layers: int) -> int:
    """The layers the run's MTP modules (with_mtp) add to the stage that holds them: each
    module's transformer layer (DeepSeek-V3's MTP block, megatron-core's
    MultiTokenPredictionLayer), or a hybrid's MTP pattern's layers per depth (models.hybrid.
    mtp_depth); 0 without MTP modules. The step time gives each the communication of the model's
    mean block (timing.stage)."""
    n = with_mtp(m, mtp_layers).n_mtp_modules
    depth = mtp_depth(m)
    return n * (depth.n_layers if depth is not None else 1)


def flops_per_step(m: ModelSpec, seq_len: int, n_sequences: int, recompute: str = "none",
                   ft: FinetuneSpec | None = None, recomputed_share: float = 1.0, mtp_layers: int = 0) -> StepFlops:
    """FLOPs of one optimizer step over ``n_sequences`` sequences of ``seq_len`` tokens.

    Full training: model FLOPs (no recomputation, for MFU; 6N per token for the weights, as
    Kaplan's and PaLM's MFU do) and hardware FLOPs (with it). Under LoRA, QLoRA and freeze
    (``ft``) both count only the matmuls that run (executed_flops_per_token): no weight
    gradients for frozen weights, the adapters' own matmuls added, so MFU there is the share
    of peak the GPUs' work reaches, not full training's work over the step.
    ``recomputed_share``: the blocks full recomputation reruns (hardware_flops_per_token).
    ``mtp_layers``: the MTP modules the run trains (with_mtp), counted in both."""
    m = with_mtp(m, mtp_layers)
    tokens = n_sequences * seq_len
    if ft is None or ft.is_full:
        return StepFlops(model_flops=tokens * model_flops_per_token(m, seq_len),
                         hardware_flops=tokens * hardware_flops_per_token(m, seq_len, recompute, recomputed_share))
    return StepFlops(model_flops=tokens * executed_flops_per_token(m, seq_len, ft, "none"),
                     hardware_flops=tokens * executed_flops_per_token(m, seq_len, ft, recompute))
