"""Parallel layouts: what a Layout is, which ones are valid, and why the others are not.

Degrees follow Megatron-LM / torchtitan: dp x tp x pp x cp x ep = n_gpus. Expert
parallelism is its own axis here: the ep ranks of a group hold different experts and
also read different data, so dense weights are replicated over dp*ep ranks (and their
gradients reduced over dp*cp*ep), expert weights over dp*cp.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup

SHARDINGS = ("zero", "fsdp-full", "fsdp-grad-op", "fsdp-hybrid")
FSDP_STAGE = {"fsdp-full": 3, "fsdp-grad-op": 2, "fsdp-hybrid": 3}


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """One way to run a step. ``zero_stage`` is what is sharded over data parallel ranks:
    0 nothing, 1 optimizer states, 2 and gradients, 3 and weights (Rajbhandari et al.
    2019). ``sharding`` says which engine shards: DeepSpeed/Megatron ZeRO or PyTorch
    FSDP2 (full shard = ZeRO-3, shard-grad-op = ZeRO-2, hybrid = ZeRO-3 inside a node,
    replicated across nodes)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero_stage: int = 0
    sharding: str = "zero"
    sp: bool = False            # sequence parallelism inside the tp group (Korthikanti et al.)
    vp: int = 1                 # virtual stages per pipeline rank (interleaved 1F1B when > 1)
    micro_batch: int = 1
    grad_accum: int = 1         # micro-batches per optimizer step per data-parallel rank
    seq_len: int = 4096
    recompute: str = "none"     # none | selective | full

    @property
    def n_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp * self.ep

    @property
    def is_fsdp(self) -> bool:
        return self.sharding.startswith("fsdp")

    @property
    def dense_shard_degree(self) -> int:
        """Ranks that hold replicas of a dense weight (and reduce its gradient)."""
        return self.dp * self.cp * self.ep

    @property
    def expert_shard_degree(self) -> int:
        return self.dp * self.cp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp * self.ep

    @property
    def key(self) -> str:
        """ASCII identifier, e.g. dp8_tp2_pp1_cp1_ep1_zero1_mb2_ga4_rnone."""
        shard = f"zero{self.zero_stage}" if self.sharding == "zero" else self.sharding
        vp = f"_vp{self.vp}" if self.vp > 1 else ""
        sp = "_sp" if self.sp else ""
        return (f"dp{self.dp}_tp{self.tp}{sp}_pp{self.pp}{vp}_cp{self.cp}_ep{self.ep}_{shard}"
                f"_mb{self.micro_batch}_ga{self.grad_accum}_r{self.recompute}")

    def describe(self) -> str:
        parts = [f"dp={self.dp}", f"tp={self.tp}" + ("+sp" if self.sp else ""), f"pp={self.pp}"]
        if self.vp > 1:
            parts.append(f"vp={self.vp}")
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        parts.append(f"ZeRO-{self.zero_stage}" if self.sharding == "zero" else f"FSDP {self.sharding[5:]}")
        parts += [f"micro-batch {self.micro_batch}", f"grad-accum {self.grad_accum}",
                  f"recompute {self.recompute}"]
        return ", ".join(parts)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def reject_reason(m: ModelSpec, setup: TrainingSetup, lay: Layout, gpus_per_node: int) -> str | None:
    """Why a layout cannot run, or None. One rule per ``if`` (calculon's style)."""
    if min(lay.dp, lay.tp, lay.pp, lay.cp, lay.ep, lay.vp, lay.micro_batch, lay.grad_accum) < 1:
        return "every degree, the micro-batch and the accumulation steps must be >= 1"
    if m.n_heads % lay.tp:
        return f"tp={lay.tp} does not divide the {m.n_heads} attention heads"
    if m.n_kv_heads % lay.tp and lay.tp % m.n_kv_heads:
        return f"tp={lay.tp} does not divide the {m.n_kv_heads} KV heads (nor is it a multiple of them)"
    if m.d_ff % lay.tp:
        return f"tp={lay.tp} does not divide the MLP width {m.d_ff}"
    if lay.sp and lay.tp == 1:
        return "sequence parallelism needs tp > 1"
    if lay.pp > m.n_layers:
        return f"pp={lay.pp} exceeds the {m.n_layers} layers"
    if lay.vp > 1 and lay.pp == 1:
        return "an interleaved schedule (vp > 1) needs pp > 1"
    if lay.pp * lay.vp > m.n_layers:
        return f"pp x vp = {lay.pp * lay.vp} model chunks exceed the {m.n_layers} layers"
    if lay.vp > 1 and lay.grad_accum % lay.pp:
        return (f"the interleaved schedule needs the {lay.grad_accum} micro-batches per step "
                f"to be a multiple of pp={lay.pp} (Megatron-LM)")
    if lay.cp > 1 and lay.seq_len % (2 * lay.cp):
        return f"cp={lay.cp} needs the sequence {lay.seq_len} to split into 2 x cp equal chunks"
    if lay.ep > 1 and not m.is_moe:
        return f"ep={lay.ep} needs a mixture-of-experts model; {m.name} is dense"
    if lay.ep > 1 and m.n_experts % lay.ep:
        return f"ep={lay.ep} does not divide the {m.n_experts} experts"
    if lay.seq_len % (lay.cp * (lay.tp if lay.sp else 1)):
        return f"the sequence {lay.seq_len} does not split over cp x tp = {lay.cp * lay.tp} ranks"
    if lay.sharding not in SHARDINGS:
        return f"unknown sharding {lay.sharding!r}"
    if lay.is_fsdp and lay.zero_stage != FSDP_STAGE[lay.sharding]:
        return f"FSDP {lay.sharding[5:]} shards like ZeRO-{FSDP_STAGE[lay.sharding]}, not ZeRO-{lay.zero_stage}"
    if not 0 <= lay.zero_stage <= 3:
        return f"ZeRO stage {lay.zero_stage} does not exist (0 to 3)"
    offloads = setup.offload_optimizer != "none" or setup.offload_params != "none"
    if lay.zero_stage > 0 and lay.dense_shard_degree == 1 and not offloads:
        return "ZeRO/FSDP sharding needs more than one data-parallel rank (or offload)"
    if setup.offload_params != "none" and lay.zero_stage != 3:
        return "parameter offload needs ZeRO-3 or FSDP full sharding (ZeRO-Infinity, FSDP CPU offload)"
    if setup.offload_optimizer != "none" and lay.zero_stage == 0:
        return "optimizer offload needs ZeRO-1 or higher (ZeRO-Offload moves the optimizer's partition)"
    if lay.is_fsdp and setup.offload_optimizer != "none":
        return "FSDP offloads parameters, gradients and the optimizer step together (offload parameters to cpu)"
    if lay.is_fsdp and setup.offload_params == "nvme":
        return "FSDP offloads to CPU memory only"
    if "nvme" in (setup.offload_optimizer, setup.offload_params) and lay.zero_stage != 3:
        return "NVMe offload (ZeRO-Infinity) needs ZeRO-3"
    if setup.offload_params != "none" and (lay.tp > 1 or lay.pp > 1 or lay.cp > 1):
        return "Megatron-LM does not offload parameters; offload them under pure data parallelism"
    if setup.finetune.quant != "none" and (lay.tp > 1 or lay.pp > 1 or lay.cp > 1):
        return "quantized base weights (bitsandbytes) run under data parallelism only, not tp, pp or cp"
    if lay.sharding == "zero" and lay.zero_stage >= 2 and lay.pp > 1:
        return "DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only"
    if lay.sharding == "fsdp-hybrid" and lay.dense_shard_degree <= gpus_per_node // (lay.tp * lay.pp):
        return "hybrid sharding needs data-parallel ranks on more than one node"
    if lay.global_batch != setup.global_batch:
        return (f"global batch {setup.global_batch} is not micro-batch {lay.micro_batch} x "
                f"accumulation x data-parallel {lay.dp * lay.ep}")
    return None


