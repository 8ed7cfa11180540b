"""`plan explain`: every term of the memory and step-time models for one layout, with
its inputs, its value and its source, so a user can check the arithmetic by hand.

The values are never worked out here: the memory terms are the parts
memory.per_rank_memory() itself adds up (its ``trace``), the time terms those of
timing.step_time() (its pipeline, data-parallel and optimizer parts, from the same
functions). This module only names them, writes their formulas in words and symbols and
cites where each comes from; tests/test_explain.py checks that the terms add up to what
`plan` reports. A term marked ``summed=False`` is a figure the summed terms use (the
FLOPs, a rate, a link's bandwidth), shown for the hand check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.hardware.gpus import GpuSpec
from planner.layouts.layout import Layout
from planner.memory.model import CATEGORIES, RankMemory, layer_activation_terms, per_rank_memory
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.hardware.placement import Cluster, cluster_for
from planner.timing.model import (FLASH_FRACTION, FLASH_FRACTION_DEFAULT, MATMUL_FRACTION, MATMUL_FRACTION_DEFAULT,
                     Efficiency, StepTime, _dp_comms, _dp_parts, _kernels, _layer_key, _pipeline,
                     flops_per_step, head_backward_gemms, layer_time, optimizer_bytes_per_param,
                     optimizer_time_s, step_time, trained_split)
from planner.training.setup import TrainingSetup, optimizer_state_bytes_per_param

ZERO = "Rajbhandari et al. 2019, ZeRO, arXiv:1910.02054, Sec. 5 and Fig. 1"
FSDP2 = "PyTorch FSDP2 docs (fully_shard, MixedPrecisionPolicy: fp32 sharded parameters and gradients)"
FSDP2_BLOCKS = ("PyTorch FSDP2 (torch.distributed.fsdp fully_shard; _fully_shard/_fsdp_param_group.py, "
                "post_backward): reshard_after_backward=True reshards a block as soon as its backward is over, "
                "its gradients go to a reduce-scatter; full shard prefetches the next block "
                "(planner.memory.model.fsdp_blocks_done, fsdp_backward_end_bytes)")
FSDP2_FORWARD = ("PyTorch FSDP2 (torch.distributed.fsdp fully_shard; _fsdp_param_group.py, wait_for_unshard, "
                 "all_gather_state): a block's all-gather output is kept until the next block's is copied out "
                 "(planner.memory.model.fsdp_forward_bytes)")
FSDP2_REDUCE = ("PyTorch FSDP2 (torch.distributed.fsdp fully_shard): a block's unsharded gradients exist until its "
                "reduce-scatter, whose input stays allocated until the next block's post-backward "
                "(reduce_scatter_max_input_buffers = 1), in MixedPrecisionPolicy's reduce_dtype (fp32 under "
                "mixed precision)")
FSDP2_HEAD = ("PyTorch FSDP2 (torch.distributed.fsdp fully_shard): the root unit (embedding, final norm, LM head) "
              "is reduce-scattered in its own post-backward, after every block; FSDPMemTracker on Llama-3-8B cut "
              "to 4 blocks (fp32, 8 ranks): 1.47 GiB less in every block's backward with a quarter of the "
              "vocabulary, (128,256 - 32,064) x 4096 x 4 B (tests/test_memory_measured.py)")
FSDP2_STEP = ("PyTorch FSDP2 (torch.distributed.fsdp fully_shard, reshard_after_backward=True): every unit, the "
              "root and shard-grad-op's blocks too, is resharded after its backward: no gathered weights are left "
              "at the optimizer step")
MEASURED_END = ("docs/accuracy.md (FSDPMemTracker on Mixtral-8x7B): full shard on 64 ranks peaks in block 1's "
                "backward with 30 of 32 blocks' sharded gradients; shard-grad-op on 8 ranks in block 30's, one "
                "block's gradients made and one block's gathered weights freed")
MEASURED_FORWARD = ("docs/accuracy.md (FSDPMemTracker on Mixtral-8x7B, 64 ranks, shard-grad-op, micro-batch 2): "
                    "the peak is in the last block's forward, two 21.1 GiB all-gather outputs beside every "
                    "gathered block")
MEASURED_GRAD = ("docs/accuracy.md (FSDPMemTracker on Mixtral-8x7B, 64 ranks, 8 experts: 21.1 GiB gathered and "
                 "prefetched, 42.2 GiB reduce-scatter input, 2.7 GiB of block gradients, unpadded)")
AUTOCAST = "PyTorch torch.autocast (fp32 parameters, 16-bit copies per forward)"
KORTHIKANTI = "Korthikanti et al. 2022, arXiv:2205.05198, Sec. 4.1-4.3, Eqs. 1-4"
ONE_F_ONE_B = ("Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2.1 (1F1B: stage i holds min(p - i, m)); "
               "Korthikanti et al. 2022, Sec. 4.2.3 (interleaved: x (1 + (p-1)/(p v)))")
BUBBLE = "Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2 (bubble (p-1)/v micro-batch times)"
FLOPS = ("Narayanan et al. 2021, arXiv:2104.04473, Eq. 3 (96 l h^2 (1 + s/6h + V/16lh) with full "
         "recomputation); Korthikanti et al. 2022, Eq. 7 (model FLOPs, 72 l h^2 (...))")
KAPLAN = "Kaplan et al. 2020, arXiv:2001.08361, Sec. 2.1 (C = 6 N per token, attention left out)"
RING = ("ring collectives: Patarasuk & Yuan 2009; bus bandwidth as nccl-tests defines it "
        "(NVIDIA/nccl-tests doc/PERFORMANCE.md)")
TP_COMM = "Shoeybi et al. 2019, Megatron-LM, arXiv:1909.08053, Sec. 3 (2 all-reduces forward, 2 backward)"
OVERHEADS = ("planner.training.setup.Overheads: PyTorch CUDA semantics notes, CUDA lazy loading docs, "
             "NCCL_BUFFSIZE docs, PyTorch 'Understanding CUDA memory usage'")
BUFFERS = ("DeepSpeed config docs (reduce_bucket_size, stage3_prefetch_bucket_size); FSDPMemTracker "
           "on Llama-3-8B (one gathered block); pipeline send/receive of one activation")
LOGITS = ("Korthikanti et al. 2022, Sec. 4.3 (fused: 4sbv/t fp32 logits); eager Hugging Face loss: "
          "12 B per logit, measured with FSDPMemTracker on Llama-3-8B")
OFFLOAD = ("Ren et al. 2021, ZeRO-Offload, arXiv:2101.06840, Sec. 4.1; Rajbhandari et al. 2021, "
           "ZeRO-Infinity, arXiv:2104.07857, Sec. 5; FSDP2 CPUOffloadPolicy")
OPT_STEP = "torch/optim/adamw.py, _multi_tensor_adamw (_foreach_sqrt: one fp32 copy of the local parameters)"
OPT_TIME = "memory-bound update: read and write the master copy and states, read the gradient, write the weight"
MATMUL = ("planner.timing.model.MATMUL_FRACTION: sustained matmul FLOPS (stas00/ml-engineering, "
          "compute/accelerator/benchmarks); A100 fitted to Korthikanti et al. 2022, Table 4")
FLASH = "planner.timing.model.FLASH_FRACTION: Dao 2023, FlashAttention-2, Sec. 4; Shah et al. 2024, FlashAttention-3"
HBM = "planner.timing.model.Efficiency.hbm_fraction: Ivanov et al. 2021, 'Data Movement Is All You Need', Sec. 4-5"
OVERLAP = ("planner.timing.model.Efficiency.overlap_slowdown: NCCL channels take SMs and HBM bandwidth "
           "(Rashidi et al. 2021, ISCA, Sec. 2)")
LAYER_TIME = ("planner.timing.model.layer_time: GEMMs at the matmul rate plus one HBM pass of their operands, "
              "flash attention at the flash rate (backward 2.5x, Dao 2023), element-wise kernels at HBM rate")


@dataclass(frozen=True, kw_only=True, slots=True)
class Term:
    """One term of the memory or time model.

    section: "memory" (bytes on the most loaded rank at its peak) or "time" (seconds of one
    optimizer step); category: the report's category (weights, ..., overhead; compute,
    communication, bubble, optimizer); summed: part of the section's total, or (False) a
    figure the summed terms use.
    """

    section: str
    category: str
    name: str
    formula: str
    inputs: dict[str, Any] = field(default_factory=dict)
    value: float
    unit: str
    source: str
    summed: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"section": self.section, "category": self.category, "name": self.name,
                "formula": self.formula, "inputs": self.inputs, "value": self.value, "unit": self.unit,
                "source": self.source, "summed": self.summed}


@dataclass(frozen=True, kw_only=True, slots=True)
class Explanation:
    model: ModelSpec
    gpu: GpuSpec
    layout: Layout
    memory: RankMemory
    capacity_bytes: int
    time: StepTime
    terms: tuple[Term, ...]
    tokens: float | None = None

    def summed(self, section: str) -> float:
        return sum(t.value for t in self.terms if t.section == section and t.summed)


def explain(m: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster | None = None,
            eff: Efficiency | None = None, capacity_bytes: int | None = None,
            tokens: float | None = None) -> Explanation:
    """The memory and time terms of ``lay`` (as `plan` evaluates it on ``gpu``)."""
    eff = eff or Efficiency()
    pc = count_params(m)
    cluster = cluster or cluster_for(gpu)
    trace: dict[str, Any] = {}
    mem = per_rank_memory(m, setup, lay, pc, gpu.gpus_per_node, trace=trace)
    st = step_time(m, setup, lay, cluster, eff, pc)
    terms = memory_terms(m, setup, lay, pc, mem, trace) + time_terms(m, setup, lay, cluster, eff, pc, st)
    if tokens is not None:
        terms.append(Term(section="time", category="training", name="time to train on the tokens",
                          formula="tokens / (tokens per step / step time)",
                          inputs={"tokens": tokens, "tokens per step": st.tokens_per_step,
                                  "step time s": st.step_time_s},
                          value=st.train_time_s(tokens), unit="s", source="Narayanan et al. 2021, Eq. 4",
                          summed=False))
    cap = capacity_bytes if capacity_bytes is not None else gpu.memory_bytes
    return Explanation(model=m, gpu=gpu, layout=lay, memory=mem, capacity_bytes=cap, time=st,
                       terms=tuple(terms), tokens=tokens)


# --------------------------------------------------------------------------- memory

def _label(key: str) -> str:
    """An input's name: symbols (N_d, Psi_e) and keys with spaces as written, else words."""
    return key if " " in key or key.startswith(("N_", "Psi")) else key.replace("_", " ")


