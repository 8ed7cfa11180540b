"""The rules a layout must follow, as one table of (rule, message).

Each rule's ``fails`` reads a RuleView: the fields of one Layout (Python ints and bools)
or of a batch of layouts (numpy arrays, broadcast against each other). It is written
with comparisons, ``&`` and ``|`` only, so the same expression answers for one layout and
for a batch (never ``not``, ``and``, ``or`` or ``~``, which mean something else on one
of the two). A layout is valid when no rule fails; a rejected layout's reason is the
message of the first rule that fails, in the table's order (planner.layouts.layout.
reject_reason and enumerate_layouts, planner.layouts.batch.valid_layouts).

Sources: Megatron-LM's argument checks (megatron/training/arguments.py: heads and the
MLP width divisible by tp, sequence parallelism only with tp > 1, the interleaved
schedule's micro-batch rule), DeepSpeed's pipeline engine (ZeRO stage 0 or 1 only),
PyTorch FSDP2's sharding strategies and offload policy, DeepSpeed's ZeRO-Offload and
ZeRO-Infinity (offload_config.py), bitsandbytes (data parallelism only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.layouts.layout import (
    AXIS_NAMES,
    SHARDINGS,
    Layout,
    data_parallel_size,
    dense_shard_size,
    expert_data_parallel_size,
    expert_tp_size,
    fold_indivisible,
    node_data_ranks,
)
from planner.layouts.stages import end_stage_layers, layout_refusal, split_extras
from planner.models.spec import ModelSpec
from planner.stacks import torchtitan_builds
from planner.training.moe_runtime import a2a_overlap_refused
from planner.training.pp_layout import is_layout, split_option
from planner.training.setup import TrainingSetup

FULL, GRAD_OP, HYBRID = (SHARDINGS.index(x) for x in ("fsdp-full", "fsdp-grad-op", "fsdp-hybrid"))


@dataclass(frozen=True, slots=True)
class RuleView:
    """What the rules read: a model, a set-up, GPUs per node, and the layout fields, each
    an int (one layout) or an int64 array (a batch). ``sharding`` indexes SHARDINGS (-1:
    a name SHARDINGS lacks); ``sp`` is 0/1 or a bool. ``enumerated``: 1 where the layout
    comes from enumeration, whose accumulation count comes from the micro-batch (and is
    ``grad_accum`` = 1 with no such count), 0 for a layout given as is."""

    m: ModelSpec
    setup: TrainingSetup
    gpus_per_node: int
    dp: Any
    tp: Any
    pp: Any
    cp: Any
    ep: Any
    zero_stage: Any
    sharding: Any
    sp: Any
    vp: Any
    micro_batch: Any
    grad_accum: Any
    enumerated: Any = 0
    sharding_name: str = ""
    etp: Any = 0            # expert tensor-parallel size; 0: equal to tp
    ep_fold: Any = 0        # 1: ep folded over tp x cp x dp (Layout.ep_fold), dp is Megatron's DP
    optimizer_instances: Any = 1    # Layout.optimizer_instances
    global_batch: Any = None        # the global batch (an array over a grid of batches); None: the set-up's

    @property
    def expert_tp(self) -> Any:
        return expert_tp_size(self.etp, self.tp)

    @property
    def batch(self) -> Any:
        """The global batch the rules check (``global_batch``, or the set-up's)."""
        return self.setup.global_batch if self.global_batch is None else self.global_batch

    @property
    def fsdp(self) -> Any:
        return self.sharding > 0

    @property
    def fsdp_stage(self) -> Any:
        """The ZeRO stage an FSDP sharding shards like (layout.FSDP_STAGE), 0 for ZeRO."""
        return (self.sharding == FULL) * 3 + (self.sharding == GRAD_OP) * 2 + (self.sharding == HYBRID) * 3

    @property
    def data_parallel(self) -> Any:
        """Megatron's data-parallel size (layouts.layout.data_parallel_size)."""
        return data_parallel_size(self.dp, self.ep, self.ep_fold)

    @property
    def dense_shard_degree(self) -> Any:
        return dense_shard_size(self.dp, self.cp, self.ep, self.ep_fold)

    @property
    def expert_shard_degree(self) -> Any:
        """The expert data-parallel group (layouts.layout.expert_data_parallel_size)."""
        return expert_data_parallel_size(self.dp, self.tp, self.cp, self.ep, self.expert_tp, self.ep_fold)

    @property
    def seq_len(self) -> int:
        return self.setup.seq_len

    @property
    def tp_sp(self) -> Any:
        """tp under sequence parallelism, else 1."""
        return self.tp * (self.sp > 0) + (self.sp <= 0)

    @staticmethod
    def of(m: ModelSpec, setup: TrainingSetup, lay: Layout, gpus_per_node: int, enumerated: bool = False) -> RuleView:
        sharding = SHARDINGS.index(lay.sharding) if lay.sharding in SHARDINGS else -1
        return RuleView(m=m, setup=setup, gpus_per_node=gpus_per_node, **lay.degrees(),
                        zero_stage=lay.zero_stage, sharding=sharding, sp=int(lay.sp), vp=lay.vp,
                        micro_batch=lay.micro_batch, grad_accum=lay.grad_accum, enumerated=int(enumerated),
                        sharding_name=lay.sharding, etp=lay.etp, ep_fold=int(lay.ep_fold),
                        optimizer_instances=lay.optimizer_instances)


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: ``fails(view)`` is true (elementwise) where a layout breaks it;
    ``message(view)`` (one layout) says why, in one line. ``option_message``: why, in the words
    of the options, where the rule can be checked on the degrees the user gives before any
    search (option_refusal); None where it cannot."""

    name: str
    fails: Callable[[RuleView], Any]
    message: Callable[[RuleView], str]
    option_message: Callable[[RuleView], str] | None = None


def _offloads(v: RuleView) -> bool:
    return v.setup.offload_optimizer != "none" or v.setup.offload_params != "none"


def _nvme(v: RuleView) -> bool:
    return "nvme" in (v.setup.offload_optimizer, v.setup.offload_params)


def _per_step(v: RuleView) -> Any:
    return v.micro_batch * v.data_parallel


STACK_LIMITS = {
    "torchtitan": ("--stack torchtitan shards with FSDP2 and splits no experts: use --fsdp full or grad-op "
                   "(or --zero 0), ep 1"),
    "deepspeed": ("--stack deepspeed runs ZeRO data parallelism, and tp and pp with ZeRO-0/1 as Megatron-DeepSpeed "
                  "(BLOOM, MT-NLG): no FSDP, cp, ZeRO-2/3 or experts with tp/pp (use --zero 0 or 1)"),
    "hf": "--stack hf runs FSDP2 (accelerate) without pipeline stages: use --fsdp full and pp 1",
    "megatron": ("--stack megatron runs hybrid models as Megatron's MambaModel: no virtual pipeline stages, a pp "
                 "dividing the layers and no embedding or loss in the split (use --vp 1)"),
}


def _etp(v: RuleView) -> Any:
    return v.expert_tp != v.tp


# What each stack cannot run, as (fails, message for one layout), in the order planner.stacks.stack_refusal names them
# (the first that fails); the "stack-runs" rule refuses where any fails. torchtitan 0.3.0 builds Llama-architecture
# models only (planner.stacks.torchtitan_builds), shards with FSDP2 only (ZeRO-0 is its DDP) and its Llama 3 has no
# experts; DeepSpeed runs ZeRO data parallelism, and tp and pp as Megatron-DeepSpeed under ZeRO-0/1 without experts
# (no FSDP2, no cp); Hugging Face (accelerate) runs FSDP2 without pipeline stages. Expert tensor parallelism
# (Layout.etp) is Megatron's alone among them: torchtitan 0.3.0's Parallelism has expert_parallel_degree and no expert
# tensor-parallel degree, its experts' region being (pp, dp_replicate, efsdp, ep) (config/configs.py lines 279-287,
# distributed/parallel_dims.py line 239); transformers and DeepSpeed's ZeRO split no expert.
ETP_REFUSAL = {     # the stacks that split no expert over tensor-parallel ranks (--etp, cli.request too)
    "torchtitan": ("--stack torchtitan: 0.3.0 has no expert tensor-parallel setting (its experts split over "
                   "ep and efsdp only): drop --etp or use --stack megatron"),
    "hf": "--stack hf splits no expert over tensor-parallel ranks: drop --etp or use --stack megatron",
    "deepspeed": "--stack deepspeed splits no expert over tensor-parallel ranks: drop --etp or use --stack megatron",
}
# Megatron runs a hybrid Mamba model (ModelSpec.is_hybrid) as megatron-core 0.16.1's MambaModel
# (pretrain_mamba.py): MambaStack's pipeline split (ssm/mamba_block.py
# _select_layers_for_pipeline_parallel) asserts no virtual stages and takes num_layers // pp
# layers per rank (no embedding or loss counted in the split), and MambaStack.forward checkpoints
# no layer (no full recomputation: mamba_stack_refusal). Its MambaModel builds no MTP layers, which
# later megatron-core builds for hybrids and Megatron-Bridge's Nemotron 3 recipes train: a plan
# times them (timing.layer), and only --out refuses them (emit.megatron_mamba.hybrid_layout_refusal).
_MAMBA_STACK = "--stack megatron runs hybrid models as Megatron's MambaModel, which cannot run"


def hybrid_cannot(m: ModelSpec, what: str, mamba_reason: str) -> str:
    """The refusal of ``what`` under --stack megatron for the hybrid ``m``: MambaModel's reason
    for Mamba hybrids; for gated DeltaNet hybrids (Megatron's GPTModel, planner.emit.megatron_deltanet)
    the planner writes no such arguments, the same layouts kept out as for Mamba hybrids."""
    from planner.models.deltanet import DELTANET_MODEL_TYPES

    if m.model_type in DELTANET_MODEL_TYPES:
        return (f"--stack megatron: the planner writes gated DeltaNet hybrids' Megatron arguments (GPTModel) "
                f"without {what}, not checked against megatron-core there")
    return f"{_MAMBA_STACK} {what} ({mamba_reason})"


def _mamba_uneven(v: RuleView) -> Any:
    return (v.pp > 1) & (v.m.n_layers % v.pp != 0)


def _mamba_stack_message(v: RuleView) -> str | None:
    """The first --stack megatron refusal one hybrid layout's view breaks (its messages read the
    degrees alone, which the view holds), or None."""
    if v.setup.stack != "megatron":
        return None
    for fails, message in STACK_REFUSALS["megatron"]:
        if bool(fails(v)):
            return message(v, v)  # type: ignore[arg-type]
    return None


def mamba_stack_refusal(m: ModelSpec, recompute: str) -> str | None:
    """Why megatron-core 0.16.1's MambaStack cannot run ``m`` under ``recompute`` (the one
    setting it refuses that no layout rule reads), or None: MambaStack.forward runs its layers
    without activation checkpointing (ssm/mamba_block.py), so no full recomputation."""
    if m.is_hybrid and recompute == "full":
        return (hybrid_cannot(m, "full recomputation", "MambaStack checkpoints no layer")
                + ": plan with --recompute selective or none")
    return None


STACK_REFUSALS: dict[str, tuple[tuple[Callable[[RuleView], Any], Callable[[RuleView, Layout], str]], ...]] = {
    "torchtitan": (
        (_etp, lambda v, lay: ETP_REFUSAL["torchtitan"]),
        (lambda v: (v.tp < 0) | (torchtitan_builds(v.m) is not None),
         lambda v, lay: f"--stack torchtitan: {torchtitan_builds(v.m)}"),
        (lambda v: (v.sharding <= 0) & (v.zero_stage > 0),
         lambda v, lay: (f"--stack torchtitan shards with FSDP2, not ZeRO-{lay.zero_stage}: plan with --fsdp full "
                         f"(or --zero 0)")),
        (lambda v: v.ep > 1, lambda v, lay: "--stack torchtitan: its Llama 3 model has no experts to split over ep"),
    ),
    "hf": (
        (_etp, lambda v, lay: ETP_REFUSAL["hf"]),
        (lambda v: v.sharding <= 0,
         lambda v, lay: (f"--stack hf runs FSDP2 plans (accelerate); this layout ({lay.describe()}) shards with "
                         f"ZeRO-{lay.zero_stage}: plan with --fsdp full")),
        (lambda v: v.pp > 1, lambda v, lay: f"--stack hf has no pipeline parallelism; this layout has pp={lay.pp}"),
    ),
    "megatron": (       # hybrid models only (the MambaStack comment above)
        (lambda v: (v.vp > 1) & v.m.is_hybrid,
         lambda v, lay: (hybrid_cannot(v.m, "virtual pipeline stages", "MambaStack asserts none")
                         + ": plan with --vp 1")),
        (lambda v: _mamba_uneven(v) & v.m.is_hybrid,
         lambda v, lay: (hybrid_cannot(v.m, f"{v.m.n_layers} layers over pp={lay.pp} unevenly",
                                        "MambaStack splits them evenly") + ": give a pp dividing them")),
        (lambda v: (v.pp > 1) & (v.setup.pp_balance != "none") & v.m.is_hybrid,
         lambda v, lay: (hybrid_cannot(v.m, "the embedding and loss counted in the pipeline split", "MambaStack "
                                        "splits layers alone") + f": drop {split_option(v.setup.pp_balance)}")),
    ),
    "deepspeed": (      # Megatron-DeepSpeed: tp and pp under ZeRO-0/1 (stacks.runs_megatron_deepspeed)
        (_etp, lambda v, lay: ETP_REFUSAL["deepspeed"]),
        (lambda v: v.cp > 1,
         lambda v, lay: (f"--stack deepspeed has no context parallelism; this layout ({lay.describe()}) "
                         f"has cp={lay.cp}")),
        (lambda v: ((v.tp > 1) | (v.pp > 1)) & ((v.zero_stage > 1) | (v.ep > 1)),
         lambda v, lay: ("--stack deepspeed runs tp and pp as Megatron-DeepSpeed on DeepSpeed's pipeline engine, "
                         f"which supports ZeRO-0/1 and no experts here; this layout ({lay.describe()}) needs --zero 0 "
                         "or 1 and ep 1")),
        (lambda v: v.sharding > 0,
         lambda v, lay: "--stack deepspeed shards with ZeRO stages, not FSDP2; plan with --zero N"),
    ),
}


def _stack_cannot_run(v: RuleView) -> Any:
    """Where the stack the user named (--stack) cannot run the layout: any of its
    STACK_REFUSALS fails (auto runs every layout; megatron every one but a hybrid model's that
    MambaStack cannot run)."""
    out: Any = v.tp < 0      # False, shaped as the batch
    for fails, _message in STACK_REFUSALS.get(v.setup.stack, ()):
        out = out | fails(v)
    return out


def _below_one(v: RuleView, *names: str) -> Any:
    """Where any of the view's fields ``names`` is below 1 (elementwise on a batch)."""
    out: Any = getattr(v, names[0]) < 1
    for name in names[1:]:
        out = out | (getattr(v, name) < 1)
    return out


