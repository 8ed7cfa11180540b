"""Mixture-of-experts routing imbalance in memory (per shape, gathered in memory.shapes):
the extra tokens the most loaded expert-parallel rank's experts receive and keep for
backward (TrainingSetup.moe_imbalance; its source there)."""

from __future__ import annotations

from planner.layouts.layout import Layout
from planner.memory.activations import layer_activation_terms
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup

# the saved tensors of a MoE block that live on the experts' side of the dispatch: the
# expert MLP's tensors and the tokens the dispatch permuted to them (memory.activations)
EXPERT_SIDE_PREFIXES = ("MLP ", "tokens permuted", "silu written", "gelu")


def expert_side_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Bytes of one block's saved tensors on the experts' side of the dispatch (the routed
    copies: k per token), per micro-batch on one rank, balanced; 0 for dense models and
    under full recomputation (the block keeps its input only)."""
    if not m.is_moe or lay.recompute == "full":
        return 0
    return sum(t.bytes for t in layer_activation_terms(m, setup, lay, kernels)
               if t.name.startswith(EXPERT_SIDE_PREFIXES))


def imbalance_extra_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Extra bytes one block of the most loaded expert-parallel rank keeps under routing
    imbalance: (moe_imbalance - 1) x its expert-side tensors (the dispatched tokens in the
    all-to-all receive buffer, which the expert GEMMs keep for backward, and the expert
    MLP's tensors). Without expert parallelism a rank holds every expert and receives k
    copies of each of its tokens however they are routed: no change."""
    imb = setup.moe_imbalance
    if not m.is_moe or lay.ep <= 1 or imb == 1.0:
        return 0
    return int((imb - 1.0) * expert_side_bytes(m, setup, lay, kernels))