def _mem(category: str, name: str, formula: str, value: int, source: str, summed: bool = True,
         **inputs: Any) -> Term:
    return Term(section="memory", category=category, name=name, formula=formula,
                inputs={_label(k): v for k, v in inputs.items()}, value=int(value), unit="bytes",
                source=source, summed=summed)


def memory_terms(m: ModelSpec, setup: TrainingSetup, lay: Layout, pc: ParamCount, mem: RankMemory,
                 tr: dict[str, Any], phase: str | None = None) -> list[Term]:
    """The parts per_rank_memory() summed for the peak of ``lay``'s most loaded rank, or for
    another of the moments it compared (``phase``, a key of its trace's ``phases``: the
    overhead, a share of the peak's tracked bytes, is itemised at the peak only)."""
    peak = tr["phase"]
    phase = phase or peak
    w_extra, grads, act_at, logits_at, buf_at, transient = tr["phases"][phase]
    ms, off, split, rp = tr["states"], tr["offload"], tr["split"], tr["rank_params"]
    prec, sprec = setup.precision_spec, tr["state_precision"]
    d_dense = tr["hybrid"] or lay.dense_shard_degree
    d_expert = lay.expert_shard_degree
    fsdp = lay.is_fsdp
    amp = tr["amp_states"] and not fsdp
    w_bytes = 4 if (fsdp and prec.is_mixed) or amp else sprec.weight_bytes
    g_bytes = 4 if (fsdp and prec.is_mixed) or amp else sprec.grad_bytes
    w_sharded = fsdp or lay.zero_stage >= 3
    g_sharded = fsdp or lay.zero_stage >= 2
    o_sharded = fsdp or lay.zero_stage >= 1
    states_src = FSDP2 if fsdp else AUTOCAST if amp else ZERO
    params = {"Psi (trainable dense params on the rank)": split.trainable_dense,
              **({"Psi_e (trainable expert params on the rank)": split.trainable_expert}
                 if split.trainable_expert else {})}

    pad = tr["expert_padding"]       # FSDP2 pads the experts' dim 0 to the shard degree

    def div(sharded: bool) -> str:
        if not sharded:
            return " (replicated)"
        if not split.trainable_expert:
            return " / N_d"
        return f" / N_d (+ Psi_e{' x expert padding' if pad > 1 else ''} x bytes / N_e for experts)"

    shard = {"N_d": d_dense, **({"N_e": d_expert} if split.trainable_expert else {}),
             **({"expert padding": pad} if pad > 1 else {})} if lay.n_gpus > 1 else {}
    out: list[Term] = []
    frozen = off.weights - ms.weights
    if off.weights == 0 and setup.offload_params != "none":
        out.append(_mem("weights", f"weights: offloaded to {setup.offload_params}",
                        "0 on the GPU; the gathered working set is counted with the buffers",
                        0, OFFLOAD, host_bytes_per_rank=off.host_bytes, nvme_bytes_per_rank=off.nvme_bytes))
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
                        **({"expert padding": pad} if split.trainable_expert else {})))
    if tr["root_gathered"]:
        out.append(_mem("weights", "root unit kept gathered (embedding, final norm, LM head)",
                        "root params x 16-bit bytes", tr["root_gathered"], FSDP2,
                        root_params=rp.root_unit, bytes_per_weight=prec.weight_bytes))
    out += _moment_weight_terms(lay, tr, phase, w_extra, prec.weight_bytes)

    moment = phase.replace("-", " ")
    held_note = ("held: gradients persist (grad-accum > 1, pp > 1 or DDP/ZeRO buffers)" if tr["persistent_grads"]
                 else "not yet held: created during backward")
    if off.gradients == 0 and setup.offload_optimizer != "none":
        out.append(_mem("gradients", "gradients: sent to the CPU (ZeRO-Offload keeps only the buckets)",
                        "0 on the GPU", 0, OFFLOAD))
    elif off.gradients == 0 and fsdp and setup.offload_params == "cpu":
        out.append(_mem("gradients", "gradients: sharded gradients in CPU memory (FSDP2 CPUOffloadPolicy)",
                        "0 on the GPU", 0, OFFLOAD))
    elif phase == "backward-end" and tr["end_grad_params"] is not None:
        dense_done, expert_done = tr["end_grad_params"]
        out.append(_mem("gradients", f"sharded gradients of the {_blocks(tr['fsdp_done'])} done in backward "
                        "(the other blocks' are not made yet)",
                        "dense params of the blocks done x bytes per gradient / N_d (+ their expert params"
                        + (" x expert padding" if pad > 1 else "") + " x bytes / N_e)", grads,
                        f"{FSDP2_BLOCKS}; {MEASURED_END}", blocks_done=tr["fsdp_done"],
                        dense_params_of_the_blocks_done=dense_done,
                        **({"expert params of the blocks done": expert_done} if expert_done else {}),
                        bytes_per_gradient=g_bytes, **shard))
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
                        master_bytes=master, optimizer_bytes_per_param=tr["optimizer_bytes_per_param"],
                        **(shard if o_sharded else {})))
    if transient:
        out.append(_mem("optimizer", "optimizer step temporaries", "fp32 copy of the local trainable params "
                        "(foreach) or 2 x fp32 largest tensor", transient, OPT_STEP,
                        trainable_params_on_the_rank=split.trainable, shard_degree=d_dense))

    out += _activation_terms(m, setup, lay, tr, phase, act_at)
    if logits_at:
        eager = tr["kernels"] != "fused"
        out.append(_mem("logits", "logits and loss (last stage, one micro-batch)",
                        "final-norm input + LM-head input (b s h a, / t with sp) + b s V/t x "
                        + ("12 B (fp32 logits and two fp32 gradients)" if eager else "4 B (fp32 logits)"),
                        logits_at, LOGITS, micro_batch_b=lay.micro_batch, seq_len_s=lay.seq_len // lay.cp,
                        d_model_h=m.d_model, vocab_V=m.vocab_size, tp_t=lay.tp, sp=lay.sp,
                        activation_bytes_a=prec.activation_bytes, kernels=tr["kernels"]))
    out += _buffer_terms(setup, lay, tr, phase, buf_at)
    if phase == peak:
        o = setup.overheads
        out.append(_mem("overhead", "fixed: CUDA context, library workspaces"
                        + (", NCCL" if tr["distributed"] else ""),
                        "context + workspaces (+ NCCL buffers when distributed)", tr["fixed_overhead"], OVERHEADS,
                        cuda_context_bytes=o.cuda_context_bytes, library_workspace_bytes=o.library_workspace_bytes,
                        nccl_bytes=o.nccl_bytes if tr["distributed"] else 0))
        out.append(_mem("overhead", "allocator fragmentation", "fragmentation x tracked bytes (all the above)",
                        tr["fragmentation"], OVERHEADS, fragmentation=o.fragmentation, tracked_bytes=tr["tracked"]))
    # the peak: the moment whose tracked bytes are the largest
    base = tr["tracked"] - sum(tr["phases"][peak])    # weights and optimizer states: every phase
    for name, parts in sorted(tr["phases"].items(), key=lambda kv: MOMENTS.index(kv[0])):
        out.append(_mem("peak", f"tracked bytes at {name.replace('-', ' ')}" + (" (the peak)" if name == peak
                                                                                   else ""),
                        "weights and optimizer states + this moment's extra weights, gradients, activations, "
                        "logits, buffers and step temporaries", base + sum(parts),
                        "planner.memory.model.per_rank_memory (the largest of the moments is the peak)",
                        summed=False, states_every_phase=base, **dict(zip(
                            ("extra_weights", "gradients", "activations", "logits", "buffers", "step_temporaries"),
                            parts))))
    # what the trace does not account for (none, unless the model changed under this module)
    totals = phase_categories(mem, tr, phase)
    for cat, total in totals.items():
        rest = total - sum(t.value for t in out if t.category == cat and t.summed)
        if rest:
            out.append(_mem(cat, f"{cat}: not itemised (planner.report.explain is behind planner.memory.model; "
                            "please report it)", "category total - the terms above", rest, "planner.memory.model"))
    return out