def _balance_layers(v: RuleView) -> int:   # the split's layers besides the transformer's (stages.split_extras)
    return sum(split_extras(v.setup.pp_balance, 2, v.setup.mtp_layers))


def _rule_split(v: RuleView) -> bool:     # the split is a rule's (--pp-balance), not a stated layout
    return not is_layout(v.setup.pp_balance)


def _layout_why(v: RuleView) -> Any:    # why a layout stated with --pp-layout cannot run ("": it can)
    return layout_refusal(v.setup.pp_balance, v.setup.stack, v.pp, v.vp)


def _distributed_optimizer_noop(v: RuleView) -> Any:
    """Megatron's distributed optimizer (ZeRO-1, not FSDP) over a single data-parallel rank, as the
    user fixed it: megatron-core 0.16.1 runs it and shards nothing (DistributedOptimizer over a
    data-parallel group of one: each rank owns the whole buffer), so it is planned as the no-op it
    is: its memory and time equal --zero 0's."""
    import numpy as np

    return np.asarray((v.sharding == 0) & (v.zero_stage == 1) & (v.setup.stack == "megatron"), dtype=bool)


def _end_layers(v: RuleView) -> Any:   # layouts.stages.end_stage_layers per pp (< 0: no room for loss and MTP)
    return end_stage_layers(v.m.n_layers, v.pp, v.setup.pp_balance, v.setup.mtp_layers)


