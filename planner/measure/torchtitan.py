"""Measure one rank of a torchtitan training step: torchtitan's own Llama 3, under PyTorch's trackers.

The model is torchtitan's ``Llama3Model`` (torchtitan 0.3.0, ``torchtitan/models/llama3/``),
configured by torchtitan's own per-layer builder (``_build_llama3_layers`` in
``torchtitan/models/llama3/__init__.py``) from a Llama-architecture Hugging Face ``config.json``,
inside torchtitan's own 8B trainer config (``llama3_8b()`` in ``config_registry.py``: bf16 params
and fp32 reduce under FSDP2, the chunked cross-entropy ``ChunkedLossWrapper`` with 8 chunks,
AdamW betas (0.9, 0.95), weight decay 0.1). It is parallelised by torchtitan's own
``parallelize_llama`` (``models/llama3/parallelize.py``): tensor + sequence parallelism as DTensor
(``Module.parallelize``, ``models/llama3/sharding.py``), activation checkpointing by
``SelectiveAC`` (torchtitan's per-op policy: save matmul, attention and reduce-scatter outputs,
recompute every second matmul and everything else) or ``FullAC`` (whole blocks), then FSDP2 by
``apply_fsdp_to_decoder`` (``distributed/fsdp.py``: each block, then [norm, lm_head] and the
embedding, then the root). One rank runs ``n_steps`` steps (forward, torchtitan's loss with its
per-chunk backward, backward, AdamW with ``foreach=False``, ``zero_grad(set_to_none=True)``)
under ``FakeTensorMode`` with PyTorch's fake process group of ``dp x tp`` ranks, inside
``FSDPMemTracker``; the result is planner.measure.readout.MeasuredMemory.

What it took to run on a CPU (docs/facts.md lists the first six traps; each is handled here)
------------------------------------------------------------------------------------------------
1. ``torchtitan.distributed.parallel_dims.device_type`` falls back to "cuda" without an
   accelerator (``torchtitan/tools/utils.py``); it is set to "cpu" while the mesh is built.
2. ``parallelism.spmd_backend = "partial_dtensor"``: the default "spmd_types" fails inside
   ``fully_shard`` on torch 2.13 ("all parameters must be DTensors on the full SPMD mesh").
   torchtitan's loss reads the backend from ``torchtitan.distributed.utils.set_spmd_backend``,
   which the trainer calls; so do we.
3. Flex attention needs inductor: every block's inner attention config becomes torchtitan's
   causal ``ScaledDotProductAttention`` (``models/common/attention.py``), which on the CPU runs
   ``aten._scaled_dot_product_flash_attention_for_cpu``. That op is added to SelectiveAC's save
   set through ``get_save_ops`` (torchtitan's documented override point): it saves what flex or
   flash attention saves on a GPU (the output and a fp32 log-sum-exp per head and row).
4. ``init_weights()`` is skipped (``trunc_normal_`` calls ``.item()`` under fake tensors): the
   model is built on the meta device, as torchtitan's trainer does, and ``to_empty`` gives it
   fake storage. Values never change a tensor's size.
5. The chunked loss calls the LM head once per chunk; FSDPMemTracker refuses a second forward of
   a module outside any parent ("multiple iterative calls"). ``RepeatedCalls`` lets non-root
   FSDP modules run again, keeping their first statistics.
6. DTensor's sharding propagation runs global-shape fake ops under the ambient fake mode, which
   the tracker would count; ``fakes.separate_dtensor_propagation`` gives it its own mode.
7. ModTracker's backward hooks on the LM head's leaf inputs (the chunked loss's detached chunks)
   keep every step's chunks alive; ``titan_depth.leaf_input_hooks_off`` keeps them off leaves.

What did not run (tried on torch 2.13.0, torchtitan 0.3.0)
---------------------------------------------------------
- Context parallelism: ``apply_cp_to_forward`` wraps the SDPA inner attention; its
  ``cp_forward`` (torchtitan/distributed/context_parallel/api.py, line 96) calls
  F.scaled_dot_product_attention on DTensors, which on the CPU is
  ``aten._scaled_dot_product_flash_attention_for_cpu``, and DTensor raises ``NotImplementedError:
  Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding
  strategy registered`` (torch/distributed/tensor/_sharding_prop.py,
  ``propagate_op_sharding_non_cached``). Flex attention, which has one, needs inductor and a GPU.
- Pipeline parallelism: ``pipeline_llm`` (torchtitan/distributed/pipeline_parallel.py) builds the
  1F1B schedule and its stages under a fake process group, but (a) torchtitan 0.3.0's trainer
  calls ``schedule.step(arg_mbs=..., kwarg_mbs=..., target_mbs=...)``, names torch 2.13's
  ``step(*args, target, losses, return_outputs, loss_kwargs, **kwargs)`` passes on to the model as
  keyword inputs (``ValueError: Expecting 2 arg_mbs but got 1`` from ``_check_inputs``); and (b)
  called with torch's own signature, the first step's ``_initialize_pp_stages`` ->
  ``_warmup_p2p`` (torch/distributed/pipelining/schedules.py, line 372) reads ``result.item()``,
  which fake tensors refuse: ``DataDependentOutputException: aten._local_scalar_dense.default``.

- ``--compile``: torch.compile's inductor kernels run on the tensors' data, which fake tensors
  do not have: a compiled function called under FakeTensorMode on the CPU kills the process
  (segmentation fault, exit 139; torch 2.13.0, a two-op function, checked 2026-12-02), while the
  same compiled function under MemTracker with real tensors runs. So the compiled profile
  (activations.titan_block_terms) is checked on one small real block without recomputation
  (tests/test_memory_stacks.py), and so is one small block under SelectiveAC compiled the same
  way (planner.measure.torchtitan_compile: the policy is honoured, and MUST_SAVE outputs no
  backward op reads are dropped). ``compile_refusal`` says so.

Depth scaling
-------------
A full Llama 3.1 8B step takes over a minute here, so deep models are measured at two depths
(``blocks``, default 2 and 4) and scaled linearly to the full depth. Everything per rank is
linear in the number of blocks at a fixed moment of the step, but the moment of the peak moves
with depth (a shallow model peaks in the LM head's backward, a deep one at the end of backward
with every gradient present). So the tracker keeps the peak snapshot of each phase bucket: the
forward's last block, the loss, the backward's first block (the last layer), the backward's end
(the first layer and the embedding) and the optimizer step. A bucket's figures are scaled per
category and the largest total is the peak. Inside the backward the total is linear in the
block index, so its maximum lies at one of the two ends, which are buckets. The result says
which depths ran (``TitanMeasurement.measured_layers``); tests/test_measure_torchtitan.py checks
the scaled figures against a full-depth run of a small model.

Not measured (only a GPU has them): the caching allocator's reserved-but-free memory and
fragmentation, the CUDA context, cuBLAS and NCCL workspaces, CUDA-graph memory pools (the
torchtitan 0.3.0 trainer captures forward and backward in a CUDA graph unless
``training.disable_cuda_graphs``; we run eagerly, as with that flag).

torch and torchtitan are imported inside functions only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.errors import UserError
from planner.layouts.layout import Layout
from planner.measure.accuracy import Comparison
from planner.measure.readout import MeasuredMemory
from planner.measure.titan_depth import (
    PhaseBuckets,
    RepeatedCalls,
    leaf_input_hooks_off,
    scale_buckets,
    scale_depths,
)
from planner.measure.titan_moments import moment_rows
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup

RECOMPUTES = ("none", "selective", "full")
# FSDP2 reshard-after-forward: torchtitan's ParallelismConfig.fsdp_reshard_after_forward
SHARDINGS = {"full": "default", "grad-op": "never"}
DEFAULT_BLOCKS = (2, 4)
_CHUNKS = 8          # ChunkedLossWrapper.Config.num_chunks (components/loss.py, 0.3.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class TitanSetup:
    """One torchtitan training step to measure, for rank 0.

    hf_config: a Llama-architecture ``config.json`` dict (model_type "llama").
    dp: FSDP2 degree (torchtitan's data_parallel_shard_degree); tp: tensor (+ sequence) parallel
        degree; cp, pp: refused above 1 (see the module docstring).
    recompute: "none", "selective" (torchtitan's SelectiveAC per-op policy), "full" (FullAC).
    sharding: "full" (reshard after forward, torchtitan's default) or "grad-op" ("never").
    blocks: the depths to run; () picks the full depth up to 4 blocks, else DEFAULT_BLOCKS
        scaled linearly to the full depth. One depth equal to the model's runs it whole.
    grads_set_to_none: False keeps the gradients between steps, as torchtitan's trainer does
        when it captures CUDA graphs (its GPU default).
    """

    hf_config: dict[str, Any]
    dp: int = 1
    tp: int = 1
    cp: int = 1
    pp: int = 1
    micro_batch: int = 1
    seq_len: int = 2048
    recompute: str = "selective"
    sharding: str = "full"
    blocks: tuple[int, ...] = ()
    fake: bool = True
    n_steps: int = 2
    # torchtitan's trainer calls zero_grad(set_to_none=training.disable_cuda_graphs) (trainer.py,
    # train_step): with CUDA graphs on (its default on a GPU) gradients are zeroed in place and
    # live through the next step. We run eagerly, as with the flag set: False keeps them instead.
    grads_set_to_none: bool = True

    def __post_init__(self) -> None:
        if self.recompute not in RECOMPUTES:
            raise UserError(f"--recompute {self.recompute!r}: torchtitan measures {', '.join(RECOMPUTES)}")
        if self.sharding not in SHARDINGS:
            raise UserError(f"torchtitan shards with FSDP2: use --fsdp full or grad-op, not {self.sharding!r}")
        for name in ("dp", "tp", "cp", "pp", "micro_batch", "seq_len", "n_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UserError(f"measure --stack torchtitan: {name} must be a positive integer, got {value!r}")
        if self.cp > 1:
            raise UserError("--cp cannot be measured with torchtitan on the CPU: torchtitan's context-parallel "
                            "attention runs aten._scaled_dot_product_flash_attention_for_cpu on DTensors, which has "
                            "no DTensor sharding strategy (NotImplementedError), and flex attention needs a GPU; "
                            "measure --cp 1")
        if self.pp > 1:
            raise UserError("--pp cannot be measured with torchtitan under fake tensors: torch's pipeline schedule "
                            "reads .item() in its P2P warm-up (schedules.py _warmup_p2p), and torchtitan 0.3.0 calls "
                            "schedule.step with keywords torch 2.13 does not take; measure --pp 1")
        if self.seq_len % (_CHUNKS * self.tp):
            raise UserError(f"--seq-len {self.seq_len} must be a multiple of {_CHUNKS * self.tp} (torchtitan's "
                            f"chunked loss splits the sequence in {_CHUNKS}; sequence parallelism by tp {self.tp})")
        if any(not isinstance(b, int) or b < 1 for b in self.blocks):
            raise UserError(f"blocks must be positive integers, got {self.blocks!r}")
        model_args(self.hf_config)      # refuses what torchtitan's Llama 3 cannot build

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TitanSetup:
        data = json.loads(text)
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise UserError(f"measure: unknown TitanSetup keys {sorted(unknown)}")
        data["blocks"] = tuple(data.get("blocks", ()))
        return cls(**data)


@dataclass(frozen=True, kw_only=True, slots=True)
class TitanMeasurement:
    """The rank's memory (bytes, at the full depth) and how it was obtained.

    measured_layers: the depths that ran; scaled: True when memory was scaled from them.
    by_depth: each measured depth's own MeasuredMemory (as dicts).
    moments: each phase bucket's peak snapshot at the full depth (titan_depth.BUCKETS: the
        tracker's own categories, bytes; scaled where ``scaled``), the moments the comparison
        holds against the planner's; moment_modules: the innermost module running at each one
        (of the deepest run; "" outside any)."""

    memory: MeasuredMemory
    n_layers: int
    measured_layers: tuple[int, ...]
    scaled: bool
    torchtitan_version: str
    by_depth: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    moments: dict[str, dict[str, int]] = field(default_factory=dict)
    moment_modules: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TitanMeasurement:
        data = json.loads(text)
        data["memory"] = MeasuredMemory(**data["memory"])
        data["measured_layers"] = tuple(data["measured_layers"])
        data["by_depth"] = tuple(data.get("by_depth", ()))
        data["moments"] = data.get("moments", {})
        return cls(**data)


def model_args(hf: Mapping[str, Any]) -> dict[str, Any]:
    """torchtitan Llama 3 arguments from a Hugging Face config.json (LlamaConfig's field names)."""
    if hf.get("model_type") != "llama":
        raise UserError(f"--stack torchtitan measures Llama-architecture models (model_type 'llama'), "
                        f"not {hf.get('model_type')!r}")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise UserError("torchtitan's Llama 3 has no attention or MLP biases; this config.json sets "
                        "attention_bias/mlp_bias")
    try:
        dim, n_heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        args = {"dim": dim, "n_heads": n_heads, "n_kv_heads": int(hf.get("num_key_value_heads") or n_heads),
                "hidden_dim": int(hf["intermediate_size"]), "n_layers": int(hf["num_hidden_layers"]),
                "vocab_size": int(hf["vocab_size"]), "rope_theta": float(hf.get("rope_theta", 10000.0)),
                "tied": bool(hf.get("tie_word_embeddings", False))}
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"config.json lacks a Llama field torchtitan needs: {err}") from None
    head_dim = hf.get("head_dim")
    if dim % n_heads or (head_dim is not None and int(head_dim) != dim // n_heads):
        raise UserError("torchtitan's Llama 3 needs head_dim = hidden_size / num_attention_heads")
    return args


def trainer_config(setup: TitanSetup, n_layers: int) -> Any:
    """torchtitan's own 8B Trainer.Config with this model (``n_layers`` blocks) and layout."""
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import (
        _EMBEDDING_INIT,
        _NORM_INIT,
        _build_llama3_layers,
        _output_linear_init,
    )
    from torchtitan.models.llama3.config_registry import llama3_8b
    from torchtitan.models.llama3.model import Llama3Model

    a = model_args(setup.hf_config)
    dim, vocab = a["dim"], a["vocab_size"]
    layers = _build_llama3_layers(
        n_layers=n_layers, dim=dim, n_heads=a["n_heads"], n_kv_heads=a["n_kv_heads"], hidden_dim=a["hidden_dim"],
        rope=ComplexRoPE.Config(dim=dim // a["n_heads"], max_seq_len=max(setup.seq_len, 131072),
                                theta=a["rope_theta"], scaling="none"),
        fuse_qkv=True, attn_backend="flex")
    for layer in layers:                             # trap 3: SDPA instead of flex attention
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    model = Llama3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying=a["tied"],
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)),
        layers=layers)
    cfg = llama3_8b()
    assert cfg.model_spec is not None
    cfg.model_spec.model = model
    cfg.loss = ChunkedLossWrapper.Config(num_chunks=_CHUNKS, loss_fn=CrossEntropyLoss.Config(global_vocab_size=vocab))
    cfg.activation_checkpoint = {"none": None, "selective": SelectiveAC.Config(),
                                 "full": FullAC.Config()}[setup.recompute]
    p = cfg.parallelism
    p.spmd_backend = "partial_dtensor"               # trap 2
    p.data_parallel_shard_degree, p.tensor_parallel_degree = setup.dp, setup.tp
    p.fsdp_reshard_after_forward = SHARDINGS[setup.sharding]
    cfg.training.seq_len, cfg.training.local_batch_size = setup.seq_len, setup.micro_batch
    cfg.training.disable_cuda_graphs = True
    model.update_from_config(config=cfg)             # sharding specs, RoPE cache at seq_len
    return cfg


def cpu_selective_ac() -> Any:
    """SelectiveAC whose save set also holds the CPU flash-attention op (trap 3)."""
    import torch
    from torchtitan.distributed.activation_checkpoint import SelectiveAC

    class CpuSelectiveAC(SelectiveAC):
        def get_save_ops(self) -> set[Any]:
            ops = SelectiveAC.get_save_ops(self)
            ops.add(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
            return ops

    return CpuSelectiveAC


def measure(setup: TitanSetup) -> TitanMeasurement:
    """Run the step at each depth of ``setup.blocks`` (or the automatic choice) in this process and
    return rank 0's memory at the model's full depth, bytes."""
    import torchtitan

    full = model_args(setup.hf_config)["n_layers"]
    blocks = setup.blocks or ((full,) if full <= max(DEFAULT_BLOCKS) else DEFAULT_BLOCKS)
    if len(blocks) not in (1, 2) or (len(blocks) == 2 and blocks[0] >= blocks[1]) or max(blocks) > full:
        raise UserError(f"blocks {blocks}: give one depth, or two increasing depths, up to the model's {full}")
    got = [_measure_depth(setup, n) for n in blocks]
    runs = [(mem, buckets) for mem, buckets, _ in got]
    version = getattr(torchtitan, "__version__", "0.3.0")
    moments, where = scale_buckets(runs, blocks, full), got[-1][2]
    if blocks == (full,):
        return TitanMeasurement(memory=runs[0][0], n_layers=full, measured_layers=blocks, scaled=False,
                                torchtitan_version=version, by_depth=(dataclasses.asdict(runs[0][0]),),
                                moments=moments, moment_modules=where)
    memory = scale_depths(runs, blocks, full)
    return TitanMeasurement(memory=memory, n_layers=full, measured_layers=blocks, scaled=True,
                            torchtitan_version=version, by_depth=tuple(dataclasses.asdict(r[0]) for r in runs),
                            moments=moments, moment_modules=where)


@contextlib.contextmanager
def _process_group(world_size: int, *, fake: bool) -> Iterator[None]:
    import torch.distributed as dist

    if not fake:            # torchrun already made the NCCL group
        yield
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise UserError("measure: a torch.distributed process group already exists; measure in a fresh process "
                        "(python -m planner.measure.torchtitan)")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _measure_depth(setup: TitanSetup, n_layers: int) -> tuple[MeasuredMemory, dict[str, dict[str, int]],
                                                              dict[str, str]]:
    """One run at ``n_layers`` blocks: (MeasuredMemory, each bucket's peak snapshot, the innermost
    module running at each)."""
    with _process_group(setup.dp * setup.tp, fake=setup.fake):
        return _measure_rank(setup, n_layers)


def _measure_rank(setup: TitanSetup, n_layers: int) -> tuple[MeasuredMemory, dict[str, dict[str, int]],
                                                             dict[str, str]]:
    import torch
    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    import torchtitan.distributed.utils as dist_utils
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.llama3 import parallelize_llama

    from planner.measure.fakes import separate_dtensor_propagation
    from planner.measure.readout import make_tracker, tracker_result

    t0 = time.perf_counter()
    device = torch.device("cpu") if setup.fake else torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    cfg = trainer_config(setup, n_layers)
    dist_utils.set_spmd_backend(cfg.parallelism.spmd_backend)     # trap 2, as Trainer.__init__ does
    saved_device_type = parallel_dims_module.device_type
    parallel_dims_module.device_type = device.type                 # trap 1
    try:
        dims = ParallelDims.from_config(cfg.parallelism, dist.get_world_size())
        dims.build_mesh()
        with torch.device("meta"):
            model = cfg.model_spec.model.build()
        n_params = sum(p.numel() for p in model.parameters())
        ac = cfg.activation_checkpoint
        if setup.recompute == "selective" and setup.fake:
            ac = _BuildAs(ac, cpu_selective_ac())
        model = parallelize_llama(model, parallel_dims=dims, training=cfg.training, parallelism=cfg.parallelism,
                                  compile_config=cfg.compile, ac_config=ac, dump_folder="")
    finally:
        parallel_dims_module.device_type = saved_device_type
    loss_fn = cfg.loss.build(compile_config=cfg.compile)
    loss_fn.set_lm_head(model.lm_head)                            # as Trainer.__init__ does
    model._skip_lm_head = True
    mode = FakeTensorMode(allow_non_fake_inputs=True) if setup.fake else contextlib.nullcontext()
    with mode, separate_dtensor_propagation(setup.fake):          # trap 6
        model.to_empty(device=device)                             # trap 4: no init_weights()
        if not setup.fake:
            with torch.no_grad():
                model.init_weights(buffer_device=None)
        model.train()
        # torchtitan's default_adamw (components/optimizer/optimizer.py) hyperparameters; for-loop
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                      weight_decay=0.1, foreach=False)
        ids = torch.randint(0, cfg.model_spec.model.vocab_size, (setup.micro_batch, setup.seq_len), device=device)
        n_tokens = torch.tensor(setup.micro_batch * setup.seq_len * setup.dp, device=device)
        tracker = make_tracker(model, optimizer, ids, sharded=True, mixins=(PhaseBuckets, RepeatedCalls))
        tracker.n_layers = n_layers
        with leaf_input_hooks_off(), tracker:                     # trap 7
            for step in range(setup.n_steps):
                tracker.step = step + 1
                if step:
                    tracker.reset_mod_stats()
                pred = model(ids)
                loss, _ = loss_fn(pred, ids, n_tokens)            # per-chunk backward inside
                del pred
                loss.backward()
                del loss
                optimizer.step()
                optimizer.zero_grad(set_to_none=setup.grads_set_to_none)
        snapshots = tracker.get_tracker_snapshot("peak")
    got = tracker_result(tracker, snapshots, device, fake=setup.fake, n_params=n_params,
                         rank=dist.get_rank(), wall_s=time.perf_counter() - t0)
    return (got, dict(tracker.__dict__.get("bucket_peak", {})),
            dict(tracker.__dict__.get("bucket_module", {})))


class _BuildAs:
    """Stands in for an activation-checkpointing config in parallelize_llama, which only calls
    ``ac_config.build(dump_folder=...)``: builds ``cls`` (a SelectiveAC subclass) from it."""

    def __init__(self, config: Any, cls: type) -> None:
        self.config, self.cls = config, cls

    def build(self, **kwargs: Any) -> Any:
        return self.cls(self.config, **kwargs)


def compare(m: ModelSpec, hf_config: dict[str, Any], setup: TrainingSetup, lay: Layout, *, fake: bool = True,
            blocks: tuple[int, ...] = (), timeout_s: float = 900, in_process: bool = False) -> Comparison:
    """The planner's prediction for ``lay`` beside torchtitan's measured step, per category (as
    planner.measure.accuracy.compare does for Hugging Face models). The prediction follows the
    torchtitan stack's memory profile (``TrainingSetup.stack = "torchtitan"``: its block under
    SelectiveAC/FullAC, its chunked loss). ``in_process`` measures in this process (fake tensors
    only), saving a new process's start-up."""
    from planner.measure import accuracy
    from planner.memory.model import per_rank_memory

    setup = dataclasses.replace(setup, stack="torchtitan")

    titan_setup = titan_setup_for(hf_config, setup, lay, fake=fake, blocks=blocks)
    if in_process and fake:
        got = measure(titan_setup)
    else:
        got = run_measurement(titan_setup, timeout_s=timeout_s, nproc=0 if fake else lay.dp * lay.tp)
    measured_lay = accuracy.measured_layout(lay)
    measured_setup = accuracy.measured_setup(setup, measured_lay)
    pred = per_rank_memory(m, measured_setup, measured_lay)
    mem = got.memory
    info = dataclasses.asdict(mem) | {"stack": f"torchtitan {got.torchtitan_version}", "n_layers": got.n_layers,
                                      "measured_layers": list(got.measured_layers), "scaled": got.scaled,
                                      "moments": got.moments, "moment_modules": got.moment_modules}
    rows, moment, totals, notes = moment_rows(pred, measured_setup, mem.peak_bytes, mem.raw, got.moments,
                                              got.moment_modules)
    return Comparison(layout=measured_lay, setup=measured_setup, predicted=pred.breakdown,
                      predicted_phase=pred.phase, rows=rows, measured=info, moment=moment,
                      moment_totals=totals, notes=notes)


def compile_refusal(real: bool) -> str:
    """Why ``plan measure --compile`` does not run (one line, with the way out)."""
    if real:
        return ("--compile: plan measure --real does not compile the model yet; measure without --compile "
                "(plan --stack torchtitan --compile models the compiled block)")
    return ("--compile cannot be measured under fake tensors: inductor's compiled kernels read tensor data, which "
            "fake tensors lack (torch 2.13 crashes the process); measure without --compile, or --real on GPUs once "
            "it compiles (plan --stack torchtitan --compile models the compiled block, checked on one real block)")


def titan_setup_for(hf_config: dict[str, Any], setup: TrainingSetup, lay: Layout, *, fake: bool = True,
                    blocks: tuple[int, ...] = ()) -> TitanSetup:
    """The TitanSetup for a planner layout, or a UserError naming what torchtitan cannot run here."""
    if lay.zero_stage not in (2, 3) or lay.sharding == "fsdp-hybrid":
        raise UserError("torchtitan shards with FSDP2: measure --fsdp full (ZeRO-3, its default) or --fsdp grad-op")
    if setup.precision != "bf16-mixed":
        raise UserError(f"--precision {setup.precision}: torchtitan's trainer runs bf16-mixed (bf16 params, "
                        f"fp32 reduce); measure --precision bf16-mixed")
    if setup.optimizer != "adamw":
        raise UserError(f"--optimizer {setup.optimizer}: torchtitan's default is AdamW; measure --optimizer adamw")
    if not setup.finetune.is_full:
        raise UserError("--stack torchtitan measures full training; use --method full")
    if lay.ep > 1:
        raise UserError("--ep: torchtitan's Llama 3 has no experts; measure --ep 1")
    return TitanSetup(hf_config=hf_config, dp=lay.dp, tp=lay.tp, cp=lay.cp, pp=lay.pp, micro_batch=lay.micro_batch,
                      seq_len=lay.seq_len, recompute=lay.recompute,
                      sharding="full" if lay.zero_stage == 3 else "grad-op",
                      blocks=blocks, fake=fake)


def run_measurement(setup: TitanSetup, timeout_s: float = 900, nproc: int = 0) -> TitanMeasurement:
    """Measure in a fresh Python process (``python -m planner.measure.torchtitan``); with ``nproc``,
    for real on that many local GPUs through torchrun (run_distributed_cuda)."""
    cmd = [sys.executable, "-m", "planner.measure.torchtitan", setup.to_json()]
    if nproc:
        cmd.insert(3, f"--nproc={nproc}")
    try:
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise UserError(f"the torchtitan measurement ran past {timeout_s:.0f} s; try a shorter --seq-len") from None
    if out.returncode == 2:
        raise UserError(out.stderr.strip().splitlines()[-1].removeprefix("error: "))
    if out.returncode != 0:
        if "No module named 'torchtitan'" in out.stderr or "No module named 'triton'" in out.stderr:
            raise UserError("plan measure --stack torchtitan needs torchtitan and triton: "
                            "pip install -c constraints.txt -e '.[measure]'")
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the torchtitan measurement failed: {tail}")
    return TitanMeasurement.from_json(out.stdout.strip().splitlines()[-1])


def run_distributed_cuda(setup: TitanSetup, nproc: int) -> list[TitanMeasurement]:
    """The same step for real on ``nproc`` local GPUs (torchrun, NCCL), one result per rank.

    Mirrors planner.measure.trackers.run_distributed_cuda. UNTESTED on a GPU: this machine has none.
    """
    import tempfile

    if setup.fake or setup.dp * setup.tp != nproc:
        raise UserError(f"a real torchtitan run needs fake=False and dp x tp = {nproc} GPUs")
    env = dict(os.environ)
    repo_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="planner-titan-") as out_dir:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "planner.measure.torchtitan", "--worker-out", out_dir, setup.to_json()]
        subprocess.run(cmd, check=True, env=env)
        return [TitanMeasurement.from_json(Path(out_dir, f"rank{r}.json").read_text()) for r in range(nproc)]


