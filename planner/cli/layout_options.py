"""click's options of the model, the GPUs and the layout (parallel degrees, sharding, pipeline,
batch, recomputation), and layout_options(): every option shared by `plan` and the commands that
take a layout, in their help's order (the training set-up's from training_options)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from planner.cli.complete import complete_gpus, complete_models
from planner.cli.options import Decorator, apply_options, default_of
from planner.cli.sizes import SeqLength, SequenceCount, TokenBatch
from planner.cli.training_options import confidence_option, megatron_runtime_options, setup_options
from planner.layouts.layout import AXES, FSDP_STAGE, SearchSpace
from planner.training.checks import MAX_RECOMPUTE_EVERY
from planner.training.setup import DEFAULT_SETUP as _S
from planner.training.setup import (
    DS_CHECKPOINTING,
    FSDP_PIPELINE_GRAD_SYNCS,
    MAX_GLOBAL_BATCH,
    MAX_GPUS,
    MAX_MICRO_BATCH,
    MAX_SEQ_LEN,
    PP_BALANCES,
    RECOMPUTE,
    RECOMPUTE_METHODS,
)

_SPACE = SearchSpace()          # the search's defaults (micro-batches tried)


def _degree(name: str, more: str = "") -> Decorator:
    return click.option(f"--{name}", type=click.IntRange(1, MAX_GPUS), default=None,
                        help=f"Fix the {name.upper()} degree (default: searched).{more}")



def placement_options() -> list[Decorator]:
    """The model, the GPUs, the parallel degrees, the sharding and the pipeline's split."""
    return [
        click.option("--model", "model_name", metavar="NAME|PATH", shell_complete=complete_models,
                     help="A preset (`plan models`), a Hugging Face config.json, or ORG/NAME from the "
                          "Hugging Face cache."),
        click.option("--gpus", "gpu_name", metavar="NAME", shell_complete=complete_gpus,
                     help="GPU type (`plan gpus`), e.g. h100, or your GPU's TOML file (./my-gpu.toml); "
                          "`plan --tokens` takes a list to choose from, e.g. h100,a100."),
        click.option("--n-gpus", type=click.IntRange(1, MAX_GPUS), default=None,
                     help="Fix the GPU count (default: the smallest that fits)."),
        click.option("--max-gpus", type=click.IntRange(1, MAX_GPUS), default=default_of("max_gpus"), show_default=True,
                     help="The largest GPU count the search tries."),
        *(_degree(a.name, a.note) for a in AXES),
        click.option("--etp", type=click.IntRange(1, MAX_GPUS), default=None,
                     help="Expert tensor-parallel size, dividing --tp (Megatron's "
                          "--expert-tensor-parallel-size; default: equal to tp)."),
        click.option("--optimizer-instances", type=click.IntRange(1, MAX_GPUS), default=1, show_default=True,
                     help="HSDP over distributed-optimizer instances (--stack megatron, --zero 1 or --fsdp full; "
                          "megatron-core's num_distributed_optimizer_instances): docs/options.md."),
        click.option("--zero", type=click.IntRange(0, 3), default=None, help="Fix the ZeRO stage (0-3)."),
        click.option("--fsdp", type=click.Choice([s.removeprefix("fsdp-") for s in FSDP_STAGE]), default=None,
                     help="Shard with PyTorch FSDP instead of ZeRO."),
        click.option("--fsdp-pipeline-grad-sync", type=click.Choice(FSDP_PIPELINE_GRAD_SYNCS),
                     default=default_of("fsdp_pipeline_grad_sync"),
                     show_default=True,
                     help="FSDP under a pipeline: reduce-scatter the gradients once a step (PyTorch's pipeline "
                          "schedules; unsharded gradients held until then) or after every micro-batch (into "
                          "sharded fp32 gradients, as Llama 3 trained). No effect without FSDP and pp > 1."),
        click.option("--pp-balance", type=click.Choice(PP_BALANCES), default=default_of("pp_balance"),
                     show_default=True,
                     help="The pipeline's layer split: 'embedding-loss' counts the embedding and the loss as one "
                          "layer each, so the first and last stages hold one block fewer (Llama 3's balance; "
                          "Megatron-LM's --account-for-embedding/loss-in-pipeline-split). Needs pp x vp to divide "
                          "the layers + 2. 'embedding-loss-mtp' counts each --mtp module as a layer too, on the "
                          "last stage (Megatron-Bridge's DeepSeek-V3 layouts; --out megatron writes it as "
                          "--pipeline-model-parallel-layout, no divisibility needed). Without it the MTP modules "
                          "sit on the last stage on top of its layers."),
        click.option("--pp-layout", metavar="LAYOUT", default=None,
                     help="The pipeline's split stated layer by layer in megatron-core's syntax, e.g. "
                          "'Et*4|(t*4|)*14tmL' (E embedding, t layer, m MTP module, L loss, '|' ends a virtual "
                          "stage): --pipeline-model-parallel-layout as Megatron-Bridge's recipes set it. Needs "
                          "--pp and --stack megatron; vp is its virtual stages / pp. --out megatron writes it."),
        click.option("--pp-microbatch-group", type=click.IntRange(0, MAX_GLOBAL_BATCH),
                     default=default_of("pp_microbatch_group"),
                     help="Interleaved 1F1B (vp > 1): micro-batches run through one model chunk before the next "
                          "(Megatron-Core's microbatch_group_size_per_vp_stage; 0: pp, its default). Stage r's "
                          "warm-up holds (pp - r - 1) x 2 + (vp - 1) x N chunks; Megatron-Core accepts N from pp "
                          "to the micro-batches per step, Llama 3's schedule fewer."),
    ]