def _chunks_message(v: RuleView) -> str:
    """Why the chunks-layers rule fails; where pp x vp chunks divide the layers + 2, the way out: count
    the embedding and the loss as layers (megatron-core's account_for_embedding/loss_in_pipeline_split)."""
    chunks, n, extra = int(v.pp * v.vp), v.m.n_layers, _balance_layers(v)
    if chunks <= n + extra:     # the last stage is what is short (embedding-loss-mtp)
        return (f"--pp-balance {v.setup.pp_balance}: pp={v.pp} leaves the last stage less room than its loss and "
                f"{v.setup.mtp_layers} MTP modules take; give a smaller pp or --pp-balance none")
    out = f"pp x vp = {chunks} model chunks exceed the {n} layers" + " + embedding + loss" * bool(extra)
    if extra or chunks > n + 2 or (n + 2) % chunks:
        return out + " + MTP modules" * (extra > 2)
    return out + f"; counting the embedding and the loss as layers, {chunks} chunks divide the {n} + 2: add " \
        "--pp-balance embedding-loss"


# The layouts the generic path plans (planner/models/generic: no family says how its modules
# split); the rule below and the plan's assumptions (report.text.generic_lines) print it
GENERIC_LAYOUTS = ("data parallel, ZeRO/FSDP and pipeline stages only; tp, cp, ep and etp need a written family "
                   "(docs/models.md)")