# the moments per_rank_memory compares, in the order a step goes through them
MOMENTS = ("forward-end", "backward-start", "block-backward", "backward-end", "optimizer-step")


def phase_categories(mem: RankMemory, tr: dict[str, Any], phase: str) -> dict[str, int]:
    """The categories per_rank_memory() sums at ``phase`` (bytes), read from its trace: at the
    peak its breakdown; at another moment the weights and optimizer states every moment holds
    plus that moment's parts, and no overhead (which is a share of the peak's bytes)."""
    bd = mem.breakdown
    if phase == tr["phase"]:
        return {c: getattr(bd, c) for c in CATEGORIES}
    at_peak, parts = tr["phases"][tr["phase"]], tr["phases"][phase]
    w_extra, grads, acts, logits, buffers, transient = parts
    return {"weights": bd.weights - at_peak[0] + w_extra, "gradients": grads,
            "optimizer": bd.optimizer - at_peak[5] + transient, "activations": acts, "logits": logits,
            "buffers": buffers}


def _block_inputs(tr: dict[str, Any], weight_bytes: int) -> dict[str, Any]:
    """The inputs of one FSDP2 block as it is gathered: its (padded) parameters, or with a
    frozen base its stored frozen bytes and its trainable parameters."""
    split, rp = tr["split"], tr["rank_params"]
    if split.frozen_bytes:
        return {"block frozen bytes (as stored)": split.block_frozen_bytes,
                "block trainable params": split.block_trainable, "bytes per weight": weight_bytes}
    return {"block params (experts padded)" if tr["expert_padding"] > 1 else "block params": rp.block_unit,
            "bytes per weight": weight_bytes,
            **({"expert padding": tr["expert_padding"]} if tr["expert_padding"] > 1 else {})}


