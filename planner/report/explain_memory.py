"""`plan explain`, memory: the parts the memory model adds up for the peak, named, with formulas and sources."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.layouts.batch import LayoutArrays
from planner.layouts.layout import Layout, instance_shard_size
from planner.memory.attention import mla_saved_delta_bytes
from planner.memory.buffers import has_reduce_bucket
from planner.memory.fp8 import saved_input_delta_bytes
from planner.memory.model import (
    CATEGORIES,
    RankMemory,
    RankTerms,
    layer_activation_terms,
    per_rank_memory,
)
from planner.memory.moe import expert_side_bytes, imbalance_extra_bytes
from planner.models.spec import ModelSpec, ParamCount
from planner.report.terms import (
    AUTOCAST,
    BUFFERS,
    FSDP2,
    FSDP2_BLOCKS,
    FSDP2_FORWARD,
    FSDP2_HEAD,
    FSDP2_PRE_BACKWARD,
    FSDP2_REDUCE,
    FSDP2_STEP,
    KORTHIKANTI,
    LOGITS,
    MEASURED_BLOCK,
    MEASURED_END,
    MEASURED_FORWARD,
    MEASURED_GRAD,
    OFFLOAD,
    ONE_F_ONE_B,
    OPT_STEP,
    OVERHEADS,
    ZERO,
    Term,
)
from planner.report.terms import label as _label
from planner.training.kernels import KERNELS, layout_kernels
from planner.training.layer_precision import stage_bf16_layers
from planner.training.setup import TrainingSetup

# --------------------------------------------------------------------------- memory

def _mem(category: str, name: str, formula: str, value: int, source: str, summed: bool = True,
         **inputs: Any) -> Term:
    return Term(section="memory", category=category, name=name, formula=formula,
                inputs={_label(k): v for k, v in inputs.items()}, value=int(value), unit="bytes",
                source=source, summed=summed)


MEGATRON_HSDP = ("megatron-core 0.16.1 distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py (main weight "
                 "buffer over the whole data-parallel group, HSDP model-weight buffer over the instance); "
                 "Megatron-Bridge perf_recipes/nemotronh/common.py _apply_nemotron_3_ultra_fsdp_hsdp (outer 'optim')")
TITAN_LOSS = "planner/memory/loss.py chunked_loss_bytes; torchtitan/components/loss.py, ChunkedLossWrapper (0.3.0)"


def memory_terms(m: ModelSpec, setup: TrainingSetup, lay: Layout, pc: ParamCount, mem: RankMemory,
                 phase: str | None = None) -> list[Term]:
    """The parts the memory model summed for the peak of ``lay``'s most loaded rank (its
    terms, ``mem.terms``: planner.memory.model.RankTerms), or for another of the moments it
    compared (``phase``, a key of the terms' ``phases``: the overhead, a share of the
    peak's tracked bytes, is itemised at the peak only)."""
    tr = rank_terms(m, setup, lay, pc, mem)
    peak = tr.phase
    phase = phase or peak
    w_extra, grads, act_at, logits_at, buf_at, transient = tr.phases[phase]
    ms, off, split, rp = tr.states, tr.offload, tr.split, tr.rank_params
    prec, sprec = setup.precision_spec, tr.state_precision
    d_dense = tr.hybrid or lay.dense_shard_degree
    d_expert = lay.expert_shard_degree
    if lay.optimizer_instances > 1:     # one instance's expert ranks (memory.states.shard_degrees)
        d_expert = max(1, instance_shard_size(d_expert, lay.optimizer_instances))
    fsdp = lay.is_fsdp
    amp = tr.amp_states and not fsdp
    w_bytes = 4 if (fsdp and prec.is_mixed) or amp else sprec.weight_bytes
    g_bytes = 4 if (fsdp and prec.is_mixed) or amp else sprec.grad_bytes
    w_sharded = fsdp or lay.zero_stage >= 3
    g_sharded = fsdp or lay.zero_stage >= 2
    o_sharded = fsdp or lay.zero_stage >= 1
    states_src = FSDP2 if fsdp else AUTOCAST if amp else ZERO
    params: dict[str, Any] = {"Psi (trainable dense params on the rank)": split.trainable_dense,
              **({"Psi_e (trainable expert params on the rank)": split.trainable_expert}
                 if split.trainable_expert else {})}

    pad = tr.expert_padding       # FSDP2 pads the experts' dim 0 to the shard degree

    def div(sharded: bool) -> str:
        if not sharded:
            return " (replicated)"
        if not split.trainable_expert:
            return " / N_d"
        return f" / N_d (+ Psi_e{' x expert padding' if pad > 1 else ''} x bytes / N_e for experts)"

    shard: dict[str, Any] = {"N_d": d_dense, **({"N_e": d_expert} if split.trainable_expert else {}),
             **({"expert padding": pad} if pad > 1 else {})} if lay.n_gpus > 1 else {}
    # Megatron FSDP over distributed-optimizer instances, outer 'optim': the main weights and the
    # optimizer's states over every data-parallel rank (memory.states.model_state_bytes)
    opt_shard_all: dict[str, Any] = {"N_d_all": lay.dense_shard_degree,
                                     **({"N_e_all": lay.expert_shard_degree} if split.trainable_expert else {})}
    opt_shard = {**shard, "N_d": lay.dense_shard_degree, **({"N_e": lay.expert_shard_degree}
                                                             if split.trainable_expert else {})} \
        if fsdp and lay.optimizer_instances > 1 else shard
    out: list[Term] = []
    frozen = off.weights - ms.weights
    if off.weights == 0 and setup.offload_params != "none":
        out.append(_mem("weights", f"weights: offloaded to {setup.offload_params}",
                        "0 on the GPU; the gathered working set is counted with the buffers",
                        0, OFFLOAD, host_bytes_per_rank=off.host_bytes, nvme_bytes_per_rank=off.nvme_bytes))
    elif fsdp and lay.optimizer_instances > 1:
        held = 0 if setup.fp8_param_gather else prec.weight_bytes      # memory.state_terms
        out.append(_mem("weights", "weights: fp32 main weights over every data-parallel rank, the model "
                        "weights over the instance (Megatron FSDP, outer_dp_sharding_strategy 'optim')",
                        "Psi x 4 / N_d_all + Psi x model bytes / N_d (+ Psi_e x bytes / N_e_all and / N_e "
                        "for experts)", ms.weights, MEGATRON_HSDP, **params, model_bytes_per_weight=held,
                        **opt_shard_all, **shard))
    else:
        out.append(_mem("weights", "weights" + (" (trainable)" if frozen else ""),
                        f"Psi x bytes per weight{div(w_sharded)}", ms.weights, states_src,
                        **params, bytes_per_weight=w_bytes, **(shard if w_sharded else {})))
        if frozen:
            kept = (" (+ the gathered copy, kept through backward under FSDP shard-grad-op)"
                    if lay.sharding == "fsdp-grad-op" else "")
            out.append(_mem("weights", f"frozen base weights ({setup.finetune.method}, quant "
                            f"{setup.finetune.quant})", "frozen params x stored bytes per weight"
                            + (" / N_d" if w_sharded else "") + kept, frozen, "planner.training.finetune.rank_split; "
                            "Dettmers et al. 2023, QLoRA, arXiv:2305.14314 (NF4: 0.5 B + block constants)",
                            frozen_dense_bytes=split.frozen_dense_bytes, frozen_expert_bytes=split.frozen_expert_bytes,
                            **(shard if w_sharded else {})))
    if ms.unsharded_weights:
        out.append(_mem("weights", "gathered 16-bit weights kept through backward (FSDP shard-grad-op)",
                        ("(Psi + Psi_e x expert padding)" if split.trainable_expert else "Psi") + " x 16-bit bytes",
                        ms.unsharded_weights, FSDP2, **params, bytes_per_weight=prec.weight_bytes,
                        **({"expert padding": pad} if split.trainable_expert else {})))  # type: ignore[arg-type]
    if tr.root_gathered:
        out.append(_mem("weights", "root unit kept gathered (embedding, final norm, LM head)",
                        "root params x 16-bit bytes", tr.root_gathered, FSDP2,
                        root_params=rp.root_unit, bytes_per_weight=prec.weight_bytes))
    # the layers the stage keeps in BF16 (training.layer_precision), counted over its layers as the
    # memory model counts them (memory.fp8: no low-precision copy, 16-bit saved inputs)
    n_bf16 = int(stage_bf16_layers(tr.stage, lay.pp, mem.n_layers_on_stage, setup.bf16_layers))
    if prec.fp8 is not None:
        r = prec.fp8
        in_bf16: dict[str, Any] = {"bf16_layers_on_stage": n_bf16, "layers_on_stage": mem.n_layers_on_stage}
        out.append(_mem("weights", f"FP8 weight copies and amax histories ({r.name}: {r.stack})",
                        "block params x fp8 copy bytes + fp8 linears x 5 tensors x (history + 2) x 4 B"
                        + (" (the layers in BF16 left out)" if n_bf16 else ""),
                        tr.fp8_weights, "planner.training.fp8 (torchao float8_linear.py / TE DelayedScaling / "
                        "DeepSeek-V3 arXiv:2412.19437 Sec. 3.3)", fp8_copy_bytes_per_param=r.fp8_weight_copy_bytes,
                        amax_history_len=r.amax_history_len,
                        saved_linear_input_bytes_per_element=r.saved_input_bytes,
                        all_gather_bytes_per_param=r.gather_bytes,
                        **(in_bf16 if n_bf16 else {})))
    out += _moment_weight_terms(lay, tr, phase, w_extra, prec.weight_bytes)

    moment = phase.replace("-", " ")
    held_note = ("held: gradients persist (grad-accum > 1, pp > 1 or DDP/ZeRO buffers)" if tr.persistent_grads
                 else "not yet held: created during backward")
    if off.gradients == 0 and setup.offload_optimizer != "none":
        out.append(_mem("gradients", "gradients: sent to the CPU (ZeRO-Offload keeps only the buckets)",
                        "0 on the GPU", 0, OFFLOAD))
    elif off.gradients == 0 and fsdp and setup.offload_params == "cpu":
        out.append(_mem("gradients", "gradients: sharded gradients in CPU memory (FSDP2 CPUOffloadPolicy)",
                        "0 on the GPU", 0, OFFLOAD))
    elif phase == "backward-end" and tr.end_grad_params is not None:
        dense_done, expert_done = tr.end_grad_params
        out.append(_mem("gradients", f"sharded gradients of the {_blocks(tr.fsdp_done)} done in backward "
                        "(the other blocks' are not made yet)",
                        "dense params of the blocks done x bytes per gradient / N_d (+ their expert params"
                        + (" x expert padding" if pad > 1 else "") + " x bytes / N_e)", grads,
                        f"{FSDP2_BLOCKS}; {MEASURED_END}", blocks_done=tr.fsdp_done,
                        dense_params_of_the_blocks_done=dense_done,
                        **({"expert params of the blocks done": expert_done} if expert_done else {}),  # type: ignore[arg-type]
                        bytes_per_gradient=g_bytes, **shard))
    elif ms.accumulated_gradients and grads and phase != "optimizer-step":      # issue 18
        out.append(_mem("gradients", "unsharded gradients accumulated across the micro-batches (FSDP "
                        "under a pipeline: no-sync until the last backward)",
                        "(Psi + Psi_e) x reduce-dtype bytes (not sharded)" if split.trainable_expert
                        else "Psi x reduce-dtype bytes (not sharded)", grads,
                        "torch 2.13 torch/distributed/pipelining/stage.py (backward_maybe_with_nosync, "
                        "perform_reduce_grad); fsdp/_fully_shard/_fsdp_param.py (to_accumulated_grad_if_needed); "
                        "planner.memory.states.no_sync_gradient_bytes", **params, bytes_per_gradient=g_bytes))
    elif not grads and phase != "optimizer-step":
        out.append(_mem("gradients", "gradients", f"0 at {moment} ({held_note})", 0, ZERO,
                        gradients_later=off.gradients))
    else:
        out.append(_mem("gradients", "gradients", f"Psi x bytes per gradient{div(g_sharded)}", grads,
                        states_src, **params, bytes_per_gradient=g_bytes, **(shard if g_sharded else {})))

    if off.optimizer == 0 and setup.offload_optimizer != "none" or (fsdp and setup.offload_params == "cpu"):
        out.append(_mem("optimizer", f"optimizer states: offloaded ({setup.offload_optimizer or 'cpu'})",
                        "0 on the GPU; the step runs on the CPU", off.optimizer, OFFLOAD,
                        host_bytes_per_rank=off.host_bytes, nvme_bytes_per_rank=off.nvme_bytes))
    else:
        master = 0 if fsdp or amp else sprec.master_bytes
        opt_name = "paged 8-bit AdamW" if setup.finetune.paged_8bit_optimizer else setup.optimizer
        out.append(_mem("optimizer", f"optimizer states ({opt_name}" + (", fp32 master copy)" if master else ")"),
                        f"Psi x (master bytes + optimizer bytes per param){div(o_sharded)}", off.optimizer,
                        states_src + "; Kingma & Ba 2015 (Adam: m and v in fp32)", **params,
                        master_bytes=master, optimizer_bytes_per_param=tr.optimizer_bytes_per_param,
                        **(opt_shard if o_sharded else {})))
    if transient:
        out.append(_mem("optimizer", "optimizer step temporaries", "fp32 copy of the local trainable params "
                        "(foreach) or 2 x fp32 largest tensor", transient, OPT_STEP,
                        trainable_params_on_the_rank=split.trainable, shard_degree=d_dense))

    out += _activation_terms(m, setup, lay, tr, phase, act_at, n_bf16)
    if logits_at:
        eager = tr.kernels != "fused"
        titan = tr.kernels == "torchtitan"
        out.append(_mem("logits", "logits and loss (last stage, one micro-batch)",
                        ("torchtitan's chunked loss: final norm (b s (8h + 4) / t) + detached chunks and their "
                         "fp32 gradient (b s h (a + 4)) + LM-head gradient accumulated in fp32 (V/t h (4 + a)) + one "
                         "chunk's logits, loss and gradients (b s / 8 x V/t x 18 B; 14 B at tp 1)") if titan else
                        "final-norm input + LM-head input (b s h a, / t with sp) + b s V/t x "
                        + ("12 B (fp32 logits and two fp32 gradients)" if eager else "4 B (fp32 logits)"),
                        logits_at, TITAN_LOSS if titan else LOGITS, micro_batch_b=lay.micro_batch,
                        seq_len_s=lay.seq_len_per_rank,
                        d_model_h=m.d_model, vocab_V=m.vocab_size, tp_t=lay.tp, sp=lay.sp,
                        activation_bytes_a=prec.activation_bytes, kernels=tr.kernels))
        if logits_at > tr.layer_act:
            share = logits_at / max(1, act_at + logits_at)
            lead = "the loss dominates" if share > 0.5 else "the loss outweighs a block"
            out.append(_mem("logits", f"  note: {lead}: the {m.vocab_size:,}-token vocabulary makes the logits "
                            f"larger than one block's saved tensors ({share:.0%} of this moment's activations "
                            "and logits); a chunked or fused cross-entropy (Liger, torchtitan's loss parallel) "
                            "is not modelled", "logits and loss / (blocks' activations + logits and loss)",
                            logits_at, LOGITS, summed=False, per_block_bytes=tr.layer_act))
    out += _buffer_terms(setup, lay, tr, phase, buf_at)
    if phase == peak:
        o = setup.overheads
        out.append(_mem("overhead", "fixed: CUDA context, library workspaces"
                        + (", NCCL" if tr.distributed else ""),
                        "context + workspaces (+ NCCL buffers when distributed)", tr.fixed_overhead, OVERHEADS,
                        cuda_context_bytes=o.cuda_context_bytes, library_workspace_bytes=o.library_workspace_bytes,
                        nccl_bytes=o.nccl_bytes if tr.distributed else 0))
        out.append(_mem("overhead", "allocator fragmentation", "fragmentation x tracked bytes (all the above)",
                        tr.fragmentation, OVERHEADS, fragmentation=o.fragmentation, tracked_bytes=tr.tracked))
    # the peak: the moment whose tracked bytes are the largest
    base = tr.tracked - sum(tr.phases[peak])    # weights and optimizer states: every phase
    for name, parts in sorted(tr.phases.items(), key=lambda kv: MOMENTS.index(kv[0])):
        out.append(_mem("peak", f"tracked bytes at {name.replace('-', ' ')}" + (" (the peak)" if name == peak
                                                                                   else ""),
                        "weights and optimizer states + this moment's extra weights, gradients, activations, "
                        "logits, buffers and step temporaries", base + sum(parts),
                        "planner.memory.model.per_rank_memory (the largest of the moments is the peak)",
                        summed=False, states_every_phase=base, **dict(zip(
                            ("extra_weights", "gradients", "activations", "logits", "buffers", "step_temporaries"),
                            parts))))
    # what the terms do not account for (none, unless the model changed under this module)
    totals = phase_categories(mem, tr, phase)
    for cat, total in totals.items():
        rest = total - sum(t.value for t in out if t.category == cat and t.summed)
        if rest:
            out.append(_mem(cat, f"{cat}: not itemised (planner.report.explain is behind planner.memory.model; "
                            "please report it)", "category total - the terms above", int(rest), "planner.memory.model"))
    return out


# the moments per_rank_memory compares, in the order a step goes through them
MOMENTS = ("forward-end", "backward-start", "block-backward", "backward-end", "optimizer-step")


def rank_terms(m: ModelSpec, setup: TrainingSetup, lay: Layout, pc: ParamCount, mem: RankMemory) -> RankTerms:
    """The terms of ``mem`` (sized again for ``lay`` when ``mem`` carries none)."""
    terms = mem.terms if mem.terms is not None else per_rank_memory(m, setup, lay, pc).terms
    assert terms is not None
    return terms.view(setup)


def phase_categories(mem: RankMemory, tr: RankTerms, phase: str) -> dict[str, int]:
    """The categories the memory model sums at ``phase`` (bytes), read from its terms: at the
    peak its breakdown; at another moment the weights and optimizer states every moment holds
    plus that moment's parts, and no overhead (which is a share of the peak's bytes)."""
    bd = mem.breakdown
    if phase == tr.phase:
        return {c: getattr(bd, c) for c in CATEGORIES}
    at_peak, parts = tr.phases[tr.phase], tr.phases[phase]
    w_extra, grads, acts, logits, buffers, transient = parts
    return {"weights": bd.weights - at_peak[0] + w_extra, "gradients": grads,
            "optimizer": bd.optimizer - at_peak[5] + transient, "activations": acts, "logits": logits,
            "buffers": buffers}


def _block_inputs(tr: RankTerms, weight_bytes: int) -> dict[str, Any]:
    """The inputs of one FSDP2 block as it is gathered: its (padded) parameters, or with a
    frozen base its stored frozen bytes and its trainable parameters."""
    split, rp = tr.split, tr.rank_params
    if split.frozen_bytes:
        return {"block frozen bytes (as stored)": split.block_frozen_bytes,
                "block trainable params": split.block_trainable, "bytes per weight": weight_bytes}
    return {"block params (experts padded)" if tr.expert_padding > 1 else "block params": rp.block_unit,
            "bytes per weight": weight_bytes,
            **({"expert padding": tr.expert_padding} if tr.expert_padding > 1 else {})}


def _blocks(n: int) -> str:
    return f"{n} block" + ("" if n == 1 else "s")


def _block_formula(tr: RankTerms) -> str:
    """How one FSDP2 block's gathered bytes are counted (planner.memory.model.fsdp_backward_end_bytes)."""
    if tr.split.frozen_bytes:
        return "block frozen bytes (as stored) + block trainable params x 16-bit bytes"
    return "block params" + (" (experts padded)" if tr.expert_padding > 1 else "") + " x 16-bit bytes"


def _moment_weight_terms(lay: Layout, tr: RankTerms, phase: str, w_extra: int,
                         weight_bytes: int) -> list[Term]:
    """The weights one moment holds beyond (or, negative, below) those every moment holds:
    FSDP2's gathered blocks (planner.memory.model.fsdp_backward_end_bytes, fsdp_forward_bytes)."""
    if not w_extra:
        return []
    block = _block_inputs(tr, weight_bytes)
    if phase == "backward-end" and w_extra > 0:
        return [_mem("weights", "the block in backward, gathered for it (full shard)", _block_formula(tr), w_extra,
                     f"{FSDP2_BLOCKS}; {MEASURED_END}", **block)]
    if phase == "backward-end":
        return [_mem("weights", "minus the first block in backward, resharded after it (freed, shard-grad-op)",
                     "- " + _block_formula(tr), w_extra, f"{FSDP2_BLOCKS}; {MEASURED_END}", **block)]
    if phase == "block-backward":
        return [_mem("weights", "the block in backward, gathered again for it (full shard)", _block_formula(tr),
                     w_extra, f"{FSDP2_PRE_BACKWARD}; {MEASURED_BLOCK}", **block)]
    if phase == "forward-end":
        return [_mem("weights", "the block before the last, gathered for its forward (full shard)", _block_formula(tr),
                     w_extra, f"{FSDP2_FORWARD}; {MEASURED_FORWARD}", **block)]
    if phase == "optimizer-step":
        return [_mem("weights", "minus the gathered weights, resharded after backward (freed)",
                     "- (shard-grad-op's gathered blocks + the gathered root unit)", w_extra, FSDP2_STEP,
                     gathered_blocks_bytes=tr.states.unsharded_weights, gathered_root_bytes=tr.root_gathered)]
    return []


def _architecture_block_terms(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> list[Term]:
    """Per-block lines beyond memory.activations' saved tensors (already in the block's
    bytes above, not added again): the FP8 recipe's saved linear inputs (memory.fp8) and,
    for MoE, the dispatch's expert-side tensors and the routing imbalance (memory.moe)."""
    out: list[Term] = []
    if m.is_mla and lay.recompute != "full":
        out.append(_mem("activations", f"  per block: MLA latents (q {m.q_lora_rank}, kv {m.kv_lora_rank}) and values "
                        f"{m.value_head_dim} wide, not {m.head_dim} (beside the generic tensors above)",
                        "b s (q_lora + kv_lora)(norm bytes + a) (/ t with sp) + 2 b s n_heads (v - head_dim) a / t",
                        mla_saved_delta_bytes(m, setup, lay, kernels), "planner.memory.attention (DeepSeek-V3, "
                        "arXiv:2412.19437, Sec. 2.1.1; checked against autograd on DeepseekV3Attention)",
                        summed=False))
    fp8 = setup.precision_spec.fp8
    if fp8 is not None and lay.recompute != "full":
        delta = saved_input_delta_bytes(m, setup, lay)
        out.append(_mem("activations", f"  per block: FP8 linear inputs kept for backward ({fp8.name}: "
                        f"{fp8.saved_input_bytes:g} B per element)", "b s x (h + q/t + k h + k f/t) x "
                        "(saved bytes - a)", delta, "planner.training.fp8 (torchao float8_linear.py; TE; "
                        "DeepSeek-V3 Sec. 3.3.4)", summed=False))
    if m.is_moe and lay.recompute != "full":
        side = expert_side_bytes(m, setup, lay, kernels)
        out.append(_mem("activations", "  per block: MoE dispatch: routed tokens and expert MLP tensors "
                        f"(k = {m.n_experts_per_token} of {m.n_experts} experts; router: fp32 probabilities above)",
                        "the expert-side saved tensors above, balanced", side, KORTHIKANTI, summed=False))
        if lay.ep > 1 and setup.moe_imbalance != 1.0:
            out.append(_mem("activations", f"  per block: MoE routing imbalance x{setup.moe_imbalance:g} on the "
                            f"most loaded of {lay.ep} expert-parallel ranks", "(imbalance - 1) x expert-side tensors",
                            imbalance_extra_bytes(m, setup, lay, kernels), "TrainingSetup.moe_imbalance (Fedus et "
                            "al. 2021, Switch Transformer, capacity factor)", summed=False))
    return out


MEGATRON_RECOMPUTE = ("megatron-core 0.16.1 transformer/transformer_block.py, TransformerBlock._checkpointed_forward "
                      "(planner.memory.activations.stage_block_bytes)")
DS_CPU_CHECKPOINT = ("deepspeed 0.19.8 runtime/activation_checkpointing/checkpointing.py (CPU_CHECKPOINT), "
                     "offload_activations.py (keep_last_count=1); planner.memory.activations.host_checkpoint_bytes")


def megatron_method(setup: TrainingSetup, lay: Layout) -> str | None:
    """Megatron's full recomputation by method in words, when the plan uses one beyond uniform over 1."""
    n = setup.recompute_num_layers
    if setup.stack != "megatron" or lay.recompute != "full" or (setup.recompute_method == "uniform" and n == 1):
        return None
    if setup.recompute_method == "uniform":
        return (f"uniform over {n}: groups x input bytes, groups = vp x ceil(blocks / vp / {n}); the group "
                f"recomputed in backward holds {n} full blocks")
    return (f"block over {n}: c x input bytes + (blocks - c) x full block bytes, c = vp x min({n}, blocks / vp) "
            f"checkpointed")


def _ds_host_copy(m: ModelSpec, setup: TrainingSetup, lay: Layout, tr: RankTerms) -> int:
    import numpy as np

    from planner.memory.activations import host_checkpoint_bytes
    one = np.array([1])
    host, _ = host_checkpoint_bytes(m, setup, one * lay.micro_batch, one * lay.seq_len_per_rank, one * lay.tp,
                                    np.array([lay.recompute == "full"]), one * tr.n_act_layers,
                                    np.array([tr.held]))
    return int(host[0])


def _activation_terms(m: ModelSpec, setup: TrainingSetup, lay: Layout, tr: RankTerms, phase: str,
                      act_at: int, n_bf16: int) -> list[Term]:
    out: list[Term] = []
    a = tr.act_setup.precision_spec.activation_bytes
    fsdp_moment = lay.is_fsdp and tr.n_act_layers     # FSDP2's backward-end frees as it goes
    dims: dict[str, Any] = {"micro_batch_b": lay.micro_batch, "seq_len_s": lay.seq_len_per_rank,
            "d_model_h": m.d_model,
            "n_heads": m.n_heads, "tp_t": lay.tp, "sp": lay.sp, "activation_bytes_a": a, "kernels": tr.kernels}
    if phase == "optimizer-step":
        return [_mem("activations", "activations at the optimizer step", "0: all freed by then", act_at,
                     "planner.memory.model.per_rank_memory")]
    if phase == "backward-end" and not fsdp_moment:
        out.append(_mem("activations", "the last block in backward (all its tensors)",
                        "one block without recomputation", tr.last_block, KORTHIKANTI,
                        full_block_bytes=tr.full_layer))
        if tr.fsdp_end[1]:
            out.append(_block_gradient_term(setup, tr, tr.fsdp_end[1]))
        return out
    method = megatron_method(setup, lay)
    if method:
        per_block = method
    elif lay.recompute == "full":
        per_block = "the block's input, s b h a (/ t with sp; Sec. 4.3); the rest is recomputed"
    elif lay.recompute == "selective" and tr.kernels == "torchtitan":
        per_block = ("the tensors below that torchtitan's SelectiveAC saves (its op save list, every second "
                     "matmul recomputed; torchtitan/distributed/activation_checkpoint.py, 0.3.0)")
    elif lay.recompute == "selective":
        per_block = ("the saved tensors below less the attention scores (Sec. 4.2); for the paper's "
                     "GPT block with tp and sp: 34 s b h / t")
    else:
        per_block = ("the saved tensors below; for the paper's GPT block: s b h (34 + 5 n_heads s / h), "
                     "/ t with tp and sp (Eqs. 1, 4)")
    out.append(_mem("activations", f"transformer blocks ({tr.n_act_layers} on the stage)",
                    f"blocks x per-block bytes x micro-batches in flight; per block: {per_block}",
                    tr.block_acts, KORTHIKANTI + "; " + ONE_F_ONE_B,
                    blocks_keeping_activations=tr.n_act_layers, per_block_bytes=tr.layer_act,
                    in_flight_micro_batches=tr.held, recompute=lay.recompute, pp=lay.pp, vp=lay.vp,
                    grad_accum_m=lay.grad_accum, **dims))
    if n_bf16 and lay.recompute != "full":
        out[-1] = replace(out[-1], formula=out[-1].formula + "; + the BF16 layers' 16-bit linear inputs "
                          "(memory.fp8.bf16_layer_input_bytes)",
                          inputs={**out[-1].inputs, _label("bf16_layers_on_stage"): n_bf16,
                                  _label("bf16_layer_extra_bytes"): -saved_input_delta_bytes(m, setup, lay)})
    if method:
        out[-1] = _mem("activations", f"transformer blocks ({tr.n_act_layers} on the stage)",
                       f"per micro-batch in flight: {method}", tr.block_acts, MEGATRON_RECOMPUTE,
                       blocks_keeping_activations=tr.n_act_layers, input_bytes=tr.layer_act,
                       full_block_bytes=tr.full_layer, in_flight_micro_batches=tr.held,
                       recompute_method=setup.recompute_method, recompute_num_layers=setup.recompute_num_layers,
                       vp=lay.vp)
    if setup.offload_activations:
        n_off = min(setup.offload_activations, tr.n_act_layers)
        out.append(_mem("activations", f"Megatron-Core CPU offload: {n_off} blocks' saved tensors on the host, "
                        f"{max(n_off - 1, 0)} of them off the GPU (one in flight)",
                        "offloaded blocks x per-block bytes x micro-batches in flight; on the host memory line",
                        int(n_off * tr.layer_act * tr.held), "megatron-core 0.16.1 cpu_offloading_num_layers; "
                        "planner.memory.activations.offloaded_block_bytes", summed=False))
    if setup.recompute_modules and lay.recompute == "selective":
        from planner.memory.recompute import module_recompute_delta_bytes
        out.append(_mem("activations", "  per block: Megatron-Core recompute_modules "
                        f"{', '.join(setup.recompute_modules)}: tensors recomputed, not kept",
                        "norm outputs, the experts' activation output, MLA's Q, K, V, the dense MLP",
                        module_recompute_delta_bytes(m, tr.act_setup, lay, tr.kernels),
                        "planner.memory.recompute (megatron-core 0.16.1 TransformerConfig.recompute_modules)",
                        summed=False))
    host = _ds_host_copy(m, setup, lay, tr)
    if host:
        out.append(_mem("activations", "DeepSpeed cpu_checkpointing: the checkpointed inputs on the host",
                        "blocks sent to the host x b s h a (/ t partitioned) x micro-batches in flight; on the "
                        "host memory line, not the GPU's", host, DS_CPU_CHECKPOINT, summed=False))
    for t in layer_activation_terms(m, tr.act_setup, lay, tr.kernels):
        dropped = lay.recompute == "full" or not t.kept(lay.recompute)
        out.append(_mem("activations", f"  per block: {t.name}" + (" (recomputed, not kept)" if dropped else ""),
                        "b s x width x bytes, / t inside the tensor-parallel region", t.bytes,
                        KORTHIKANTI, summed=False))
    out += _architecture_block_terms(m, tr.act_setup, lay, tr.kernels)
    if tr.embed_acts:
        out.append(_mem("activations", "embedding dropout mask (first stage)",
                        "b s h x 1 B x micro-batches in flight", tr.embed_acts, KORTHIKANTI,
                        mask_bytes_per_micro_batch=tr.dropout_embed, in_flight_micro_batches=tr.held))
    if tr.image_acts:
        v = m.vision
        out.append(_mem("activations", "the trained image side's saved tensors (first stage)",
                        "images per sequence x b x saved bytes per image x micro-batches in flight", tr.image_acts,
                        "measured per image: transformers' get_image_features under fake tensors "
                        "(planner.models.vision.probe)",
                        images_per_sequence=setup.images_per_sample, micro_batch_b=lay.micro_batch,
                        saved_bytes_per_image=int(v.saved_bytes_per_image) if v is not None else 0,
                        in_flight_micro_batches=tr.held))
    if tr.amp_copies:
        out.append(_mem("activations", "autocast's 16-bit copies of the matmul weights",
                        "2 B x matmul params on the rank", tr.amp_copies, AUTOCAST,
                        params_on_the_rank=tr.rank_params.total))
    if phase == "forward-end":
        out.append(_mem("activations", "minus the last block: in its forward, nothing saved yet",
                        "- per-block bytes", -tr.layer_act, f"{FSDP2_FORWARD}; {MEASURED_FORWARD}",
                        per_block_bytes=tr.layer_act))
        return out
    if phase == "backward-end":
        out.append(_mem("activations", f"minus the {_blocks(tr.fsdp_done)} done in backward (their saved "
                        "tensors freed)", "- blocks done x per-block bytes", -tr.fsdp_done * tr.layer_act,
                        f"{FSDP2_BLOCKS}; {MEASURED_END}", blocks_done=tr.fsdp_done,
                        per_block_bytes=tr.layer_act))
    if phase in ("block-backward", "backward-end"):
        out.append(_mem("activations", "working set of the block in backward",
                        "recomputed tensors (full block - kept) + eager score gradients "
                        "+ torchtitan's sequence-parallel copies + DeepSeek-V3.2's indexer scores "
                        "+ Kimi Delta Attention's torch-path decay gradients "
                        "(memory.activations.backward_working_bytes)",
                        tr.working, KORTHIKANTI + "; MemTracker on a Llama model (8.4 B per score); "
                        "indexer: planner.models.dsa.indexer_working_bytes_per_token; "
                        "KDA: planner.models.kimi.kda_torch_backward_working_bytes",
                        full_block_bytes=tr.full_layer, kept_block_bytes=tr.layer_act,
                        score_gradient_bytes=tr.score_grad))
    if phase == "backward-end" and tr.fsdp_end[1]:
        out.append(_block_gradient_term(setup, tr, tr.fsdp_end[1]))
    if phase == "block-backward" and tr.fsdp_block[1]:
        out.append(_block_gradient_term(setup, tr, tr.fsdp_block[1]))
    if phase in ("block-backward", "backward-end") and tr.head_grad:
        out.append(_mem("activations", "the LM head's unsharded gradient, held through backward (FSDP2)",
                        "V / t x h x 16-bit bytes (the weights' compute dtype)", tr.head_grad, FSDP2_HEAD,
                        vocab_V=m.vocab_size, d_model_h=m.d_model, tp_t=lay.tp,
                        bytes_per_weight=setup.precision_spec.weight_bytes))
    return out


def _block_gradient_term(setup: TrainingSetup, tr: RankTerms, value: int) -> Term:
    """FSDP2: the block in backward's unsharded gradients, before its reduce-scatter (``value``
    bytes: the moment's, fsdp_end's or fsdp_block's)."""
    split = tr.split
    if split.frozen_bytes:
        label, params = "block trainable params", split.block_trainable
    else:
        label, params = "block params (their own shapes: experts unpadded)", tr.grad_unit
    return _mem("activations", "the block's 16-bit gradients before its reduce-scatter", f"{label} x 16-bit bytes",
                value, f"{FSDP2_REDUCE}; {MEASURED_GRAD}", **{label: params},  # type: ignore[arg-type]
                bytes_per_weight=setup.precision_spec.weight_bytes)


def _buffer_terms(setup: TrainingSetup, lay: Layout, tr: RankTerms, phase: str, buf_at: int) -> list[Term]:
    """The buffers at ``phase``: the engine's (buffer_bytes), or at FSDP2's backward-end and
    forward-end moments its all-gather and reduce-scatter buffers when they are larger."""
    if not buf_at:
        return []
    prec, rp = setup.precision_spec, tr.rank_params
    engine = tr.buffers
    fsdp_moment = lay.is_fsdp and tr.n_act_layers and phase in ("backward-end", "forward-end")
    if buf_at == engine:
        note = (f"; at {phase.replace('-', ' ')} the larger of these and FSDP2's all-gather/reduce-scatter "
                "buffers" if fsdp_moment else "")
        return [_mem("buffers", "communication buffers", _buffer_formula(lay, setup) + note, buf_at, BUFFERS,
                     bucket_elements=setup.buffers.zero_bucket_numel, largest_module_params=rp.largest_module,
                     block_params=rp.block_unit, bytes_per_weight=prec.weight_bytes,
                     bytes_per_gradient=prec.grad_bytes, pp=lay.pp)]
    block = _block_inputs(tr, prec.weight_bytes)
    # per_rank_memory counts the larger of the engine's buffers (buffer_bytes) and FSDP2's here
    larger = f"; counted instead of the engine's smaller buffers ({engine:,} B)" if engine else ""
    if phase == "forward-end":
        return [_mem("buffers", "two all-gather outputs at once (the block before the last's and the last's)",
                     f"2 x {_block_formula(tr)}{larger}", buf_at, f"{FSDP2_FORWARD}; {MEASURED_FORWARD}",
                     **block)]
    prefetch = tr.fsdp_end[0] if lay.zero_stage == 3 else 0    # full shard: the gathered block's bytes
    out = []
    if prefetch:
        out.append(_mem("buffers", "the next block's all-gather, prefetched (full shard)", _block_formula(tr),
                        prefetch, f"{FSDP2_BLOCKS}; {MEASURED_END}", **block))
    split = tr.split
    if split.frozen_bytes:
        label, params = "block trainable params", split.block_trainable
    else:
        label = "block params" + (" (experts padded)" if tr.expert_padding > 1 else "")
        params = rp.block_unit
    out.append(_mem("buffers", "the previous block's reduce-scatter input", f"{label} x reduce bytes{larger}",
                    buf_at - prefetch, f"{FSDP2_REDUCE}; {MEASURED_END}",
                    **{label: params, "reduce bytes per param": prec.fsdp_grad_bytes}))  # type: ignore[arg-type]
    return out


def _buffer_formula(lay: Layout, setup: TrainingSetup) -> str:
    parts = []
    kernels = KERNELS.index(layout_kernels(setup, lay))
    if has_reduce_bucket(setup, LayoutArrays.from_layouts([lay]), kernels)[0]:
        parts.append("min(bucket, Psi) x gradient bytes (reduce bucket)")
    if lay.zero_stage == 3:
        parts.append("one gathered block (FSDP2)" if lay.is_fsdp else
                     "2 x largest module x 16-bit bytes (gathered + prefetched) + reduce bucket")
    if lay.pp > 1:
        parts.append("2 x b s h a (/ t with sp) pipeline send and receive")
    if not setup.finetune.is_full and setup.finetune.quant != "none":
        parts.append("one dequantized 16-bit weight (bitsandbytes)")
    return " + ".join(parts) or "engine buffers"