RULES: tuple[Rule, ...] = (
    Rule("batch-divides",   # enumeration: no accumulation count makes the global batch
         lambda v: (v.enumerated > 0) & (v.batch % _per_step(v) != 0),
         lambda v: (f"global batch {v.batch} is not a multiple of micro-batch {v.micro_batch} "
                    f"x data-parallel {v.data_parallel}")),
    Rule("positive", lambda v: _below_one(v, *AXIS_NAMES, "vp", "micro_batch", "grad_accum"),
         lambda v: "every degree, the micro-batch and the accumulation steps must be >= 1"),
    Rule("stack-runs", _stack_cannot_run,
         lambda v: (f"--stack torchtitan: {torchtitan_builds(v.m)}"
                    if v.setup.stack == "torchtitan" and torchtitan_builds(v.m) is not None
                    else _mamba_stack_message(v) or STACK_LIMITS.get(v.setup.stack, ""))),
    # (before ep-dense and etp-dense: the generic path's spec holds no expert count, so an MoE
    # family planned there would be called dense)
    Rule("generic-layouts", lambda v: v.m.is_generic & ((v.tp > 1) | (v.cp > 1) | (v.ep > 1) | (v.etp > 0)),
         lambda v: (f"{v.m.model_type} is planned on the generic path (measured on transformers' model): "
                    f"{GENERIC_LAYOUTS}"),
         lambda v: (f"{v.m.name} ({v.m.model_type}) is planned on the generic path (measured on transformers' "
                    "model): data parallel, ZeRO/FSDP and pipeline stages only; drop --tp, --ep and --etp, or "
                    "plan a written family (docs/models.md)")),
    Rule("tp-heads", lambda v: v.m.n_heads % v.tp != 0,
         lambda v: f"tp={v.tp} does not divide the {v.m.n_heads} attention heads"),
    Rule("tp-kv-heads", lambda v: (v.m.n_kv_heads % v.tp != 0) & (v.tp % v.m.n_kv_heads != 0),
         lambda v: f"tp={v.tp} does not divide the {v.m.n_kv_heads} KV heads (nor is it a multiple of them)"),
    Rule("tp-mlp", lambda v: v.m.d_ff % v.tp != 0,
         lambda v: f"tp={v.tp} does not divide the MLP width {v.m.d_ff}"),
    # megatron-core 0.16.1 ssm/mamba_mixer.py MambaMixer.__init__ (lines 250, 258) asserts
    # nheads % tp == 0 and ngroups % tp == 0 (each tp rank holds whole heads and whole B/C
    # groups); 0 % tp without Mamba
    Rule("tp-mamba", lambda v: (v.m.mamba_heads % v.tp != 0) | (v.m.ssm_groups % v.tp != 0),
         lambda v: (f"tp={v.tp} does not divide the {v.m.mamba_heads} Mamba heads and {v.m.ssm_groups} "
                    f"groups (megatron-core's MambaMixer splits both); pick a divisor of {v.m.ssm_groups}")),
    # megatron-core 0.16.1 ssm/gated_delta_net.py GatedDeltaNet.forward splits q/k by qk_dim / tp and
    # v, the gate, beta and alpha by num_value_heads / tp (lines 308-316), each rank holding whole
    # key and value heads; 0 % tp without gated DeltaNet layers
    Rule("tp-deltanet", lambda v: (v.m.gdn_key_heads % v.tp != 0) | (v.m.gdn_value_heads % v.tp != 0),
         lambda v: (f"tp={v.tp} does not divide the {v.m.gdn_key_heads} key heads and {v.m.gdn_value_heads} value "
                    f"heads of the gated DeltaNet layers (megatron-core's GatedDeltaNet splits both); pick a "
                    f"divisor of {v.m.gdn_key_heads}")),
    Rule("sp-needs-tp", lambda v: (v.sp > 0) & (v.tp == 1),
         lambda v: "sequence parallelism needs tp > 1"),
    Rule("pp-layers", lambda v: v.pp > v.m.n_layers,
         lambda v: f"pp={v.pp} exceeds the {v.m.n_layers} layers"),
    Rule("vp-needs-pp", lambda v: (v.vp > 1) & (v.pp == 1), lambda v: "an interleaved schedule (vp > 1) needs pp > 1"),
    # (a layout stated with --pp-layout places every layer itself, empty virtual stages included: the pp-layout rule)
    Rule("chunks-layers", lambda v: ((v.pp * v.vp > v.m.n_layers + _balance_layers(v)) & _rule_split(v))
         | (_end_layers(v) < 0), _chunks_message),
    # megatron-core 0.16.1 TransformerConfig.__post_init__ (transformer/transformer_config.py lines
    # 1436-1480): with account_for_embedding/loss_in_pipeline_split, pp must divide num_layers + 2,
    # and vp the layers per rank
    Rule("pp-balance-divides", lambda v: (v.setup.pp_balance == "embedding-loss") & (v.pp > 1)
         & ((v.m.n_layers + 2) % (v.pp * v.vp) != 0),
         lambda v: (f"--pp-balance embedding-loss needs pp x vp = {v.pp * v.vp} to divide the "
                    f"{v.m.n_layers} layers + 2 (megatron-core's account_for_embedding/loss_in_pipeline_split); "
                    "give another pp or vp, or --pp-balance none")),
    Rule("pp-balance-stack", lambda v: (v.pp > 1) & ((v.setup.stack == "torchtitan") & (_balance_layers(v) > 0) | (
        (v.setup.pp_balance == "embedding-loss-mtp") & (v.setup.stack not in ("megatron", "auto")))), lambda v: (
        f"--pp-balance {v.setup.pp_balance} is megatron-core's split; --stack {v.setup.stack} splits its own way "
        "(use --stack megatron or --pp-balance none)")),
    Rule("pp-layout", lambda v: _layout_why(v) != "", lambda v: str(_layout_why(v))),
    # megatron-core 0.16.1 TransformerConfig.__post_init__ (under fp8; fp4: no check, the same bound applied):
    # num_layers_at_start/end_in_bf16 at most num_layers // pp; held on the end stages (training.layer_precision)
    Rule("bf16-layers-stage", lambda v: 0 < max(v.setup.bf16_layers) > _end_layers(v),   # (none kept: none counted)
         lambda v: ("--bf16-layers {},{}: pp={} leaves {} layers on the first and the last stage, fewer than the BF16 "
                    "layers each must hold (megatron-core: at most num_layers // pp at either end); give a smaller pp "
                    "or fewer BF16 layers".format(*v.setup.bf16_layers, v.pp, _end_layers(v)))),
    Rule("vp-micro-batches", lambda v: (v.vp > 1) & (v.grad_accum % v.pp != 0),
         lambda v: (f"the interleaved schedule needs the {v.grad_accum} micro-batches per step "
                    f"to be a multiple of pp={v.pp} (Megatron-LM)")),
    # megatron-core 0.16.1 schedules.py lines 995-1003: a group larger than the step's
    # micro-batches is refused (ValueError); fewer than pp is Llama 3's schedule, planned as such
    # (TrainingSetup.pp_microbatch_group) but not written for Megatron (emit.megatron)
    Rule("pp-microbatch-group", lambda v: (v.vp > 1) & (v.setup.pp_microbatch_group > v.grad_accum),
         lambda v: (f"--pp-microbatch-group {v.setup.pp_microbatch_group} exceeds the {v.grad_accum} "
                    "micro-batches per step (megatron-core's interleaved schedule)")),
    Rule("cp-sequence", lambda v: (v.cp > 1) & (v.seq_len % (2 * v.cp) != 0),
         lambda v: f"cp={v.cp} needs the sequence {v.seq_len} to split into 2 x cp equal chunks"),
    # megatron-core 0.16.1 runs Mamba layers under cp through ssm/mamba_context_parallel.py
    # (all-to-alls of the conv and scan inputs and outputs over the cp group), whose cost the
    # step time does not count yet (timing.mamba): refused rather than timed as free
    Rule("cp-mamba", lambda v: (v.cp > 1) & (v.m.n_mamba_layers > 0),
         lambda v: (f"cp={v.cp} over {v.m.name}'s Mamba-2 layers is not modelled (megatron-core's "
                    f"MambaContextParallel all-to-alls are not timed yet); plan with --cp 1")),
    # megatron-core 0.16.1 ssm/gated_delta_net.py has no context-parallel path (its
    # GatedDeltaNetContextParallel import is commented out, line 37): refused
    Rule("cp-deltanet", lambda v: (v.cp > 1) & (v.m.n_deltanet_layers > 0),
         lambda v: (f"cp={v.cp} over {v.m.name}'s gated DeltaNet layers: megatron-core 0.16.1's GatedDeltaNet "
                    "has no context-parallel path; plan with --cp 1")),
    Rule("ep-dense", lambda v: (v.ep > 1) & (not v.m.is_moe),
         lambda v: f"ep={v.ep} needs a mixture-of-experts model; {v.m.name} is dense",
         lambda v: f"--ep {v.ep} needs a mixture-of-experts model; {v.m.name} is dense"),
    Rule("ep-experts", lambda v: (v.ep > 1) & (v.m.is_moe) & (v.m.n_experts % v.ep != 0),
         lambda v: f"ep={v.ep} does not divide the {v.m.n_experts} experts"),
    Rule("etp-dense", lambda v: (v.etp > 0) & (not v.m.is_moe),
         lambda v: f"etp={v.expert_tp} needs a mixture-of-experts model; {v.m.name} is dense (drop --etp)",
         lambda v: f"--etp {v.etp} needs a mixture-of-experts model; {v.m.name} is dense: drop --etp"),
    # megatron-core 0.16.1 asks only that etp x ep x pp divide the world
    # (parallel_state.initialize_model_parallel, lines 788-795); the planner keeps the expert
    # tensor-parallel group inside the tp group, whose links it times
    Rule("etp-divides-tp", lambda v: (v.expert_tp < 1) | (v.tp % v.expert_tp != 0),
         lambda v: f"etp={v.expert_tp} does not divide tp={v.tp} (use an --etp that divides --tp)",
         lambda v: f"--etp {v.etp} does not divide --tp {v.tp}; use an --etp that divides --tp"),
    # folding: megatron-core's etp x ep x pp must divide the world (layouts.layout.fold_indivisible, its source there);
    # the planner folds for Megatron-Core only
    Rule("ep-fold-divides", lambda v: (v.ep_fold > 0) & fold_indivisible(v.tp, v.cp, v.dp, v.expert_tp, v.ep),
         lambda v: (f"etp {v.expert_tp} x ep {v.ep} = {v.expert_tp * v.ep} does not divide tp x cp x dp = "
                    f"{v.tp * v.cp * v.dp} (megatron-core: world size not divisible by etp x ep x pp); "
                    "give an --ep (or --etp) whose product divides the GPUs of a pipeline stage")),
    Rule("ep-fold-stack", lambda v: (v.ep_fold > 0) & (v.setup.stack not in ("megatron", "auto")),
         lambda v: (f"ep={v.ep} does not divide the data-parallel {v.dp}: folding expert parallelism over "
                    "tp x cp x dp is Megatron-Core's (MoE parallel folding): use --stack megatron")),
    Rule("sequence-split", lambda v: v.seq_len % (v.cp * v.tp_sp) != 0,
         lambda v: f"the sequence {v.seq_len} does not split over cp x tp = {v.cp * v.tp} ranks"),
    Rule("sharding-known", lambda v: v.sharding < 0,
         lambda v: f"unknown sharding {v.sharding_name!r}"),
    Rule("fsdp-stage", lambda v: v.fsdp & (v.zero_stage != v.fsdp_stage),
         lambda v: (f"FSDP {SHARDINGS[v.sharding][5:]} shards like ZeRO-{v.fsdp_stage}, "
                    f"not ZeRO-{v.zero_stage}")),
    Rule("zero-stage", lambda v: (v.zero_stage < 0) | (v.zero_stage > 3),
         lambda v: f"ZeRO stage {v.zero_stage} does not exist (0 to 3)"),
    Rule("sharding-needs-dp", lambda v: (v.zero_stage > 0) & (v.dense_shard_degree == 1) & (not _offloads(v))
         & ~_distributed_optimizer_noop(v),
         lambda v: "ZeRO/FSDP sharding needs more than one data-parallel rank (or offload)"),
    # megatron-core 0.16.1 transformer_config.py lines 1137-1152: fewer layers than the model has,
    # no pipeline parallelism, no recomputation
    Rule("activation-offload",
         lambda v: (v.setup.offload_activations > 0) & ((v.setup.stack != "megatron") | (v.pp > 1)
                                                        | (v.setup.offload_activations >= v.m.n_layers)),
         lambda v: (f"--offload-activations {v.setup.offload_activations} is Megatron-Core's CPU offload: it needs "
                    f"--stack megatron, pp 1 and fewer than the {v.m.n_layers} layers (megatron-core "
                    "TransformerConfig)")),
    Rule("cross-entropy-stack", lambda v: (v.setup.cross_entropy != "native") & (v.setup.stack != "megatron"),
         lambda v: (f"--cross-entropy {v.setup.cross_entropy} is Megatron-Core's cross_entropy_fusion_impl: "
                    "add --stack megatron")),
    # megatron-core 0.16.1 transformer_config.py lines 1852-1896 (training.moe_runtime)
    Rule("a2a-overlap-on",
         lambda v: (v.setup.moe_a2a_overlap == "on") & a2a_overlap_refused(v.ep, v.pp, v.vp, v.setup.mtp_layers),
         lambda v: ("--moe-a2a-overlap on needs ep > 1, at most one MTP layer and, with pp > 1, an interleaved "
                    f"schedule (--vp > 1); this layout has ep={v.ep}, pp={v.pp}, vp={v.vp} (megatron-core's "
                    "overlap_moe_expert_parallel_comm): use --moe-a2a-overlap auto or off")),
    Rule("mtp-stack", lambda v: (v.setup.mtp_layers > 0) & (v.setup.stack != "megatron"),
         lambda v: (f"--mtp {v.setup.mtp_layers}: multi-token prediction is planned as Megatron-Core trains it "
                    "(mtp_num_layers): add --stack megatron")),
    Rule("param-offload-stage", lambda v: (v.setup.offload_params != "none") & (v.zero_stage != 3),
         lambda v: "parameter offload needs ZeRO-3 or FSDP full sharding (ZeRO-Infinity, FSDP CPU offload)"),
    Rule("optimizer-offload-stage", lambda v: (v.setup.offload_optimizer != "none") & (v.zero_stage == 0),
         lambda v: "optimizer offload needs ZeRO-1 or higher (ZeRO-Offload moves the optimizer's partition)"),
    Rule("fsdp-optimizer-offload", lambda v: v.fsdp & (v.setup.offload_optimizer != "none"),
         lambda v: ("FSDP offloads parameters, gradients and the optimizer step together "
                    "(offload parameters to cpu)")),
    Rule("fsdp-nvme", lambda v: v.fsdp & (v.setup.offload_params == "nvme"),
         lambda v: "FSDP offloads to CPU memory only"),
    Rule("nvme-stage", lambda v: _nvme(v) & (v.zero_stage != 3),
         lambda v: "NVMe offload (ZeRO-Infinity) needs ZeRO-3"),
    Rule("param-offload-dp-only",
         lambda v: (v.setup.offload_params != "none") & ((v.tp > 1) | (v.pp > 1) | (v.cp > 1)),
         lambda v: "Megatron-LM does not offload parameters; offload them under pure data parallelism"),
    Rule("quant-dp-only",
         lambda v: (v.setup.finetune.quant != "none") & ((v.tp > 1) | (v.pp > 1) | (v.cp > 1)),
         lambda v: "quantized base weights (bitsandbytes) run under data parallelism only, not tp, pp or cp"),
    Rule("deepspeed-pipeline-zero", lambda v: (v.sharding == 0) & (v.zero_stage >= 2) & (v.pp > 1),
         lambda v: "DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only"),
    Rule("hybrid-nodes",
         lambda v: (v.sharding == HYBRID) & (v.dense_shard_degree <= node_data_ranks(v.gpus_per_node, v.tp)),
         lambda v: "hybrid sharding needs data-parallel ranks on more than one node"),
    # megatron-core's num_distributed_optimizer_instances (Layout.optimizer_instances): a
    # DistributedDataParallelConfig field, which the distributed optimizer (ZeRO-1) and Megatron
    # FSDP read; the planner models Megatron FSDP's instances with outer_dp_sharding_strategy
    # 'optim' (memory.states.model_state_bytes), so only full sharding
    Rule("instances-stack", lambda v: (v.optimizer_instances > 1) & (v.setup.stack != "megatron"),
         lambda v: (f"--optimizer-instances {v.optimizer_instances} is megatron-core's "
                    "num_distributed_optimizer_instances: add --stack megatron")),
    Rule("instances-sharding",
         lambda v: (v.optimizer_instances > 1) & ~(((v.sharding == 0) & (v.zero_stage == 1)) | (v.sharding == FULL)),
         lambda v: (f"--optimizer-instances {v.optimizer_instances} needs Megatron's distributed optimizer "
                    "(--zero 1) or Megatron FSDP (--fsdp full)")),
    # megatron-core 0.16.1 parallel_state.py lines 834-838 and 1263-1266: "Data parallel size
    # should be divisible by partial DistOpt shard factor", and the expert data-parallel size
    Rule("instances-divide",
         lambda v: (v.optimizer_instances > 1) & ((v.dense_shard_degree % v.optimizer_instances != 0)
                                                  | (v.expert_shard_degree % v.optimizer_instances != 0)),
         lambda v: (f"--optimizer-instances {v.optimizer_instances} does not divide the data-parallel x cp ranks "
                    f"{v.dense_shard_degree} and the expert data-parallel ranks {v.expert_shard_degree} "
                    "(megatron-core: data parallel size should be divisible by partial DistOpt shard factor)")),
    Rule("global-batch",
         lambda v: (v.enumerated <= 0) & (_per_step(v) * v.grad_accum != v.batch),
         lambda v: (f"global batch {v.batch} is not micro-batch {v.micro_batch} x "
                    f"accumulation x data-parallel {v.data_parallel}")),
)