def _blocks(n: int) -> str:
    return f"{n} block" + ("" if n == 1 else "s")


def _block_formula(tr: dict[str, Any]) -> str:
    """How one FSDP2 block's gathered bytes are counted (planner.memory.model.fsdp_backward_end_bytes)."""
    if tr["split"].frozen_bytes:
        return "block frozen bytes (as stored) + block trainable params x 16-bit bytes"
    return "block params" + (" (experts padded)" if tr["expert_padding"] > 1 else "") + " x 16-bit bytes"


def _moment_weight_terms(lay: Layout, tr: dict[str, Any], phase: str, w_extra: int,
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
    if phase == "forward-end":
        return [_mem("weights", "the block before the last, gathered for its forward (full shard)", _block_formula(tr),
                     w_extra, f"{FSDP2_FORWARD}; {MEASURED_FORWARD}", **block)]
    if phase == "optimizer-step":
        return [_mem("weights", "minus the gathered weights, resharded after backward (freed)",
                     "- (shard-grad-op's gathered blocks + the gathered root unit)", w_extra, FSDP2_STEP,
                     gathered_blocks_bytes=tr["states"].unsharded_weights, gathered_root_bytes=tr["root_gathered"])]
    return []


def _activation_terms(m: ModelSpec, setup: TrainingSetup, lay: Layout, tr: dict[str, Any], phase: str,
                      act_at: int) -> list[Term]:
    out: list[Term] = []
    a = tr["act_setup"].precision_spec.activation_bytes
    fsdp_moment = lay.is_fsdp and tr["n_act_layers"]     # FSDP2's backward-end frees as it goes
    dims = {"micro_batch_b": lay.micro_batch, "seq_len_s": lay.seq_len // lay.cp, "d_model_h": m.d_model,
            "n_heads": m.n_heads, "tp_t": lay.tp, "sp": lay.sp, "activation_bytes_a": a, "kernels": tr["kernels"]}
    if phase == "optimizer-step":
        return [_mem("activations", "activations at the optimizer step", "0: all freed by then", act_at,
                     "planner.memory.model.per_rank_memory")]
    if phase == "backward-end" and not fsdp_moment:
        out.append(_mem("activations", "the last block in backward (all its tensors)",
                        "one block without recomputation", tr["last_block"], KORTHIKANTI,
                        full_block_bytes=tr["full_layer"]))
        if tr["fsdp_end"][1]:
            out.append(_block_gradient_term(setup, tr))
        return out
    if lay.recompute == "full":
        per_block = "the block's input, s b h a (/ t with sp; Sec. 4.3); the rest is recomputed"
    elif lay.recompute == "selective":
        per_block = ("the saved tensors below less the attention scores (Sec. 4.2); for the paper's "
                     "GPT block with tp and sp: 34 s b h / t")
    else:
        per_block = ("the saved tensors below; for the paper's GPT block: s b h (34 + 5 n_heads s / h), "
                     "/ t with tp and sp (Eqs. 1, 4)")
    out.append(_mem("activations", f"transformer blocks ({tr['n_act_layers']} on the stage)",
                    f"blocks x per-block bytes x micro-batches in flight; per block: {per_block}",
                    tr["block_acts"], KORTHIKANTI + "; " + ONE_F_ONE_B,
                    blocks_keeping_activations=tr["n_act_layers"], per_block_bytes=tr["layer_act"],
                    in_flight_micro_batches=tr["held"], recompute=lay.recompute, pp=lay.pp, vp=lay.vp,
                    grad_accum_m=lay.grad_accum, **dims))
    for t in layer_activation_terms(m, tr["act_setup"], lay, tr["kernels"]):
        dropped = (lay.recompute == "full" or (lay.recompute == "selective" and t.selective))
        out.append(_mem("activations", f"  per block: {t.name}" + (" (recomputed, not kept)" if dropped else ""),
                        "b s x width x bytes, / t inside the tensor-parallel region", t.bytes,
                        KORTHIKANTI, summed=False))
    if tr["embed_acts"]:
        out.append(_mem("activations", "embedding dropout mask (first stage)",
                        "b s h x 1 B x micro-batches in flight", tr["embed_acts"], KORTHIKANTI,
                        mask_bytes_per_micro_batch=tr["dropout_embed"], in_flight_micro_batches=tr["held"]))
    if tr["amp_copies"]:
        out.append(_mem("activations", "autocast's 16-bit copies of the matmul weights",
                        "2 B x matmul params on the rank", tr["amp_copies"], AUTOCAST,
                        params_on_the_rank=tr["rank_params"].total))
    if phase == "forward-end":
        out.append(_mem("activations", "minus the last block: in its forward, nothing saved yet",
                        "- per-block bytes", -tr["layer_act"], f"{FSDP2_FORWARD}; {MEASURED_FORWARD}",
                        per_block_bytes=tr["layer_act"]))
        return out
    if phase == "backward-end":
        out.append(_mem("activations", f"minus the {_blocks(tr['fsdp_done'])} done in backward (their saved "
                        "tensors freed)", "- blocks done x per-block bytes", -tr["fsdp_done"] * tr["layer_act"],
                        f"{FSDP2_BLOCKS}; {MEASURED_END}", blocks_done=tr["fsdp_done"],
                        per_block_bytes=tr["layer_act"]))
    if phase in ("block-backward", "backward-end"):
        out.append(_mem("activations", "working set of the block in backward",
                        "recomputed tensors (full block - kept) + eager score gradients",
                        tr["working"], KORTHIKANTI + "; MemTracker on a Llama model (8.4 B per score)",
                        full_block_bytes=tr["full_layer"], kept_block_bytes=tr["layer_act"],
                        score_gradient_bytes=tr["score_grad"]))
    if phase == "backward-end" and tr["fsdp_end"][1]:
        out.append(_block_gradient_term(setup, tr))
    if phase in ("block-backward", "backward-end") and tr["head_grad"]:
        out.append(_mem("activations", "the LM head's unsharded gradient, held through backward (FSDP2)",
                        "V / t x h x 16-bit bytes (the weights' compute dtype)", tr["head_grad"], FSDP2_HEAD,
                        vocab_V=m.vocab_size, d_model_h=m.d_model, tp_t=lay.tp,
                        bytes_per_weight=setup.precision_spec.weight_bytes))
    return out


def _block_gradient_term(setup: TrainingSetup, tr: dict[str, Any]) -> Term:
    """FSDP2: the block in backward's unsharded gradients, before its reduce-scatter."""
    split = tr["split"]
    if split.frozen_bytes:
        label, params = "block trainable params", split.block_trainable
    else:
        label, params = "block params (their own shapes: experts unpadded)", tr["grad_unit"]
    return _mem("activations", "the block's 16-bit gradients before its reduce-scatter", f"{label} x 16-bit bytes",
                tr["fsdp_end"][1], f"{FSDP2_REDUCE}; {MEASURED_GRAD}", **{label: params},
                bytes_per_weight=setup.precision_spec.weight_bytes)


def _buffer_terms(setup: TrainingSetup, lay: Layout, tr: dict[str, Any], phase: str, buf_at: int) -> list[Term]:
    """The buffers at ``phase``: the engine's (buffer_bytes), or at FSDP2's backward-end and
    forward-end moments its all-gather and reduce-scatter buffers when they are larger."""
    if not buf_at:
        return []
    prec, rp = setup.precision_spec, tr["rank_params"]
    engine = tr["buffers"]
    fsdp_moment = lay.is_fsdp and tr["n_act_layers"] and phase in ("backward-end", "forward-end")
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
    prefetch = tr["fsdp_end"][0] if lay.zero_stage == 3 else 0    # full shard: the gathered block's bytes
    out = []
    if prefetch:
        out.append(_mem("buffers", "the next block's all-gather, prefetched (full shard)", _block_formula(tr),
                        prefetch, f"{FSDP2_BLOCKS}; {MEASURED_END}", **block))
    split = tr["split"]
    if split.frozen_bytes:
        label, params = "block trainable params", split.block_trainable
    else:
        label = "block params" + (" (experts padded)" if tr["expert_padding"] > 1 else "")
        params = rp.block_unit
    out.append(_mem("buffers", "the previous block's reduce-scatter input", f"{label} x reduce bytes{larger}",
                    buf_at - prefetch, f"{FSDP2_REDUCE}; {MEASURED_END}",
                    **{label: params, "reduce bytes per param": 4 if prec.is_mixed else prec.grad_bytes}))
    return out


def _buffer_formula(lay: Layout, setup: TrainingSetup) -> str:
    parts = []
    if lay.sharding == "zero" and lay.zero_stage in (1, 2):
        parts.append("min(bucket, Psi) x gradient bytes (reduce bucket)")
    if lay.zero_stage == 3:
        parts.append("one gathered block (FSDP2)" if lay.is_fsdp else
                     "2 x largest module x 16-bit bytes (gathered + prefetched) + reduce bucket")
    if lay.pp > 1:
        parts.append("2 x b s h a (/ t with sp) pipeline send and receive")
    if not setup.finetune.is_full and setup.finetune.quant != "none":
        parts.append("one dequantized 16-bit weight (bitsandbytes)")
    return " + ".join(parts) or "engine buffers"


# ----------------------------------------------------------------------------- time

def _time(category: str, name: str, formula: str, value: float, source: str, unit: str = "s",
          summed: bool = True, **inputs: Any) -> Term:
    return Term(section="time", category=category, name=name, formula=formula,
                inputs={_label(k): v for k, v in inputs.items()}, value=float(value), unit=unit,
                source=source, summed=summed)


DP_NAMES = {
    "zero3-hybrid": ("gradient all-reduce across the replica groups (HSDP)",
                     "parameter all-gather in forward (per micro-batch)",
                     "parameter all-gather + gradient reduce-scatter in backward (per micro-batch)"),
    "zero3": ("parameter all-gather in forward (per micro-batch)",
              "parameter all-gather + gradient reduce-scatter in backward (per micro-batch)"),
    "fsdp-grad-op": ("parameter all-gather in forward (per micro-batch)",
                     "gradient reduce-scatter in backward (per micro-batch)"),
    "zero12": ("gradient reduce-scatter (once per step)", "parameter all-gather after the step"),
    "zero0": ("gradient all-reduce (once per step)",),
}


def _dp_kind(lay: Layout) -> str:
    if lay.zero_stage == 3:
        return "zero3-hybrid" if lay.sharding == "fsdp-hybrid" else "zero3"
    if lay.zero_stage == 2 and lay.is_fsdp:
        return "fsdp-grad-op"
    return "zero12" if lay.zero_stage in (1, 2) else "zero0"


def _link(links: dict[str, Any], axis: str) -> dict[str, Any]:
    ln = links[axis]
    return {f"{axis} bus bandwidth B (bytes/s)": ln.bus_bytes_per_s, f"{axis} hop latency alpha (s)": ln.latency_s}


def time_terms(m: ModelSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster, eff: Efficiency,
               pc: ParamCount, st: StepTime) -> list[Term]:
    """The parts of timing.step_time() for ``lay`` on the placement it chose."""
    gpu = cluster.gpu
    prec = setup.precision_spec
    p = _pipeline(m, setup, lay, cluster, eff, st.placement)
    lt = layer_time(m, setup, _layer_key(lay), _kernels(setup, lay), gpu, eff)
    n_mb = lay.grad_accum
    r = p.rates
    top = cluster.topology
    link_src = (f"topology {top.name}: {top.intra_node.source}; {top.network.source}" if top is not None
                else f"GPU catalog (no topology): {gpu.source}")
    out: list[Term] = []

    # figures the summed terms use
    dtype = prec.compute_dtype
    peak = gpu.peak_flops_per_s(dtype)
    fl = flops_per_step(m, lay.seq_len, lay.global_batch, lay.recompute)
    n_active = pc.active
    out += [
        _time("flops", "model FLOPs per step (no recomputation)", "3 x tokens x (L x block forward + LM head), "
              "2 FLOPs per multiply-add", fl.model_flops, FLOPS, unit="FLOPs", summed=False,
              tokens_per_step=st.tokens_per_step, n_layers_L=m.n_layers, d_model_h=m.d_model,
              seq_len_s=lay.seq_len, vocab_V=m.vocab_size),
        _time("flops", f"hardware FLOPs per step (recompute {lay.recompute})", "model FLOPs + recomputed forward",
              fl.hardware_flops, FLOPS, unit="FLOPs", summed=False),
        _time("flops", "Kaplan's 6N estimate, for comparison", "6 x active params x tokens",
              6 * n_active * st.tokens_per_step, KAPLAN, unit="FLOPs", summed=False,
              active_params_N=n_active, tokens_per_step=st.tokens_per_step),
        _time("rates", f"peak {dtype} FLOP/s of the GPU (dense)", "data sheet", peak, f"{gpu.full_name}: {gpu.source}",
              unit="FLOP/s", summed=False),
        _time("rates", "matmul rate", "peak x matmul fraction", r.matmul_flops_per_s, MATMUL, unit="FLOP/s",
              summed=False, peak=peak, matmul_fraction=eff.matmul_fraction if eff.matmul_fraction is not None
              else MATMUL_FRACTION.get(gpu.name, MATMUL_FRACTION_DEFAULT)),
        _time("rates", "flash-attention rate", "peak x flash fraction", r.flash_flops_per_s, FLASH, unit="FLOP/s",
              summed=False, peak=peak, flash_fraction=eff.flash_fraction if eff.flash_fraction is not None
              else FLASH_FRACTION.get(gpu.name, FLASH_FRACTION_DEFAULT)),
        _time("rates", "HBM rate of element-wise kernels", "HBM bandwidth x hbm fraction", r.hbm_bytes_per_s,
              f"{HBM}; HBM bandwidth: {gpu.source}", unit="bytes/s", summed=False,
              hbm_bytes_per_s=gpu.hbm_bytes_per_s, hbm_fraction=eff.hbm_fraction),
        _time("compute", "one block, forward, one micro-batch", "GEMMs + attention + element-wise", lt.fwd_s,
              LAYER_TIME, summed=False, micro_batch_b=lay.micro_batch, seq_len_s=lay.seq_len, tp_t=lay.tp,
              cp=lay.cp),
        _time("compute", f"one block, backward (recompute {lay.recompute}), one micro-batch",
              "2 x forward GEMMs (1 x frozen GEMMs + 2 x adapter GEMMs under LoRA) + 2.5 x flash attention "
              "+ element-wise (+ dequantization) (+ recomputed forward)", lt.bwd_s,
              LAYER_TIME, summed=False),
    ]
    for axis in ("tp", "cp", "ep", "dp", "pp"):
        size = {"tp": lay.tp, "cp": lay.cp, "ep": lay.ep, "dp": lay.dp, "pp": lay.pp}[axis]
        if size > 1:
            ln = p.links[axis]
            out.append(_time("links", f"{axis} groups of {size}: bus bandwidth per GPU",
                             "ring bandwidth of the topology graph, every group of the axis at once",
                             ln.bus_bytes_per_s, link_src, unit="bytes/s", summed=False, latency_s=ln.latency_s,
                             placement="-".join(st.placement)))

    # the step: m (t_mb) + bubble + dp + optimizer
    head = p.fwd_mb - p.n_slow * lt.fwd_s
    out.append(_time("compute", "forward compute", "m x (L_stage x block forward + LM head and loss on the last stage)",
                     n_mb * p.fwd_mb, LAYER_TIME, micro_batches_m=n_mb, blocks_on_slowest_stage=p.n_slow,
                     block_forward_s=lt.fwd_s, head_and_loss_forward_s=head, slowest_stage=p.slow_stage))
    out.append(_time("compute", f"backward compute (recompute {lay.recompute})",
                     "m x (L_backward x block backward + LM head and loss backward)", n_mb * p.bwd_mb, LAYER_TIME,
                     micro_batches_m=n_mb, blocks_with_backward=p.n_slow_bwd, block_backward_s=lt.bwd_s,
                     head_backward_gemms=head_backward_gemms(setup.finetune),
                     head_and_loss_backward_s=p.bwd_mb - p.n_slow_bwd * lt.bwd_s))
    ar = "AR(S, n) = 2(n-1) alpha + 2(n-1)/n x S / (B x bus fraction)"
    if lay.tp > 1:
        out.append(_time("communication", "tensor-parallel all-reduces, exposed",
                         f"m x (L_stage x k + edges) x AR(S, tp) x (1 - tp overlap); {ar}", p.comm_s["tp"],
                         f"{TP_COMM}; {RING}; {link_src}", micro_batches_m=n_mb, blocks=p.n_slow,
                         collectives_per_block_k=lt.tp_collectives, bytes_per_collective_S=lt.tp_bytes, tp=lay.tp,
                         bus_fraction=eff.bus_fraction, tp_overlap=eff.tp_overlap, **_link(p.links, "tp")))
    if lay.cp > 1:
        out.append(_time("communication", "context-parallel K/V ring sends, exposed",
                         "m x L_stage x max(0, passes x (cp-1) x send(S) - cp overlap x attention time); "
                         "send(S) = alpha + S / (B x bus fraction)", p.comm_s["cp"],
                         f"Liu et al. 2023, Ring Attention, arXiv:2310.01889; {link_src}", micro_batches_m=n_mb,
                         blocks=p.n_slow, bytes_per_send_S=lt.cp_bytes, passes=lt.cp_passes, cp=lay.cp,
                         cp_overlap=eff.cp_overlap, **_link(p.links, "cp")))
    if lt.ep_bytes:
        out.append(_time("communication", "expert-parallel all-to-alls, exposed",
                         "m x L_stage x k x AG(S, ep) x (1 - ep overlap); AG(S, n) = (n-1) alpha + (n-1)/n S/(B f)",
                         p.comm_s["ep"], f"{RING}; {link_src}", micro_batches_m=n_mb, blocks=p.n_slow,
                         all_to_alls_per_block_k=lt.ep_all_to_alls, bytes_S=lt.ep_bytes, ep=lay.ep,
                         ep_overlap=eff.ep_overlap, **_link(p.links, "ep")))
    if lay.pp > 1:
        out.append(_time("communication", "pipeline sends, exposed",
                         "m x 2 v x send(b s h a / t) x (1 - pp overlap); send(S) = alpha + S / (B x bus fraction)",
                         p.comm_s["pp"], f"{BUBBLE}; {link_src}", micro_batches_m=n_mb, vp=lay.vp,
                         pp_overlap=eff.pp_overlap, **_link(p.links, "pp")))
    exposed = sum(p.comm_s[ax] for ax in ("tp", "cp", "ep", "pp"))
    slow_pipe = n_mb * p.t_mb - n_mb * (p.fwd_mb + p.bwd_mb) - exposed
    if slow_pipe > 1e-12 * n_mb * p.t_mb:
        out.append(_time("communication", "slowdown of compute under hidden tp/cp/ep/pp communication",
                         "overlap slowdown x hidden seconds (= m x t_mb - compute - exposed)", slow_pipe, OVERLAP,
                         overlap_slowdown=eff.overlap_slowdown, micro_batch_time_t_mb_s=p.t_mb))
    if lay.pp > 1:
        out.append(_time("bubble", "pipeline bubble", "(p - 1) / v x t_mb", p.bubble_s, BUBBLE, pp_p=lay.pp,
                         vp_v=lay.vp, micro_batch_time_t_mb_s=p.t_mb))

    rp = trained_split(m, pc, setup, lay, p.slow_stage, p.n_slow)
    comms = _dp_comms(lay, rp, p.links, eff, gpu, prec)
    parts = _dp_parts(lay, rp, p.links, eff, gpu, prec, p.fwd_mb, p.bwd_mb)
    names = DP_NAMES[_dp_kind(lay)]
    g_b = eff.grad_reduce_bytes or prec.grad_bytes
    axis = "dp" if lay.dp > 1 else ("cp" if lay.cp > 1 else "ep")
    hidden_total = 0.0
    for i, ((exposed_s, hidden_s, per_mb), (raw_s, window, overlap, _)) in enumerate(zip(parts, comms)):
        if raw_s == 0:
            continue
        times = n_mb if per_mb else 1
        hidden_total += hidden_s * times
        name = names[i] if len(names) == len(parts) else f"data-parallel collective {i + 1}"
        out.append(_time("communication", f"{name}, exposed",
                         f"{'m x ' if per_mb else ''}max(0, C - overlap x {window} time of a micro-batch); "
                         "C = ring collective of Psi x bytes over N_d ranks: (n-1) alpha + (n-1)/n S/(B f) "
                         "(all-reduce: twice)", exposed_s * times, f"{ZERO}; {RING}; {link_src}",
                         collective_C_s=raw_s, overlap=overlap, window_s=p.fwd_mb if window == "fwd" else p.bwd_mb,
                         times=times, trainable_dense_params=rp.trainable_dense,
                         trainable_expert_params=rp.trainable_expert, frozen_weight_bytes=rp.frozen_bytes,
                         bytes_per_weight=prec.weight_bytes, bytes_per_gradient=g_b,
                         N_d=lay.dense_shard_degree, N_e=lay.expert_shard_degree,
                         bus_fraction=eff.bus_fraction, **(_link(p.links, axis) if lay.n_gpus > 1 else {})))
    if hidden_total:
        out.append(_time("communication", "slowdown of compute under hidden data-parallel communication",
                         "overlap slowdown x hidden seconds", eff.overlap_slowdown * hidden_total, OVERLAP,
                         overlap_slowdown=eff.overlap_slowdown, hidden_s=hidden_total))
    opt_s = optimizer_time_s(rp.trainable_dense, rp.trainable_expert, lay, setup, r)
    sharded = lay.zero_stage >= 1
    out.append(_time("optimizer", "optimizer update",
                     "(Psi / N_d + Psi_e / N_e) x (2 x (master + optimizer state bytes) + gradient + weight bytes) "
                     "/ HBM rate; Psi: trainable parameters", opt_s, OPT_TIME, Psi=rp.trainable_dense,
                     Psi_e=rp.trainable_expert, bytes_per_param=optimizer_bytes_per_param(setup),
                     N_d=lay.dense_shard_degree if sharded else 1, N_e=lay.expert_shard_degree if sharded else 1,
                     master_bytes=prec.master_bytes, optimizer_state_bytes=optimizer_state_bytes_per_param(setup.optimizer),
                     gradient_bytes=prec.grad_bytes, weight_bytes=prec.weight_bytes,
                     hbm_rate_bytes_per_s=r.hbm_bytes_per_s))
    rest = st.step_time_s - sum(t.value for t in out if t.summed)
    if abs(rest) > 1e-9 * st.step_time_s:
        out.append(_time("unexplained", "not itemised (planner.report.explain is behind planner.timing.model; please report it)",
                         "step time - the terms above", rest, "planner.timing.model"))
    out.append(_time("utilisation", "MFU", "model FLOPs / step time / GPUs / peak", st.mfu,
                     "Chowdhery et al. 2022, PaLM, App. B", unit="fraction", summed=False,
                     model_flops=st.model_flops, step_time_s=st.step_time_s, n_gpus=st.n_gpus, peak=peak))
    return out


# --------------------------------------------------------------------------- output

def _fmt(v: Any) -> str:
    if isinstance(v, (bool, str)):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == int(v) and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:.6g}"
    return str(v)