def grad_accum_for(setup: TrainingSetup, micro_batch: int, dp: int, ep: int) -> int | None:
    """Accumulation steps that make micro x accum x dp x ep the global batch, or None."""
    per_step = micro_batch * dp * ep
    if setup.global_batch % per_step:
        return None
    return setup.global_batch // per_step


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """Which choices the search may make; a fixed value (not None) pins a choice."""

    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    zero_stage: int | None = None
    fsdp: str | None = None       # full | grad-op | hybrid
    vp: int | None = None
    sp: bool | None = None
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    recomputes: tuple[str, ...] = ("none", "selective", "full")
    max_tp: int | None = None     # default: the GPUs of one node
    max_cp: int = 8


def _degrees(fixed: int | None, n: int, cap: int) -> list[int]:
    if fixed is not None:
        return [fixed] if n % fixed == 0 else []
    return [d for d in divisors(n) if d <= cap]


def shardings_of(space: SearchSpace) -> list[tuple[str, int]]:
    if space.fsdp is not None:
        name = f"fsdp-{space.fsdp}"
        return [(name, FSDP_STAGE[name])]
    if space.zero_stage is not None:
        return [("zero", space.zero_stage)]
    return [("zero", 0), ("zero", 1), ("zero", 2), ("zero", 3),
            ("fsdp-full", 3), ("fsdp-grad-op", 2), ("fsdp-hybrid", 3)]