# how a model's weights split
SPLIT_RULES = ("tp-heads", "tp-kv-heads", "tp-mlp", "tp-mamba", "tp-deltanet", "pp-layers")


def split_refusal(m: ModelSpec, tp: int, pp: int) -> str | None:
    """Why ``m``'s weights do not split over tp x pp ranks (the message of the first of
    SPLIT_RULES that fails), or None: what the inference path (memory.inference, plan
    --inference) reads from the table the training layouts follow."""
    v = RuleView(m=m, setup=TrainingSetup(), gpus_per_node=1, dp=1, tp=tp, pp=pp, cp=1, ep=1, zero_stage=0,
                 sharding=0, sp=0, vp=1, micro_batch=1, grad_accum=1)
    for rule in RULES:
        if rule.name in SPLIT_RULES and rule.fails(v):
            return rule.message(v)
    return None


def option_refusal(m: ModelSpec, tp: int | None, ep: int | None, etp: int | None) -> str | None:
    """Why the degrees the user gave (--tp, --ep, --etp; None: not given) cannot run ``m``
    whatever the search chooses, or None: the option_message of the first rule that has one
    and fails on a layout of those degrees (tp, where not given, one that --etp divides).
    What cli.request checks before a search, from the table every layout is held to."""
    v = RuleView(m=m, setup=TrainingSetup(), gpus_per_node=1, dp=1, tp=tp or etp or 1, pp=1, cp=1, ep=ep or 1,
                 zero_stage=0, sharding=0, sp=0, vp=1, micro_batch=1, grad_accum=1, etp=etp or 0)
    for rule in RULES:
        if rule.option_message is not None and rule.fails(v):
            return rule.option_message(v)
    return None


def first_failing(v: RuleView) -> Rule | None:
    """The first rule one layout's view breaks, or None."""
    for rule in RULES:
        if rule.fails(v):
            return rule
    return None


def valid_mask(v: RuleView) -> Any:
    """Where no rule fails (a batch's views: a bool array, broadcast over the fields' shapes).
    The rules' answers are joined per shape first, then broadcast together: over a grid of
    global batches (layouts.batch.valid_layouts_of_batches) only the few rules that read the
    batch span its axis."""
    import numpy as np

    fails: dict[tuple[int, ...], Any] = {}
    for rule in RULES:
        f = np.asarray(rule.fails(v), dtype=bool)
        fails[f.shape] = fails[f.shape] | f if f.shape in fails else f
    bad: Any = False
    for f in fails.values():
        bad = bad | f
    return ~np.asarray(bad, dtype=bool)


def first_failing_index(v: RuleView) -> Any:
    """Per layout of a batch's view: the index in RULES of the first rule it breaks, or
    len(RULES) where it breaks none."""
    import numpy as np

    idx: Any = np.int64(len(RULES))
    for i in range(len(RULES) - 1, -1, -1):
        idx = np.where(np.asarray(RULES[i].fails(v), dtype=bool), i, idx)
    return idx