def _distributed_worker(setup: TitanSetup, out_dir: str) -> None:
    """One torchrun rank: NCCL, real tensors, full depth, its result to out_dir (untested on GPU)."""
    import torch
    import torch.distributed as dist
    import torchtitan

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    try:
        full = model_args(setup.hf_config)["n_layers"]
        got, _, _ = _measure_rank(setup, full)
        result = TitanMeasurement(memory=got, n_layers=full, measured_layers=(full,), scaled=False,
                                  torchtitan_version=getattr(torchtitan, "__version__", "0.3.0"))
        Path(out_dir, f"rank{dist.get_rank()}.json").write_text(result.to_json())
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """``python -m planner.measure.torchtitan '<TitanSetup JSON>'``: print TitanMeasurement as JSON."""
    parser = argparse.ArgumentParser(prog="python -m planner.measure.torchtitan", description=main.__doc__)
    parser.add_argument("setup", help="TitanSetup as JSON (hf_config holds the config.json dict)")
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    parser.add_argument("--nproc", type=int, default=0, help="real CUDA run on this many local GPUs (torchrun)")
    args = parser.parse_args(argv)
    try:
        setup = TitanSetup.from_json(args.setup)
        if args.worker_out:
            _distributed_worker(setup, args.worker_out)
            return 0
        if args.nproc:
            ranks = run_distributed_cuda(setup, args.nproc)
            print(max(ranks, key=lambda r: r.memory.max_allocated_bytes or r.memory.peak_bytes).to_json())
            return 0
        print(measure(setup).to_json())
    except (UserError, json.JSONDecodeError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