def batch_options() -> list[Decorator]:
    """Virtual stages, sequence parallelism, the batch and recomputation."""
    return [
        click.option("--vp", type=click.IntRange(1, 64), default=None,
                     help="Virtual stages per pipeline rank (interleaved 1F1B)."),
        click.option("--sp/--no-sp", default=None, help="Sequence parallelism with tp (default: on when tp > 1)."),
        click.option("--micro-batch", type=click.IntRange(1, MAX_MICRO_BATCH), default=None,
                     help=f"Fix the micro-batch (default: searched over {', '.join(map(str, _SPACE.micro_batches))})."),
        click.option("--seq-len", type=SeqLength(MAX_SEQ_LEN), default=None,
                     help="Sequence length in tokens: 4096, 8k, 128k (k = 1,024)  [default: "
                          f"{_S.seq_len}, or a learned "
                          "position table's length where shorter: GPT-2 1024, BERT 512]."),
        click.option("--global-batch", type=SequenceCount(MAX_GLOBAL_BATCH), default=None,
                     help=f"Sequences per optimizer step  [default: {_S.global_batch}]."),
        click.option("--global-batch-tokens", type=TokenBatch(), default=None,
                     help="Tokens per optimizer step instead: 4M, 512k (binary: 4M = 4,194,304), "
                          "divided by --seq-len to the nearest whole sequence."),
        click.option("--grad-accum", type=click.IntRange(1, MAX_GLOBAL_BATCH), default=None,
                     help="Gradient-accumulation steps (sets the global batch; needs --micro-batch and --dp)."),
        click.option("--recompute", type=click.Choice(RECOMPUTE), default=None,
                     help="Activation recomputation (default: searched). Under --stack torchtitan, selective is "
                          "its SelectiveAC per-op policy and full its FullAC."),
        click.option("--recompute-every", type=click.IntRange(1, MAX_RECOMPUTE_EVERY),
                     default=default_of("recompute_every"), show_default=True,
                     help="Checkpoint one block in k with --recompute; the others keep everything (torchtitan <= 0.2 "
                          "selective_ac_option=k, Megatron-LM: use --recompute-method block)."),
        click.option("--recompute-method", type=click.Choice(RECOMPUTE_METHODS), default=None,
                     help="--stack megatron --recompute full: uniform checkpoints groups of --recompute-num-layers "
                          "layers (each keeps its input); block checkpoints the first N layers of each (virtual) "
                          f"pipeline stage and keeps everything of the rest  [default: {_S.recompute_method}]."),
        click.option("--recompute-num-layers", type=click.IntRange(1, MAX_RECOMPUTE_EVERY), default=None,
                     help="N for --recompute-method (Megatron-LM --recompute-num-layers; needs --pp fixed when "
                          f"N > 1 or block)  [default: {_S.recompute_num_layers}]."),
        click.option("--ds-checkpointing", type=click.Choice(DS_CHECKPOINTING),
                     default=default_of("ds_checkpointing"), show_default=True,
                     help="--stack deepspeed with --recompute full: DeepSpeed's partition_activations and/or "
                          "cpu_checkpointing for the checkpointed inputs."),
        click.option("--recompute-modules", metavar="LIST", default=None,
                     help="--stack megatron --recompute selective: the modules Megatron-Core recomputes, "
                          "comma-separated: core_attn, layernorm, moe_act, mla_up_proj, mlp (its "
                          "recompute_modules)  [default: core_attn]."),
        click.option("--offload-activations", type=click.IntRange(0, 1 << 20),
                     default=default_of("offload_activations"),
                     metavar="N",
                     help="--stack megatron, pp 1, no recomputation: the saved activations of N layers go to "
                          "CPU memory in forward and return in backward (Megatron-Core's "
                          "cpu_offloading_num_layers); the host copy is on the host memory line  "
                          f"[default: {_S.offload_activations}]."),
    ]


def layout_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by `plan` and the commands that take a layout."""
    return apply_options([
        *placement_options(),
        *megatron_runtime_options(),
        *batch_options(),
        *setup_options(),
        confidence_option("--time-confidence", "Plan with step times that are not exceeded with this "
                                               "confidence (out-of-sample errors on published runs), so "
                                               "--deadline is met with it."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema in docs/options.md)."),
    ], f)