def enumerate_layouts(
    m: ModelSpec, setup: TrainingSetup, n_gpus: int, gpus_per_node: int,
    space: SearchSpace = SearchSpace(),
) -> Iterator[tuple[Layout, str | None]]:
    """Every candidate layout on ``n_gpus`` with None or the reason it cannot run."""
    for tp, cp, ep, pp, dp in degree_shapes(m, n_gpus, gpus_per_node, space):
        sps = [space.sp] if space.sp is not None else [tp > 1]
        vps = [space.vp] if space.vp is not None else ([1, 2] if pp > 1 else [1])
        for sharding, stage in shardings_of(space):
            for vp in vps:
                for sp in sps:
                    for mb in space.micro_batches:
                        ga = grad_accum_for(setup, mb, dp, ep)
                        for rc in space.recomputes:
                            lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep,
                                         zero_stage=stage, sharding=sharding, sp=sp,
                                         vp=vp, micro_batch=mb, grad_accum=ga or 1,
                                         seq_len=setup.seq_len, recompute=rc)
                            if ga is None:
                                yield lay, (f"global batch {setup.global_batch} is not a "
                                            f"multiple of micro-batch {mb} x data-parallel {dp * ep}")
                            else:
                                yield lay, reject_reason(m, setup, lay, gpus_per_node)


def degree_shapes(m: ModelSpec, n_gpus: int, gpus_per_node: int,
                  space: SearchSpace = SearchSpace()) -> Iterator[tuple[int, int, int, int, int]]:
    """The (tp, cp, ep, pp, dp) products equal to ``n_gpus`` the search visits, in its
    order: tp up to ``space.max_tp`` (default: a node), cp up to ``space.max_cp``, ep up to
    the number of experts, pp up to the number of layers; a fixed degree is taken as
    given. Shared by enumerate_layouts, batch.valid_layouts and sweep's floors, so
    that the three walk the same shapes."""
    max_tp = space.max_tp or gpus_per_node
    ep_cap = m.n_experts if m.is_moe else 1
    for tp in _degrees(space.tp, n_gpus, max_tp if space.tp is None else n_gpus):
        for cp in _degrees(space.cp, n_gpus // tp, space.max_cp if space.cp is None else n_gpus):
            for ep in _degrees(space.ep, n_gpus // (tp * cp), ep_cap if space.ep is None else n_gpus):
                for pp in _degrees(space.pp, n_gpus // (tp * cp * ep), m.n_layers if space.pp is None else n_gpus):
                    dp = n_gpus // (tp * cp * ep * pp)
                    if space.dp is None or space.dp == dp:
                        yield tp, cp, ep, pp, dp

