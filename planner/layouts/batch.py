"""Layouts as arrays (one int64 array per field), and the valid layouts of a GPU count
as one batch: what the batched memory and step-time models evaluate.

numpy is imported by this package's batch modules only (never by `plan --help`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.layouts.layout import (
    FSDP_STAGE,
    SHARDINGS,
    Layout,
    SearchSpace,
    degree_shapes,
    shardings_of,
)
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup

RECOMPUTES = ("none", "selective", "full")


class Unsupported(Exception):
    """The set-up or the numbers are outside what the batched models cover."""


@dataclass(frozen=True, slots=True)
class LayoutArrays:
    """Layouts as one int64 array per field (struct of arrays). ``sharding`` indexes
    layouts.SHARDINGS and ``recompute`` RECOMPUTES; ``sp`` is 0 or 1."""

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    zero_stage: np.ndarray
    sharding: np.ndarray
    sp: np.ndarray
    vp: np.ndarray
    micro_batch: np.ndarray
    grad_accum: np.ndarray
    recompute: np.ndarray

    FIELDS = ("dp", "tp", "pp", "cp", "ep", "zero_stage", "sharding", "sp", "vp", "micro_batch",
              "grad_accum", "recompute")

    def __len__(self) -> int:
        return len(self.dp)

    @staticmethod
    def from_layouts(layouts: Sequence[Layout]) -> LayoutArrays:
        rows = [(x.dp, x.tp, x.pp, x.cp, x.ep, x.zero_stage, SHARDINGS.index(x.sharding), x.sp, x.vp,
                 x.micro_batch, x.grad_accum, RECOMPUTES.index(x.recompute)) for x in layouts]
        a = np.array(rows, dtype=np.int64).reshape(-1, 12)
        return LayoutArrays(*(a[:, i].copy() for i in range(12)))

    @staticmethod
    def concat(parts: Sequence[LayoutArrays]) -> LayoutArrays:
        if not parts:
            return LayoutArrays.from_layouts([])
        return LayoutArrays(*(np.concatenate([getattr(p, f) for p in parts]) for f in LayoutArrays.FIELDS))

    def layout(self, i: int, seq_len: int) -> Layout:
        return Layout(dp=int(self.dp[i]), tp=int(self.tp[i]), pp=int(self.pp[i]), cp=int(self.cp[i]),
                      ep=int(self.ep[i]), zero_stage=int(self.zero_stage[i]),
                      sharding=SHARDINGS[int(self.sharding[i])], sp=bool(self.sp[i]), vp=int(self.vp[i]),
                      micro_batch=int(self.micro_batch[i]), grad_accum=int(self.grad_accum[i]),
                      seq_len=seq_len, recompute=RECOMPUTES[int(self.recompute[i])])

def supports(setup: TrainingSetup) -> bool:
    """Whether peak_bytes() and valid_layouts() mirror planner.memory.model and planner.layouts.layout
    for this set-up."""
    return (setup.finetune.method == "full" and not setup.finetune.paged_8bit_optimizer
            and setup.finetune.quant == "none")


def valid_layouts(m: ModelSpec, setup: TrainingSetup, n_gpus: int, gpus_per_node: int,
                  space: SearchSpace | None = None) -> LayoutArrays:
    """The layouts layouts.enumerate_layouts() yields with no reject reason, in the same
    order, as arrays. The parallel degrees are walked in Python (a few hundred
    combinations); sharding, virtual stages, micro-batch and recomputation form a grid
    whose rules (layouts.reject_reason, one mask per rule) are array operations."""
    if not supports(setup):
        raise Unsupported("only full training is vectorised")
    space = space or SearchSpace()
    shapes = list(degree_shapes(m, n_gpus, gpus_per_node, space))   # enumerate_layouts' order
    shardings = shardings_of(space)
    vps = [space.vp] if space.vp is not None else [1, 2]
    mbs, rcs = list(space.micro_batches), [RECOMPUTES.index(r) for r in space.recomputes]
    if not shapes or not mbs or not rcs:
        return LayoutArrays.from_layouts([])
    # Each rule is computed on the axes it reads, (shape, sharding, vp, micro-batch)
    # broadcast; recomputation is read by no rule. S, K, V, M: shapes, shardings, vps, mbs.
    sh = np.array(shapes, dtype=np.int64)
    tp, cp, ep, pp, dp = (sh[:, i][:, None, None, None] for i in range(5))          # (S,1,1,1)
    sharding = np.array([SHARDINGS.index(name) for name, _ in shardings], dtype=np.int64)[None, :, None, None]
    zero = np.array([stage for _, stage in shardings], dtype=np.int64)[None, :, None, None]   # (1,K,1,1)
    vp = np.array(vps, dtype=np.int64)[None, None, :, None]                          # (1,1,V,1)
    mb = np.array(mbs, dtype=np.int64)[None, None, None, :]                          # (1,1,1,M)
    sp = (tp > 1) if space.sp is None else np.full(tp.shape, bool(space.sp))
    per_step = mb * dp * ep                                                          # (S,1,1,M)
    ga = setup.global_batch // per_step
    seq, L = setup.seq_len, m.n_layers
    fsdp = sharding > 0
    dense_deg = dp * cp * ep
    # grad_accum_for, then layouts.reject_reason's rules in its order
    ok_sm = (setup.global_batch % per_step == 0) & (ga >= 1) & (mb >= 1) & (mb * ga * dp * ep == setup.global_batch)
    ok_s = ((m.n_heads % tp == 0) & ((m.n_kv_heads % tp == 0) | (tp % m.n_kv_heads == 0)) & (m.d_ff % tp == 0)
            & ~(sp & (tp == 1)) & (pp <= L) & ~((cp > 1) & (seq % (2 * cp) != 0)) & ~((ep > 1) & (not m.is_moe))
            & (seq % (cp * np.where(sp, tp, 1)) == 0))
    if m.is_moe:
        ok_s &= ~((ep > 1) & (m.n_experts % ep != 0))
    keep_v = (vp == 1) | (pp > 1) if space.vp is None else np.ones((1, 1, 1, 1), dtype=bool)   # vps per pp
    ok_sv = keep_v & (vp >= 1) & ~((vp > 1) & (pp == 1)) & (pp * vp <= L)
    ok_svm = ~((vp > 1) & (ga % pp != 0))
    fsdp_stage = np.array([FSDP_STAGE.get(x, -1) for x in SHARDINGS])
    ok_k = ~(fsdp & (zero != fsdp_stage[sharding])) & (zero >= 0) & (zero <= 3)
    off_opt, off_params = setup.offload_optimizer, setup.offload_params
    ok_sk = ~((zero > 0) & (dense_deg == 1)) if off_opt == "none" and off_params == "none" else np.ones((1,), bool)
    if off_params != "none":
        ok_sk = ok_sk & (zero == 3) & (tp == 1) & (pp == 1) & (cp == 1) & ~(fsdp & (off_params == "nvme"))
    if off_opt != "none":
        ok_sk = ok_sk & (zero != 0) & ~fsdp
    if "nvme" in (off_opt, off_params):
        ok_sk = ok_sk & (zero == 3)
    ok_sk = (ok_sk & ~((sharding == 0) & (zero >= 2) & (pp > 1))
             & ~((sharding == SHARDINGS.index("fsdp-hybrid")) & (dense_deg <= gpus_per_node // (tp * pp))))
    ok = ok_s & ok_sm & ok_sv & ok_svm & ok_k & ok_sk                                 # (S,K,V,M)
    i_s, i_k, i_v, i_m, i_r = np.nonzero(np.broadcast_to(ok[..., None], ok.shape + (len(rcs),)))
    ga_sm = np.broadcast_to(ga, (len(shapes), 1, 1, len(mbs)))[:, 0, 0, :]
    sp_s = np.broadcast_to(sp, tp.shape)[:, 0, 0, 0]
    return LayoutArrays(dp=sh[i_s, 4], tp=sh[i_s, 0], pp=sh[i_s, 3], cp=sh[i_s, 1], ep=sh[i_s, 2],
                        zero_stage=zero[0, :, 0, 0][i_k], sharding=sharding[0, :, 0, 0][i_k],
                        sp=sp_s[i_s].astype(np.int64), vp=vp[0, 0, :, 0][i_v],
                        micro_batch=mb[0, 0, 0, :][i_m], grad_accum=ga_sm[i_s, i_m],
                        recompute=np.array(rcs, dtype=np.int64)[i_r])
