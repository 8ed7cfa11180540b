"""Layers kept in BF16 under a low-precision recipe: megatron-core's first_last_layers_bf16.

megatron-core 0.16.1 (transformer/transformer_config.py, TransformerConfig
``first_last_layers_bf16``, ``num_layers_at_start_in_bf16``, ``num_layers_at_end_in_bf16``;
fp8_utils.py is_first_last_bf16_layer and get_fp8_context, fp4_utils.py get_fp4_context) runs
the first N and the last M transformer layers of the model (global layer numbers, whatever the
pipeline stage) outside the FP8/FP4 autocast: their linear layers run BF16 GEMMs, cast nothing,
and keep no low-precision weight copy. The same config refuses it under delayed scaling
("Delayed scaling does not support first / last layer in BF16": entering and leaving the FP8
context per layer breaks the amax reduction) and, under FP8, refuses more BF16 layers at
either end than ``num_layers // pipeline_model_parallel_size``.

Megatron-Bridge sets it per recipe (src/megatron/bridge/training/mixed_precision.py):
``nemotron_3_super_bf16_with_nvfp4_mixed`` keeps the last 14 of Nemotron 3 Super's 88 layers
(start 0, end 14); ``bf16_with_nvfp4_mixed`` (the Llama NVFP4 recipes) keeps none;
``bf16_with_fp8_current_scaling_mixed`` keeps 1 and 1, but the performance recipes' precision
(perf_recipes/_common.py ``_perf_precision("fp8_cs")``) turns it off; ``bf16_with_mxfp8_mixed``
keeps none.

TrainingSetup.bf16_layers holds (start, end); (0, 0) is none. The planner places the start
layers on the first pipeline stage and the end layers on the last (layouts.rules refuses more
than those stages hold): exact without an interleaved schedule; under vp > 1 megatron-core puts
the first layers in model chunk 0 and the last in the last chunk, which spill over several
ranks where a chunk holds fewer layers than the count (the planner then overstates the first
and last stages' share). A layer is timed and held as the model's mean block (a hybrid model's
last layers are not told apart by kind).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.training.setup import TrainingSetup

# the one recipe megatron-core refuses them under (TransformerConfig.__post_init__)
REFUSED_RECIPE = "delayed"


def bf16_layer_refusal(setup: TrainingSetup, n_layers: int) -> str | None:
    """Why ``setup.bf16_layers`` cannot be planned for a model of ``n_layers`` layers, or None:
    two whole numbers >= 0, at most the model's layers together, under a low-precision
    precision whose recipe is not delayed scaling (megatron-core's rule, module docstring)."""
    value = setup.bf16_layers
    if value == (0, 0):
        return None
    if (not isinstance(value, tuple) or len(value) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)):
        return f"--bf16-layers {value!r} (bf16_layers) must be two whole numbers START,END of 0 or more"
    if setup.precision_spec.fp8 is None:
        return (f"--bf16-layers {value[0]},{value[1]} keeps layers out of a low-precision recipe: it needs "
                "--precision fp8 or nvfp4 (drop it under --precision " + setup.precision + ")")
    if setup.precision_spec.fp8.name == REFUSED_RECIPE:
        return ("--bf16-layers under delayed scaling: megatron-core refuses first/last BF16 layers with "
                "--fp8-recipe delayed (the stack's default); give --fp8-recipe tensorwise, mxfp8 or blockwise")
    if sum(value) > n_layers:
        return (f"--bf16-layers {value[0]},{value[1]} asks for {sum(value)} BF16 layers of a model with "
                f"{n_layers}; give at most {n_layers} together")
    return None


def stage_bf16_layers(stage: Any, pp: Any, n_stage_layers: Any, bf16_layers: tuple[int, int]) -> Any:
    """BF16 layers a pipeline stage holds (ints or numpy arrays alike; 0 where none are kept): the
    start layers on stage 0, the end layers on stage pp - 1, at most the stage's
    ``n_stage_layers`` (with pp = 1 the one stage holds both ends; they overlap only where
    start + end exceed its layers). Written with operators only, so that `plan --help`, which
    imports the set-up rules, does not import numpy."""
    start, end = bf16_layers
    if not start and not end:
        return 0
    held = (stage == 0) * start + (stage == pp - 1) * end
    return held - (held > n_stage_layers) * (held - n_stage_layers)


def bf16_layer_setup(setup: TrainingSetup) -> TrainingSetup:
    """The set-up one BF16 layer runs under: ``setup`` in bf16 mixed precision (its GEMMs at
    the BF16 rate, no casts, no FP8 attention: megatron-core's layer runs outside the FP8/FP4
    context), for the per-block time of such a layer (timing.layer.block_table)."""
    return replace(setup, precision="bf16-mixed", fp8_attention=False, fp8_param_gather=False, bf16_layers=(0, 0))