def _value_text(v: float, unit: str) -> str:
    from planner.report.text import gib

    if unit == "bytes":
        return f"{int(v):,} B = {gib(v)}"
    if unit == "s":
        return f"{v:.6g} s"
    if unit == "FLOPs":
        return f"{v:.6g} FLOPs"
    if unit == "FLOP/s":
        return f"{v / 1e12:,.1f} TFLOP/s"
    if unit == "bytes/s":
        return f"{v / 1e9:,.1f} GB/s"
    if unit == "fraction":
        return f"{v:.1%}"
    return f"{v:.6g} {unit}"


def _term_text(t: Term) -> list[str]:
    mark = "" if t.summed else "  (used above, not added)"
    out = [f"  {t.name}: {_value_text(t.value, t.unit)}{mark}"]
    if t.name.startswith("  per block"):
        return [f"    {t.name.strip()}: {_value_text(t.value, t.unit)}"]
    out.append(f"      = {t.formula}")
    if t.inputs:
        out.append("      inputs: " + ", ".join(f"{k} = {_fmt(v)}" for k, v in t.inputs.items()))
    out.append(f"      source: {t.source}")
    return out


def to_text(ex: Explanation) -> str:
    from planner.report.text import gib

    lay, mem = ex.layout, ex.memory
    where = f"pipeline stage {mem.stage} ({mem.n_layers_on_stage} layers)" if lay.pp > 1 else "every rank"
    out = [f"{ex.model.name} on {lay.n_gpus} x {ex.gpu.name}: {lay.describe()}", "",
           (f"MEMORY per rank at its peak ({mem.phase.replace('-', ' ')}, {where}): "
            f"{gib(mem.total)} of {gib(ex.capacity_bytes)} usable")]
    mem_terms = [t for t in ex.terms if t.section == "memory"]
    for cat in CATEGORIES:
        terms = [t for t in mem_terms if t.category == cat]
        out.append(f" {cat}: {gib(getattr(mem.breakdown, cat))}")
        for t in terms:
            out += _term_text(t)
    out.append(f" total (sum of the terms): {ex.summed('memory'):,.0f} B = {gib(ex.summed('memory'))}")
    out.append(" the peak, of the moments a step goes through:")
    for t in [t for t in mem_terms if t.category == "peak"]:
        out.append(f"  {t.name}: {_value_text(t.value, t.unit)}")
    st = ex.time
    out += ["", (f"TIME of one optimizer step: {st.step_time_s:.6g} s "
                 f"({st.tokens_per_step:,} tokens, MFU {st.mfu:.1%})")]
    time_terms = [t for t in ex.terms if t.section == "time"]
    for t in [t for t in time_terms if not t.summed and t.category != "utilisation"]:
        out += _term_text(t)
    out.append(" the step, term by term:")
    for t in [t for t in time_terms if t.summed]:
        out += _term_text(t)
    out.append(f" step time (sum of the terms): {ex.summed('time'):.6g} s")
    for t in [t for t in time_terms if t.category == "utilisation"]:
        out += _term_text(t)
    return "\n".join(out)


def to_json(ex: Explanation) -> dict[str, Any]:
    from planner.report.text import layout_json

    return {"model": ex.model.name, "gpu": ex.gpu.name, "n_gpus": ex.layout.n_gpus,
            "layout": layout_json(ex.layout),
            "memory": {"total_bytes": ex.memory.total, "capacity_bytes": ex.capacity_bytes,
                       "phase": ex.memory.phase, "stage": ex.memory.stage,
                       "fits": ex.memory.total <= ex.capacity_bytes},
            "time": {"step_time_s": ex.time.step_time_s, "mfu": ex.time.mfu,
                     "placement": list(ex.time.placement)},
            "terms": [t.as_dict() for t in ex.terms]}
