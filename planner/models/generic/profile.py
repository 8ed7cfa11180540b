"""What the generic path knows of a model no family translator is written for: its exact
parameters by module kind, and per distinct block kind the bytes autograd saves and the
FLOPs it runs, per token, measured once on transformers' own model (planner.models.generic.probe)
and cached per config (planner.models.generic.cache).

Everything here is plain numbers in tuples, so that a ModelSpec holding a profile stays
frozen and hashable and a profile round-trips through JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Bumped whenever what the probe measures or how it classifies parameters changes: a cached
# profile of another version is measured again.
# 2: saved tensors are those still held when the forward ends (probe.held_bytes), where 1
# counted each storage at its save, by address, and so missed some after a freed branch
PROFILE_VERSION = 2

PARAM_KINDS = ("attention", "mixer", "mlp", "experts", "norms", "other")


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockProfile:
    """One distinct kind of block (``n_layers`` of them, alike in class and parameter shapes).

    Parameters by module kind (exact, transformers' model on the meta device): ``attention``
    (softmax attention's projections), ``mixer`` (state-space or linear-attention mixers:
    Mamba, gated DeltaNet, RWKV...), ``mlp`` (dense MLPs and shared experts), ``experts``
    (routed experts and their router), ``norms``, ``other``.

    Measured per token of a micro-batch of one sequence of s tokens, in bf16, eager PyTorch
    ops (transformers' reference paths), no recomputation:
    saved bytes = ``saved_bytes_per_token`` + ``saved_bytes_per_token_per_seq`` x s (the
    second term: s x s attention scores, where the kernel materialises them); forward FLOPs =
    ``fwd_flops_per_token`` + ``fwd_flops_per_token_per_seq`` x s; ``bwd_flops_per_token``
    + ``bwd_flops_per_token_per_seq`` x s likewise. Both read at two sequence lengths.
    """

    name: str                       # the block's class and, where layer kinds differ, its index set
    n_layers: int
    attention: int
    mixer: int
    mlp: int
    experts: int
    norms: int
    other: int
    saved_bytes_per_token: float
    saved_bytes_per_token_per_seq: float
    fwd_flops_per_token: float
    fwd_flops_per_token_per_seq: float
    bwd_flops_per_token: float
    bwd_flops_per_token_per_seq: float

    @property
    def per_layer(self) -> int:
        return self.attention + self.mixer + self.mlp + self.experts + self.norms + self.other


@dataclass(frozen=True, kw_only=True, slots=True)
class GenericProfile:
    """A model measured on transformers' implementation (see BlockProfile for the blocks).

    ``embedding``: input embeddings (and anything before the blocks); ``head``: an untied
    output projection (0 when tied); ``final``: everything else outside the blocks (final
    norm, MTP modules transformers builds, ...). ``head_fwd_flops_per_token``: the forward
    FLOPs outside the blocks (the LM head's 2 h V, measured). ``seq_lens``: the two sequence
    lengths the block terms were read at. ``total`` equals transformers' own count.
    """

    model_type: str
    transformers_version: str
    blocks: tuple[BlockProfile, ...]
    embedding: int
    head: int
    final: int
    head_fwd_flops_per_token: float
    seq_lens: tuple[int, int]
    version: int = PROFILE_VERSION

    @property
    def n_layers(self) -> int:
        return sum(b.n_layers for b in self.blocks)

    @property
    def layers(self) -> int:
        return sum(b.per_layer * b.n_layers for b in self.blocks)

    @property
    def total(self) -> int:
        return self.embedding + self.layers + self.head + self.final

    def mean_block(self, field: str) -> float:
        """The per-layer mean of a BlockProfile field over all blocks."""
        return sum(getattr(b, field) * b.n_layers for b in self.blocks) / max(self.n_layers, 1)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> GenericProfile:
        blocks = tuple(BlockProfile(**b) for b in d["blocks"])
        return GenericProfile(**{**d, "blocks": blocks, "seq_lens": tuple(d["seq_lens"])})
