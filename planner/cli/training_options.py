"""click's options of the training set-up: the stack's runtime (Megatron-Core's loss, MoE
overlap and dispatch, CUDA graphs), precision and FP8, optimizer, kernels, memory allowances,
offload and the stack; the confidence levels of the interval tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from planner.cli.options import Decorator, apply_options, default_of
from planner.cli.types import FiniteFloatRange, LayerPair
from planner.training.checks import MAX_MOE_IMBALANCE, MIN_USABLE_MEMORY
from planner.training.fp8 import FP8_RECIPE_CHOICES
from planner.training.moe_runtime import A2A_OVERLAPS, CUDA_GRAPHS, DISPATCHERS
from planner.training.setup import (
    ATTENTION,
    CROSS_ENTROPIES,
    KERNELS,
    OFFLOAD,
    OPTIMIZERS,
    PRECISIONS,
    STACKS,
)
from planner.training.setup import DEFAULT_SETUP as _S

# The levels of the interval tables (report/memory_intervals.json, timing/step_intervals.json),
# spelt here so that the CLI's import reads no table (tests/test_cli_help.py checks they agree)
CONFIDENCE_LEVELS = ("0.5", "0.8", "0.9", "0.95")


def confidence_option(name: str, help_text: str) -> Decorator:
    """--fit-confidence or --time-confidence: one of CONFIDENCE_LEVELS, as a float (None: not given)."""
    return click.option(name, type=click.Choice(CONFIDENCE_LEVELS), default=None,
                        callback=lambda _c, _p, v: None if v is None else float(v), help=help_text)



def megatron_runtime_options() -> list[Decorator]:
    """--stack megatron's runtime: the loss kernel, the MoE all-to-all overlap, CUDA graphs, the
    token dispatcher, FP8 attention."""
    return [
        click.option("--cross-entropy", type=click.Choice(CROSS_ENTROPIES), default=default_of("cross_entropy"),
                     show_default=True,
                     help="--stack megatron's loss: 'native' keeps the logits' exp in fp32 for backward "
                          "(Megatron-Core's vocab-parallel cross entropy); 'te' is Transformer Engine's, which keeps "
                          "only the 16-bit logits with their gradient written in place (Megatron-Core's "
                          "cross_entropy_fusion_impl; Megatron-Bridge's Llama 3 recipes)."),
        click.option("--moe-a2a-overlap", type=click.Choice(A2A_OVERLAPS), default=default_of("moe_a2a_overlap"),
                     show_default=True,
                     help="--stack megatron, MoE with ep > 1: hide the expert-parallel all-to-alls under another "
                          "micro-batch's compute (Megatron-Core's overlap_moe_expert_parallel_comm); 'auto' where "
                          "Megatron-Core runs it (no full recomputation, at most one MTP layer; with pp, vp set)."),
        click.option("--cuda-graphs", type=click.Choice(CUDA_GRAPHS), default=default_of("cuda_graphs"),
                     show_default=True,
                     help="--stack megatron's CUDA graphs: 'moe' captures attention and the MoE router and "
                          "preprocessing (a dropless MoE layer still syncs its token counts to the host), "
                          "'full-iteration' the whole step, without that sync (Megatron-Core's cuda_graph_impl and "
                          "cuda_graph_scope)."),
        click.option("--moe-dispatcher", type=click.Choice(DISPATCHERS), default=default_of("moe_dispatcher"),
                     show_default=True,
                     help="--stack megatron's MoE token dispatcher: 'alltoall' sends each routed copy of a token to "
                          "its expert's rank; 'flex' (DeepEP or HybridEP) sends a token once per remote node and "
                          "forwards it over NVLink there, which cuts the cross-node all-to-all."),
        click.option("--fp8-attention", is_flag=True, default=default_of("fp8_attention"),
                     help="--stack megatron with --precision fp8: Transformer Engine's FP8 fused attention "
                          "(Megatron-Core's fp8_dot_product_attention)."),
    ]


def setup_options() -> list[Decorator]:
    """MTP, compile, precision and FP8, MoE imbalance, optimizer, attention, kernels, the
    allocator's fragmentation and the usable memory, the memory interval's confidence."""
    return [
        click.option("--mtp", type=click.IntRange(0, 64), default=default_of("mtp"), metavar="N",
                     help="--stack megatron: N multi-token prediction modules on the last pipeline stage, each a "
                          "block, a projection and its own loss (DeepSeek-V3 Sec. 2.2; Megatron-Core's "
                          f"mtp_num_layers)  [default: {_S.mtp_layers}]."),
        click.option("--compile", is_flag=True, default=default_of("compile"),
                     help="torch.compile each block (--stack torchtitan: compile.components=['model'])."),
        click.option("--precision", type=click.Choice(PRECISIONS), default=default_of("precision"), show_default=True,
                     help="nvfp4: bf16 mixed precision whose blocks' linear layers run Transformer Engine's "
                          "NVFP4 recipe (Blackwell)."),
        click.option("--fp8-recipe", type=click.Choice(FP8_RECIPE_CHOICES), default=default_of("fp8_recipe"),
                     show_default=True,
                     help="Under --precision fp8: tensorwise (torchao, float8 all-gather; under --stack megatron "
                          "Transformer Engine's current scaling), rowwise (torchao; torchtitan's default), delayed "
                          "(Transformer Engine; Megatron-LM's), blockwise (DeepSeek-V3), mxfp8 (Transformer "
                          "Engine, 1x32 blocks). auto: the --stack's default, rowwise without one."),
        click.option("--fp8-param-gather", is_flag=True, default=default_of("fp8_param_gather"),
                     help="--stack megatron, --precision fp8: keep the blocks' linear weights in FP8 only, no "
                          "16-bit copy (Megatron-LM --fp8-param-gather; Megatron-Bridge's FP8 recipes set it)."),
        click.option("--bf16-layers", type=LayerPair(), default=default_of("bf16_layers"), metavar="START,END",
                     help="Under --precision fp8 or nvfp4: keep the first START and the last END layers in BF16 "
                          "(their GEMMs at the BF16 rate, no casts, no low-precision weight copy; Megatron-Core's "
                          "first_last_layers_bf16; Nemotron 3 Super's NVFP4 recipe: 0,14)  [default: 0,0: none]."),
        click.option("--moe-imbalance", type=FiniteFloatRange(1.0, MAX_MOE_IMBALANCE),
                     default=default_of("moe_imbalance"), show_default=True,
                     help="MoE routing: tokens the most loaded expert-parallel rank receives over its balanced "
                          "share (scales its expert activations, expert GEMMs and all-to-alls). 1.0 balanced; "
                          "Switch Transformer trains with capacity factor 1.25 (Fedus et al. 2021, Table 1)."),
        click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=default_of("optimizer"), show_default=True),
        click.option("--attention", type=click.Choice(ATTENTION), default=default_of("attention"), show_default=True,
                     help="flash/SDPA, or eager that materialises the s x s scores."),
        click.option("--kernels", type=click.Choice(KERNELS), default=default_of("kernels"), show_default=True,
                     help="eager PyTorch ops (Hugging Face models) or fused Megatron kernels; auto: fused with "
                          "tp/pp/cp."),
        click.option("--fragmentation", type=FiniteFloatRange(0, 1), default=None,
                     help="Allocator fragmentation as a fraction of tensor memory  "
                          f"[default: {_S.overheads.fragmentation:.2f}]."),
        click.option("--usable-memory", type=FiniteFloatRange(MIN_USABLE_MEMORY, 1),
                     default=default_of("usable_memory"),
                     show_default=True,
                     help="Fraction of the GPU's memory a plan may use."),
        confidence_option("--fit-confidence", "Fit at the upper end of the memory interval at this level (from "
                                              "the memory model's measured errors) instead of at the predicted peak."),
    ]


def offload_option(name: str, help_text: str) -> Decorator:
    """--offload-optimizer or --offload-params: where ZeRO/FSDP keeps that state (OFFLOAD)."""
    return click.option(f"--{name.replace('_', '-')}", type=click.Choice(OFFLOAD), default=default_of(name),
                        show_default=True, help=help_text)


def stack_option(help_text: str) -> Decorator:
    """--stack: a training stack of planner.stacks.STACKS (None: what fits the layout)."""
    return click.option("--stack", type=click.Choice(STACKS), default=None, help=help_text)


def offload_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--offload-optimizer and --offload-params as `plan explain` takes them."""
    return apply_options([
        offload_option("offload_optimizer", "As for `plan`: optimizer states in CPU memory or on NVMe."),
        offload_option("offload_params", "As for `plan`: parameters in CPU memory or on NVMe."),
    ], f)


def stack_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--stack as `plan explain` takes it: the memory profile the terms follow."""
    return stack_option("As for `plan`: the training stack whose memory profile the terms follow.")(f)

